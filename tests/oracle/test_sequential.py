"""A throughput step's trials stop when its verdict is sure (oracle/sequential.py): the ratio, the
stop rules of a candidate and of the good end, and what the verdict says of them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.ends_error import NODES, WEIGHTS
from bisect_npu.oracle.sequential import (
    REFERENCE_MIN_TRIALS,
    STEP_BOUND,
    judge_sequential,
    log_likelihood_ratio,
    pooled_spread,
    reference_known,
    step_terms,
    trials_wanted,
)
from bisect_npu.oracle.throughput import ThroughputConfig

CFG = ThroughputConfig(threshold=0.97, reference="good_end")


def _runs(values: list[float] | np.ndarray) -> list[Observation]:
    return [Observation(case_id="perf", extra={"output_token_throughput": float(v)}) for v in values]


GOOD_END = _runs([1000.0, 1020.0, 985.0, 1010.0, 990.0, 1005.0, 1015.0, 980.0])


def test_a_clear_drop_stops_at_once_and_says_why() -> None:
    verdict, stop = judge_sequential(CFG, _runs([900.0]), GOOD_END, tried=1, cap=5)
    assert (verdict.kind, stop) == (VerdictKind.BAD, "sure bad")
    assert verdict.figures["log_likelihood_ratio"] >= STEP_BOUND and verdict.figures["trials_run"] == 1
    assert verdict.reason.endswith("; sure bad after 1 trial(s)")
    verdict, stop = judge_sequential(CFG, _runs([1003.0]), GOOD_END, tried=1, cap=5, bad_end=_runs([930.0, 925.0]))
    assert (verdict.kind, stop) == (VerdictKind.GOOD, "sure good")
    assert trials_wanted(CFG, _runs([900.0]), GOOD_END, tried=1, cap=5, as_reference=False) == 0


def test_a_run_near_the_line_asks_for_more_until_the_cap() -> None:
    near = [971.0]
    verdict, stop = judge_sequential(CFG, _runs(near), GOOD_END, tried=1, cap=3)
    assert stop is None and "stopped" not in verdict.figures
    assert trials_wanted(CFG, _runs(near), GOOD_END, tried=1, cap=3, as_reference=False) == 1
    verdict, stop = judge_sequential(CFG, _runs([971.0, 969.0, 972.0]), GOOD_END, tried=3, cap=3)
    assert stop == "cap" and verdict.figures["stopped"] == "cap"
    # A crashed attempt counts against the cap: nothing measured in 3 tries stops.
    verdict, stop = judge_sequential(CFG, [], GOOD_END, tried=3, cap=3)
    assert (verdict.kind, stop) == (VerdictKind.SKIP, "nothing measured")


def test_few_runs_say_less_than_many() -> None:
    """Student's t on a spread pooled with the good end's: a step's ratio grows with its runs, and
    one good-end run and one candidate run leave no spread to weigh (no ratio)."""
    one = log_likelihood_ratio(CFG, [930.0], [1000.0, 1020.0, 985.0])
    three = log_likelihood_ratio(CFG, [930.0, 931.0, 929.0], [1000.0, 1020.0, 985.0])
    assert one is not None and three is not None and 0 < one < three
    assert log_likelihood_ratio(CFG, [930.0], [1000.0]) is None


@given(st.lists(st.floats(800.0, 1200.0), min_size=1, max_size=5),
       st.lists(st.floats(900.0, 1100.0), min_size=2, max_size=8), st.floats(0.0, 30.0))
def test_runs_further_under_the_line_weigh_more_for_bad(samples: list[float], reference: list[float],
                                                        lower: float) -> None:
    """Between the lowest bad mean and the good end's, the same runs moved down weigh at least as
    much for bad: the ratio is monotone there (outside, t's tails may turn it)."""
    good = float(np.mean(reference))
    lowest = CFG.threshold * good - 2.0 * (1 - CFG.threshold) * good
    moved = [s - lower for s in samples]
    assume(lowest <= float(np.mean(moved)) and float(np.mean(samples)) <= good)
    here, there = log_likelihood_ratio(CFG, samples, reference), log_likelihood_ratio(CFG, moved, reference)
    assert here is not None and there is not None
    assume(np.isfinite(here) and np.isfinite(there))  # runs that do not vary: infinite either way
    assert there >= here - 1e-9


def test_the_good_end_runs_its_minimum_then_until_its_mean_is_known() -> None:
    rng = np.random.default_rng(3)
    assert trials_wanted(CFG, [], None, tried=0, cap=20, as_reference=True) == REFERENCE_MIN_TRIALS
    steady = _runs(rng.normal(1000.0, 5.0, REFERENCE_MIN_TRIALS))
    assert reference_known(CFG, steady, REFERENCE_MIN_TRIALS, cap=20) == "reference known"
    wild = _runs(rng.normal(1000.0, 80.0, REFERENCE_MIN_TRIALS))
    assert reference_known(CFG, wild, REFERENCE_MIN_TRIALS, cap=20) is None
    assert trials_wanted(CFG, wild, None, REFERENCE_MIN_TRIALS, cap=20, as_reference=True) == 1
    assert reference_known(CFG, wild[:4], tried=20, cap=20) == "cap"


def test_steps_stopped_when_sure_are_right_as_often_as_asked() -> None:
    """Over many seeded steps at a 2% spread and a 7% drop, a step stopped sure names the wrong
    side under one time in a hundred, and most stop after one or two runs (the bad end's two runs
known, as they are once the bad end has run)."""
    rng = np.random.default_rng(1000)
    wrong = runs = 0
    steps = 400
    for k in range(steps):
        reference = _runs(rng.normal(1000.0, 20.0, REFERENCE_MIN_TRIALS))
        bad_end = _runs(rng.normal(930.0, 20.0, 2))
        bad = k % 2 == 0
        mean = 930.0 if bad else 1000.0
        observed: list[Observation] = []
        while trials_wanted(CFG, observed, reference, len(observed), 5, False, bad_end):
            observed += _runs([rng.normal(mean, 20.0)])
        verdict, stop = judge_sequential(CFG, observed, reference, len(observed), 5, bad_end)
        runs += len(observed)
        wrong += stop in ("sure good", "sure bad") and (verdict.kind == VerdictKind.BAD) != bad
    assert wrong <= steps // 100
    assert runs / steps < 2.5


def test_a_mean_just_under_the_line_weighs_for_bad() -> None:
    """The recipe's threshold calls every mean under the line bad: at a spread of a gap, runs whose
    mean sits a twentieth of a gap under the line weigh for bad (a bad hypothesis starting half a
    gap under the line weighed them for good)."""
    reference = [1000.0 + d for d in (-30.0, 30.0, -15.0, 15.0, 0.0, -45.0, 45.0, 0.0)]
    line = CFG.threshold * 1000.0
    under = line - 0.05 * (1000.0 - line)
    llr = log_likelihood_ratio(CFG, [under - 20.0, under + 20.0], reference)
    assert llr is not None and llr > 0


def test_the_bad_ends_runs_place_the_bad_side() -> None:
    """Once the bad end has run, a step at its level weighs more for bad than against the line
    alone, and one at the good end's level is sure good on fewer runs."""
    bad_end = _runs([955.0, 960.0, 950.0])
    at_bad_end = [957.0, 953.0]
    alone = log_likelihood_ratio(CFG, at_bad_end, _samples(GOOD_END))
    placed = log_likelihood_ratio(CFG, at_bad_end, _samples(GOOD_END), _samples(bad_end))
    assert alone is not None and placed is not None and placed > alone > 0
    far_bad_end = _runs([930.0, 925.0, 935.0])
    verdict, stop = judge_sequential(CFG, _runs([1003.0]), GOOD_END, tried=1, cap=5, bad_end=far_bad_end)
    assert (verdict.kind, stop) == (VerdictKind.GOOD, "sure good")
    assert judge_sequential(CFG, _runs([1003.0]), GOOD_END, tried=1, cap=5)[1] is None  # the line alone: unsure


def _samples(observations: list[Observation]) -> list[float]:
    return [float(o.extra["output_token_throughput"]) for o in observations]


def _integrated(terms: tuple[float, ...]) -> float:
    """log of the node terms' mean under the standard normal's Gauss-Hermite weights."""
    weights = np.array(WEIGHTS)
    return float(np.log(np.sum(weights / weights.sum() * np.exp(np.array(terms)))))


def test_a_steps_node_terms_are_its_ratio_given_the_ends_means() -> None:
    """The node terms condition on where each end's mean really lies: the good side's are highest
    at the node nearest the step's mean, and integrated over the ends' error they say what the
    step's ratio says."""
    reference, bad_end = [1000.0, 1020.0, 985.0, 1010.0], [930.0, 925.0]
    terms = step_terms(CFG, [1030.0], reference, bad_end)
    assert terms is not None and len(terms.good) == len(terms.bad) == len(NODES)
    assert int(np.argmax(terms.good)) == 8  # a run over the good end's mean: its mean may be higher
    assert int(np.argmax(step_terms(CFG, [940.0], reference, bad_end).bad)) > 4  # type: ignore[union-attr]
    for value in (1003.0, 975.0, 960.0, 935.0):
        terms = step_terms(CFG, [value], reference, bad_end)
        assert terms is not None
        integrated = _integrated(terms.bad) - _integrated(terms.good)
        assert math.copysign(1, integrated) == math.copysign(1, terms.log_lr)
        assert abs(integrated - terms.log_lr) < 0.3 * abs(terms.log_lr) + 0.5
    verdict, _ = judge_sequential(CFG, _runs([1003.0]), _runs(reference), tried=1, cap=5, bad_end=_runs(bad_end))
    assert verdict.figures["ends_error_nodes"]["good"] == [round(t, 4) for t in step_terms(  # type: ignore[union-attr]
        CFG, [1003.0], reference, bad_end).good]



def test_the_sessions_pooled_spread_makes_one_run_say_more() -> None:
    """The spread pooled over every commit the session ran (`pooled_spread`) adds degrees of
    freedom, so one run's ratio nears the one a known spread gives; the pool is each commit's
    runs about its own mean (a level shift between commits adds nothing), a single run none."""
    reference, sample = [1000.0, 1020.0, 985.0, 1010.0], [935.0]
    commits = [[990.0, 1010.0], [940.0, 960.0], [1005.0, 985.0, 995.0], [950.0]]
    pool = pooled_spread([reference, *commits])
    assert pool.df == (4 - 1) + 1 + 1 + 2 and pool.squares == pytest.approx(
        sum(sum((v - np.mean(c)) ** 2 for v in c) for c in [reference, *commits[:3]]))
    alone = log_likelihood_ratio(CFG, sample, reference)
    pooled = log_likelihood_ratio(CFG, sample, reference, others=pool)
    assert alone is not None and pooled is not None and pooled > alone > 0
    # The same runs shifted by commit pool to the same spread.
    shifted = pooled_spread([reference, *[[v + 37.0 * k for v in c] for k, c in enumerate(commits)]])
    assert shifted.df == pool.df and shifted.squares == pytest.approx(pool.squares)
    # No pool given: the ends' runs alone, as before.
    assert step_terms(CFG, sample, reference, others=pooled_spread([reference])) == step_terms(CFG, sample, reference)
