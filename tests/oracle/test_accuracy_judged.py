"""The candidates already judged as evidence about a sample's side rates (oracle/accuracy/judged.py):
which candidates count, how much, and what their runs do to a step's side rates."""

from __future__ import annotations

import math

import pytest

from bisect_npu.observations import SampleOutcome, Verdict, VerdictKind
from bisect_npu.oracle.accuracy import stats
from bisect_npu.oracle.accuracy.judged import JudgedCandidates, JudgedRuns, side_weight


def _verdict(kind: VerdictKind, log_lr: float, stopped: str = "clear") -> Verdict:
    return Verdict(kind=kind, reason="", figures={"log_likelihood_ratio": log_lr, "stopped": stopped})


def _runs(correct: float, runs: int = 2, sample: str = "s") -> list[SampleOutcome]:
    return [SampleOutcome(id=sample, correct=correct, runs=runs)]


def test_a_side_weighs_its_runs_by_how_sure_its_steps_made_it() -> None:
    assert side_weight(0.0) == 0.0
    assert side_weight(-math.log(5)) == pytest.approx(4 / 6)  # odds 5 to 1: P - (1 - P)
    assert side_weight(20.0) == pytest.approx(1.0)


def test_judged_runs_go_to_their_side_weighed_and_a_step_never_takes_its_own() -> None:
    judged = JudgedCandidates()
    judged.record(10, _verdict(VerdictKind.GOOD, -4.0), _runs(1.0))
    judged.record(20, _verdict(VerdictKind.BAD, 6.0), _runs(0.0))
    runs = judged.runs_for(15)
    assert runs.good["s"] == pytest.approx((2 * math.tanh(2.0), 0.0), abs=1e-3)
    assert runs.bad["s"] == pytest.approx((0.0, 2 * math.tanh(3.0)), abs=1e-3)
    assert "s" not in judged.runs_for(10).good  # its own runs are not evidence about itself


def test_a_candidate_asked_again_pools_its_steps_and_sums_their_ratios() -> None:
    judged = JudgedCandidates()
    judged.record(10, _verdict(VerdictKind.GOOD, -1.0), _runs(1.0))
    judged.record(10, _verdict(VerdictKind.GOOD, -2.0), _runs(0.5))
    assert judged.runs_for(5).good["s"] == pytest.approx((3 * math.tanh(1.5), math.tanh(1.5)), abs=1e-3)


def test_forced_skipped_and_contradicted_verdicts_lend_nothing() -> None:
    judged = JudgedCandidates()
    judged.record(5, _verdict(VerdictKind.GOOD, -3.0, stopped="plan ended"), _runs(1.0))  # a lean, not a side
    judged.record(6, Verdict(kind=VerdictKind.SKIP, reason=""), _runs(1.0))
    assert not judged.runs_for(1)
    # a bad verdict below a good one: the two disagree on the change point, both left out
    judged.record(20, _verdict(VerdictKind.BAD, 3.0), _runs(0.0))
    judged.record(30, _verdict(VerdictKind.GOOD, -3.0), _runs(1.0))
    judged.record(40, _verdict(VerdictKind.BAD, 3.0), _runs(0.0, sample="t"))
    runs = judged.runs_for(1)
    assert not runs.good and set(runs.bad) == {"t"}


def test_judged_runs_move_a_misread_samples_side_rate_and_weigh_as_pooled_runs_at_full_weight() -> None:
    """The good end read a sample 4 of 4 and the bad end 0 of 4; good-side candidates that ran it
    and got it wrong half the time pull its good-side rate down, so one more candidate's 0 of 2
    there reads less bad. At full weight the runs count as the ends' own runs would."""
    good = [SampleOutcome(id=f"s{i}", correct=c, runs=4) for i, c in enumerate([1.0, 0.75, 0.5, 0.25, 1.0, 0.0])]
    bad = [SampleOutcome(id=f"s{i}", correct=c, runs=4) for i, c in enumerate([0.0, 0.75, 0.5, 0.25, 1.0, 0.0])]
    prior = stats.fit_joint(good, bad)
    candidate = [SampleOutcome(id="s0", correct=0.0, runs=2)]
    alone = stats.step_evidence(candidate, good, bad, prior).log_lr
    weighed = JudgedRuns(good={"s0": (2.0, 2.0)})
    conditioned = stats.step_evidence(candidate, good, bad, prior, judged=weighed).log_lr
    assert 0 < conditioned < alone
    pooled = stats.pool(good, [SampleOutcome(id="s0", correct=0.5, runs=4)])
    at_full = stats.side_rates(prior, stats.by_id(pooled)["s0"], stats.by_id(bad)["s0"])
    assert stats.judged_side_rates(prior, good[0], bad[0], weighed, "s0") == at_full
    half = stats.judged_side_rates(prior, good[0], bad[0], JudgedRuns(good={"s0": (1.0, 1.0)}), "s0")
    assert at_full.good[0] < half.good[0] < stats.side_rates(prior, good[0], bad[0]).good[0]


def test_a_fraction_of_a_run_is_the_gamma_functions_ratio() -> None:
    x = stats.np.array([0.7, 3.2])
    assert stats._log_rising(x, 2.5) == pytest.approx([math.lgamma(v + 2.5) - math.lgamma(v) for v in x])
    assert stats._log_rising(x, 3) == pytest.approx([math.lgamma(v + 3) - math.lgamma(v) for v in x])
