"""Accuracy steps as the Evaluator runs them: rounds planned by the oracle, journaled rounds reused."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.running.accuracy import AccuracySteps, load_from
from bisect_npu.recipe.loader import parse_recipe
from bisect_npu.records import TrialRun

RECIPE = """name: acc
model: {path: /models/m}
oracle: {kinds: [accuracy]}
accuracy: {harness: command, dataset: d.jsonl, command: {argv: [x]}, focus: {batch: 4, control: 9}}
"""
GOOD = {f"q{i}": 1.0 for i in range(40)} | {f"q{i}": 0.0 for i in range(40, 50)}
BAD = GOOD | {f"q{i}": 0.0 for i in range(10)}  # the culprit breaks q0..q9


class Harness:
    """Writes an observation per round from a commit's per-sample correctness; remembers what it ran."""

    def __init__(self, tmp: Path, answers: dict[str, float]) -> None:
        self.tmp, self.answers, self.asked = tmp, answers, []  # type: ignore[var-annotated]

    def __call__(self, trial: int, sample_ids: Sequence[str] | None) -> TrialRun:
        ids = list(self.answers) if sample_ids is None else list(sample_ids)
        self.asked.append(ids)
        path = self.tmp / f"obs-{id(self)}-{len(self.asked)}.json"
        path.write_text(json.dumps({"case_id": "accuracy", "trial": trial,
                                    "samples": [{"id": i, "correct": self.answers[i]} for i in ids]}))
        return TrialRun(case_id="accuracy", trial=trial, observation=str(path))


def steps_with_ends(tmp_path: Path) -> AccuracySteps:
    steps = AccuracySteps(parse_recipe(RECIPE))
    load = load_from(tmp_path)
    _, good = steps.step("good", "good_end", (), Harness(tmp_path, GOOD), 0, load)
    _, bad = steps.step("bad", "bad_end", (), Harness(tmp_path, BAD), 0, load)
    assert (good.kind, bad.kind) == (VerdictKind.GOOD, VerdictKind.BAD)
    return steps


def test_a_candidate_runs_a_batch_of_the_discordant_samples_and_stops_when_clear(tmp_path: Path) -> None:
    steps = steps_with_ends(tmp_path)
    harness = Harness(tmp_path, BAD)
    records, verdict = steps.step("cand", "candidate", (), harness, 0, load_from(tmp_path))
    assert verdict.kind == VerdictKind.BAD
    assert len(records) == len(harness.asked) == 1  # the first batch settled it
    assert {i for i in harness.asked[0] if i in {f"q{k}" for k in range(10)}} == {"q0", "q1", "q2", "q3"}
    assert len(harness.asked[0]) == 4 + 4  # its share (4 of 10) of the nine control samples
    assert verdict.figures["samples_total"] == 50


def test_a_resumed_step_reuses_its_journaled_rounds(tmp_path: Path) -> None:
    steps = steps_with_ends(tmp_path)
    first = Harness(tmp_path, GOOD)
    records, verdict = steps.step("cand", "candidate", (), first, 0, load_from(tmp_path))
    fresh = steps_with_ends(tmp_path)
    again = Harness(tmp_path, GOOD)
    rerun, second = fresh.step("cand", "candidate", records, again, 0, load_from(tmp_path))
    assert again.asked == [] and second.kind == verdict.kind == VerdictKind.GOOD
    assert rerun == records


def test_a_commit_asked_again_runs_the_discordant_samples_it_has_not_run(tmp_path: Path) -> None:
    """A second step at one commit must not repeat the first one's samples: their rates there are
    what the first step already counted."""
    steps = steps_with_ends(tmp_path)
    first = Harness(tmp_path, GOOD)
    steps.step("cand", "candidate", (), first, 0, load_from(tmp_path))
    harness = Harness(tmp_path, GOOD)
    records, verdict = steps.step("cand", "candidate", (), harness, 5, load_from(tmp_path))
    ran_first = {i for ids in first.asked for i in ids}
    assert not set(harness.asked[0]) & ran_first
    assert {i for i in harness.asked[0] if i in {f"q{k}" for k in range(10)}} == {"q4", "q5", "q6", "q7"}
    assert verdict.kind == VerdictKind.GOOD and records[0].trial == 5
    other = Harness(tmp_path, GOOD)
    steps.step("other", "candidate", (), other, 9, load_from(tmp_path))
    assert set(other.asked[0]) & ran_first  # another commit starts from the most telling samples


