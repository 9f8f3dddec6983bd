"""bench/nightly_bench.py: the accuracy regression's world drawn at the scores, correlation and
dataset size asked (held-out kinds of the nightly's accuracy row)."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from tests.helpers.bench_module import load_bench


@pytest.fixture(scope="module")
def nightly() -> ModuleType:
    load_bench("reliability")  # the bench's sibling, imported by its name
    return load_bench("nightly_bench")


def test_the_default_world_is_the_row_reported(nightly: ModuleType) -> None:
    default = nightly.make_world(7, 39, "accuracy", False)
    asked = nightly.make_world(7, 39, "accuracy", False, scores=(0.96, 0.88), rho=0.5, samples=100)
    assert default.culprit == asked.culprit and default.unbuildable == asked.unbuildable
    assert np.array_equal(default.good_rates, asked.good_rates)
    assert np.array_equal(default.bad_rates, asked.bad_rates)


def test_the_world_falls_from_the_good_score_to_the_bad_on_the_samples_asked(nightly: ModuleType) -> None:
    world = nightly.make_world(3, 39, "accuracy", False, scores=(0.80, 0.60), rho=0.3, samples=400)
    assert world.samples == 400 and world.bad_rates.shape == (400,)
    drop = world.good_rates.mean() - world.bad_rates.mean()
    assert 0.20 <= drop < 0.22  # samples broken until the drop is reached, one sample past at most
    assert world.good_rates.mean() == pytest.approx(0.80, abs=0.05)
    assert np.all(world.bad_rates <= world.good_rates)
