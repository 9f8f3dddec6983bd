"""bench/step_bounds.py: a step's ratio read against its commit's true side, in bands that
true likelihood ratios cannot exceed (e^-t of the steps at t nats the wrong way)."""

from __future__ import annotations

import math
import sys
from types import ModuleType

import pytest

from tests.helpers.bench_module import load_bench
from tests.helpers.paths import REPO_ROOT


@pytest.fixture(scope="module")
def steps() -> ModuleType:
    sys.path.insert(0, str(REPO_ROOT / "bench"))  # its own imports of the other benches
    try:
        return load_bench("step_bounds")
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))


def step(m: ModuleType, bad: bool, log_lr: float, rho: float = 0.7) -> object:
    return m.Step(1, 3, bad, log_lr, "repeated", "none", True, rho, 1, "clear", 1, False)


def test_a_step_reads_the_wrong_way_against_its_commit_s_side(steps: ModuleType) -> None:
    assert step(steps, False, 2.5).wrong_way == 2.5
    assert step(steps, True, 2.5).wrong_way == -2.5
    assert step(steps, True, -1.8).wrong_way == 1.8


def test_bands_count_the_wrong_way_readings_against_what_true_ratios_allow(steps: ModuleType) -> None:
    group = [step(steps, False, 2.5), step(steps, True, -1.2), step(steps, True, 6.0), step(steps, False, -3.0)]
    b = steps.band(group, (1.0, 2.0, 3.0))
    assert b.steps == 4 and b.seen == (2, 1, 0)
    assert b.expected(2.0) == pytest.approx(4 * math.exp(-2.0))
    assert steps.delivered(1, 4) == f"{math.log(4):.1f}" and steps.delivered(0, 4) == "-"
    lines = steps.table("t", steps.grouped(group, lambda s: steps.rho_band(s.rho)), (1.0, 2.0, 3.0))
    assert lines[-1].startswith("| rho < 0.9 | 4 | 2 / 1.5 (0.7) | 1 / 0.5 (1.4) | 0 / 0.2 (-) |")


def test_a_commit_s_steps_sum_to_what_the_search_weighs(steps: ModuleType) -> None:
    group = [step(steps, True, -1.9), step(steps, True, -1.8), step(steps, True, -2.0)]
    ((n, summed),) = steps.by_position(group)
    assert n == 3 and summed.log_lr == pytest.approx(-5.7) and summed.rounds == 3
    assert steps.band([summed], (5.0,)).seen == (1,)
