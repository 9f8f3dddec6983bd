"""bench/reliability.py: the wrong answers the posteriors expect, their bins, and the Poisson tail
that says whether the wrong answers seen contradict calibration."""

from __future__ import annotations

import math
from types import ModuleType

import pytest

from tests.helpers.bench_module import load_bench


@pytest.fixture(scope="module")
def rel() -> ModuleType:
    return load_bench("reliability")


def test_answers_fall_in_their_bins_with_the_wrong_ones_expected(rel: ModuleType) -> None:
    answers = [(0.98, False), (0.99, True), (0.994, False), (0.995, False), (0.998, True), (0.999, False),
               (1.0, False)]
    r = rel.reliability(answers)
    assert [(b.lo, b.hi) for b in r.bins] == [(0.0, 0.99), (0.99, 0.995), (0.995, 0.999), (0.999, 1.0)]
    assert [b.answers for b in r.bins] == [1, 2, 2, 2]
    assert [b.wrong for b in r.bins] == [0, 1, 1, 0]
    assert [b.expected for b in r.bins] == pytest.approx([0.02, 0.016, 0.007, 0.001])
    assert (r.answers, r.wrong) == (7, 2)
    assert r.expected == pytest.approx(0.044)
    assert rel.bin_label(r.bins[-1]) == "[0.999, 1]" and rel.bin_label(r.bins[1]) == "[0.99, 0.995)"


def test_rows_pool_bin_by_bin(rel: ModuleType) -> None:
    a = rel.reliability([(0.991, True), (1.0, False)])
    b = rel.reliability([(0.992, False), (0.9995, True)])
    pooled = a + b
    assert (pooled.answers, pooled.wrong) == (4, 2)
    assert pooled.expected == pytest.approx(0.009 + 0.008 + 0.0005)
    assert [b.answers for b in pooled.bins] == [0, 2, 0, 2]
    assert [b.wrong for b in pooled.bins] == [0, 1, 0, 1]


def test_poisson_tail(rel: ModuleType) -> None:
    assert rel.poisson_tail(0, 0.5) == 1.0
    assert rel.poisson_tail(1, 0.5) == pytest.approx(1 - math.exp(-0.5))
    assert rel.poisson_tail(2, 1.0) == pytest.approx(1 - 2 * math.exp(-1.0))
    assert rel.poisson_tail(1, 0.0) == 0.0
    # 2 wrong of 100 answers each named at 0.99: chance alone reaches it about a quarter of the time
    r = rel.reliability([(0.99, k < 2) for k in range(100)])
    assert r.expected == pytest.approx(1.0)
    assert r.p_value == pytest.approx(0.2642, abs=1e-4)
    assert rel.p_label(0.2642) == "0.264" and rel.p_label(4.2e-4) == "4.2e-04"


def test_the_table_prints_every_bin_and_the_tail(rel: ModuleType) -> None:
    r = rel.reliability([(0.993, True), (1.0, False)])
    header = rel.table_header(r)
    assert header[0].count("answers / wrong / expected") == 5 and header[1].count("---:") == 6
    cells = "0 / 0 / 0.00 | 1 / 1 / 0.01 | 0 / 0 / 0.00 | 1 / 0 / 0.00 | 2 / 1 / 0.01"
    assert rel.table_row("x", r) == f"| x | {cells} | {rel.poisson_tail(1, 0.007):.3f} |"
