"""The bad end's verdict naming the good end's next round while the drop is unclear and the good
end's mean is the less known (oracle/accuracy/judge.py, `stats.looser_end`)."""

from __future__ import annotations

from bisect_npu.observations import Observation, SampleOutcome, VerdictKind
from bisect_npu.oracle.accuracy import stats
from bisect_npu.oracle.accuracy.judge import judge_accuracy
from bisect_npu.oracle.config import AccuracyConfig

CFG = AccuracyConfig(repeats=4)  # max_rounds 3, confidence 0.99


def round_of(rates: list[float]) -> Observation:
    return Observation(case_id="a", trial=0, samples=[SampleOutcome(id=f"q{i:03d}", correct=r, runs=4)
                                                      for i, r in enumerate(rates)])


FRESH = round_of([0.5] * 100)  # every sample right half the time: its mean known to 2.5 points
FIXED = round_of([1.0] * 45 + [0.0] * 55)  # every sample always or never right: its mean known exactly


def test_the_end_whose_runs_are_noisier_is_the_looser() -> None:
    assert stats.looser_end(FRESH.samples or [], FIXED.samples or [])[0] == "good"
    assert stats.looser_end(FIXED.samples or [], FRESH.samples or [])[0] == "bad"


def test_an_unclear_drop_with_the_good_end_looser_asks_for_the_good_ends_round_first() -> None:
    verdict = judge_accuracy(CFG, [FIXED], [FRESH], None, role="bad_end")
    assert verdict.figures["more_rounds"] and verdict.figures["good_end_again"]
    assert verdict.figures["good_error"] > verdict.figures["bad_error"]
    assert "the good end's mean is the looser" in verdict.reason
    # at the bad end's last round too: its forced verdict may still move with the good end's
    last = judge_accuracy(CFG, [FIXED] * 3, [FRESH], None, role="bad_end")
    assert last.figures["forced_at_max_rounds"] and last.figures["good_end_again"]


def test_no_good_end_round_past_its_plan_or_where_the_bad_end_is_looser_or_the_drop_clear() -> None:
    full = judge_accuracy(CFG, [FIXED], [FRESH] * 3, None, role="bad_end")
    assert full.figures["more_rounds"] and "good_end_again" not in full.figures
    looser_bad = judge_accuracy(CFG, [FRESH], [round_of([1.0] * 55 + [0.0] * 45)], None, role="bad_end")
    assert looser_bad.figures["more_rounds"] and "good_end_again" not in looser_bad.figures
    clear = judge_accuracy(CFG, [round_of([1.0] * 10 + [0.0] * 90)], [FRESH], None, role="bad_end")
    assert clear.kind == VerdictKind.BAD and "good_end_again" not in clear.figures
