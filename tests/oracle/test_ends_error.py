"""The one rule both measuring oracles give a step's node terms by (oracle/ends_error.py): it
integrates a standard normal's moments, and each oracle's node terms are one per node."""

from __future__ import annotations

import math

import pytest

from bisect_npu.observations import SampleOutcome
from bisect_npu.oracle.accuracy.stats import step_evidence
from bisect_npu.oracle.ends_error import NODES, WEIGHTS
from bisect_npu.oracle.sequential import step_terms
from bisect_npu.oracle.throughput import ThroughputConfig


@pytest.mark.parametrize(("power", "moment"), [(0, 1.0), (2, 1.0), (4, 3.0), (6, 15.0), (8, 105.0)])
def test_the_nodes_integrate_a_standard_normals_moments(power: int, moment: float) -> None:
    total = sum(WEIGHTS)
    assert total == pytest.approx(math.sqrt(2 * math.pi))
    assert sum(w * z**power for z, w in zip(NODES, WEIGHTS, strict=True)) / total == pytest.approx(moment)
    assert sum(w * z**(power + 1) for z, w in zip(NODES, WEIGHTS, strict=True)) == pytest.approx(0.0, abs=1e-9)


def _outcomes(rates: list[float]) -> list[SampleOutcome]:
    return [SampleOutcome(id=str(i), correct=r, runs=4) for i, r in enumerate(rates)]


def test_both_oracles_give_one_term_per_node() -> None:
    throughput = step_terms(ThroughputConfig(threshold=0.97, reference="good_end"), [990.0],
                            [1000.0, 1010.0, 995.0, 1005.0], [930.0, 925.0])
    assert throughput is not None and len(throughput.good) == len(throughput.bad) == len(NODES)
    good = _outcomes([1.0, 0.75, 1.0, 1.0, 0.5, 1.0, 1.0, 0.75] * 4)
    bad = _outcomes([0.25, 0.75, 0.0, 1.0, 0.5, 0.0, 1.0, 0.25] * 4)
    accuracy = step_evidence(_outcomes([0.75, 0.75, 0.5, 1.0, 0.5, 0.25, 1.0, 0.5] * 4), good, bad)
    assert len(accuracy.good_nodes) == len(accuracy.bad_nodes) == len(NODES)
