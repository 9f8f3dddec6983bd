"""bench/step_reliability.py: a candidate step's ratio against the truth of its side, in bands."""

from __future__ import annotations

import math
from types import ModuleType

import pytest

from bisect_npu.oracle.accuracy.stats import JointPrior
from tests.helpers.bench_module import load_bench


@pytest.fixture(scope="module")
def steps() -> ModuleType:
    load_bench("reliability")
    load_bench("accuracy_bench")
    return load_bench("step_reliability")


def test_candidate_steps_carry_their_side_and_what_their_ratio_rested_on(steps: ModuleType) -> None:
    bench = load_bench("accuracy_bench")
    prior = JointPrior(0.9, 0.8, 0.04, 0.01, 0.018, 0.004, 0.002, 200)
    trace = [bench.StepTrace("good_end", (200,), "clear", 0),
             bench.StepTrace("candidate", (8, 16), "clear", 10, -2.5, prior),
             bench.StepTrace("candidate", (8,), "clear", 30, -1.7, prior)]
    got = steps.steps_of(trace, culprit=20)
    assert [(s.bad, s.wrong, s.sample_runs, s.rounds) for s in got] == [(False, False, 24, 2), (True, True, 8, 1)]
    assert got[0].correlation == pytest.approx(0.9)
    assert got[0].spread_error == pytest.approx(0.2)
    assert got[1].chance_wrong == pytest.approx(1 / (1 + math.exp(1.7)))


def test_steps_fall_in_bands_of_their_ratio_with_chances_wrong_count(steps: ModuleType) -> None:
    made = [steps.Step(r, bad, 0.9, 0.1, 8, 1) for r, bad in ((0.5, True), (-2.2, True), (2.9, True), (7.0, False))]
    bands = steps.banded(made)
    assert [b.steps for b in bands] == [1, 0, 2, 0, 0, 0, 1, 0]
    assert [b.wrong for b in bands] == [0, 0, 1, 0, 0, 0, 1, 0]
    assert bands[2].expected == pytest.approx(1 / (1 + math.exp(2.2)) + 1 / (1 + math.exp(2.9)))
    lines = steps.table(made)
    assert len(lines) == 2 + len(steps.SPLITS)  # one group a split here
    assert lines[2].startswith("| all | all | 1 / 0 /")
