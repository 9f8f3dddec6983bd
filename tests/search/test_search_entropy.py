"""The entropy the searches weigh queries by (bisect_npu/search/entropy.py): 0 log 0 and rounding."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.search.entropy import entropy, plogp

weights = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30).filter(lambda w: sum(w) > 1e-6)


@settings(max_examples=50)
@given(weights, st.integers(0, 5))
def test_entropy_is_bounded_and_blind_to_impossible_positions(w: list[float], zeros: int) -> None:
    """Between 0 and log k for k positions; positions of no mass change nothing (no nan from 0 log 0)."""
    p = np.array(w) / sum(w)
    value = float(entropy(p))
    assert -1e-12 <= value <= math.log(len(p)) + 1e-9
    assert math.isclose(float(entropy(np.concatenate((p, np.zeros(zeros))))), value, rel_tol=1e-12, abs_tol=1e-15)


@given(st.integers(1, 50))
def test_a_point_mass_tells_nothing_and_a_uniform_the_most(k: int) -> None:
    assert float(entropy(np.eye(k)[0])) == 0.0
    assert math.isclose(float(entropy(np.full(k, 1.0 / k))), math.log(k))


def test_rows_are_distributions_and_rounding_outside_0_1_reads_as_the_edge() -> None:
    """One entropy per row; 1 less a cumulative sum just over 1 is 0, not a negative or a nan."""
    rows = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    assert np.allclose(entropy(rows), [math.log(2), 0.0])
    assert plogp(np.array([-1e-17, 1.0 + 1e-15])).tolist() == [0.0, 0.0]