def test_a_commit_whose_discordant_samples_all_ran_runs_the_whole_dataset(tmp_path: Path) -> None:
    steps = steps_with_ends(tmp_path)
    asked: list[list[str]] = []
    for number in range(3):
        harness = Harness(tmp_path, GOOD)
        steps.step("cand", "candidate", (), harness, 10 * number, load_from(tmp_path))
        asked.append(harness.asked[0])
    assert [len(ids) == 50 for ids in asked] == [False, False, True]  # 2 of 10 discordant left: below 4


def test_a_round_that_wrote_nothing_skips_the_step(tmp_path: Path) -> None:
    steps = steps_with_ends(tmp_path)

    def broken(trial: int, sample_ids: Sequence[str] | None) -> TrialRun:
        return TrialRun(case_id="accuracy", trial=trial, reason="probe exited 5: harness failed")

    _, verdict = steps.step("cand", "candidate", (), broken, 0, load_from(tmp_path))
    assert verdict.kind == VerdictKind.SKIP and "harness failed" in verdict.reason


class RatesHarness:
    """Writes each asked sample's rate over four runs a round (`runs` 4); counts its rounds."""

    def __init__(self, tmp: Path, rates: dict[str, float], name: str) -> None:
        self.tmp, self.rates, self.name, self.rounds = tmp, rates, name, 0

    def __call__(self, trial: int, sample_ids: Sequence[str] | None) -> TrialRun:
        self.rounds += 1
        ids = list(self.rates) if sample_ids is None else list(sample_ids)
        path = self.tmp / f"obs-{self.name}-{self.rounds}.json"
        path.write_text(json.dumps({"case_id": "accuracy", "trial": trial, "samples": [
            {"id": i, "correct": self.rates[i], "runs": 4} for i in ids]}))
        return TrialRun(case_id="accuracy", trial=trial, observation=str(path))


def test_a_bad_end_whose_good_end_is_the_looser_has_it_run_again_first(tmp_path: Path) -> None:
    """Good end: every sample right half the time (its mean known to 2.5 points a round); bad end:
    45 of 100 samples always right (its mean known exactly): the drop is unclear and the good
    end's error dominates after every bad round, so the good end runs again (pooled) until its
    plan's three rounds, then the bad end's own rounds go on."""
    steps = AccuracySteps(parse_recipe(RECIPE))
    load = load_from(tmp_path)
    good = RatesHarness(tmp_path, {f"q{i:03d}": 0.5 for i in range(100)}, "good")
    steps.step("good", "good_end", (), good, 0, load)
    extra: list[Verdict] = []

    def again() -> None:
        extra.append(steps.step("good", "good_end", (), good, good.rounds, load)[1])

    bad = RatesHarness(tmp_path, {f"q{i:03d}": float(i < 45) for i in range(100)}, "bad")
    records, verdict = steps.step("bad", "bad_end", (), bad, 0, load, again)
    assert good.rounds == 3 and len(steps.good_end or []) == 3  # pooled, at most max_rounds in all
    assert [v.figures["rounds"] for v in extra] == [2, 3] and all(v.trials == 1 for v in extra)
    assert all(v.reason.startswith("run again, round") and "the good end's mean the looser" in v.reason
               for v in extra)
    assert bad.rounds == len(records) == 3 and verdict.figures["forced_at_max_rounds"]
    assert "good_end_again" not in verdict.figures  # the good end's plan is spent
    assert steps.asked_again is None and not steps.good_end_again
