"""One accuracy step: rounds of harness runs at a commit until the accuracy oracle is clear.

The Evaluator hands an accuracy recipe's steps here. A round is one trial (one probe run, one
harness run over some samples); which samples each round runs comes from the oracle's round plan
(oracle.accuracy.focus.round_plan): the ends run the whole dataset, a candidate the samples the
ends disagree on (with a control set), then more. After each round the oracle judges every round
so far and says whether another is wanted (figure ``more_rounds``). Rounds journaled before an
interruption are reused in order (the plan is deterministic), so a resumed step runs only the
rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_npu import oracle
from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.accuracy.focus import round_plan
from bisect_npu.oracle.accuracy.judge import Role, samples_of
from bisect_npu.records import TrialRun

if TYPE_CHECKING:
    from bisect_npu.recipe.schema import Recipe

# Runs one round: (trial number, sample ids or None for all) -> the round's trial record.
RunRound = Callable[[int, Sequence[str] | None], TrialRun]


def next_round_trial(rounds: Sequence[TrialRun], first_trial: int) -> int:
    """The trial of a step's next round: after its last round's (a journaled one's too), and never
    before `first_trial` (the session's next, after every journaled trial), so a resumed step runs
    its rounds left at the trials the uninterrupted step gave them."""
    return max(rounds[-1].trial + 1, first_trial) if rounds else first_trial


@dataclass
class AccuracySteps:
    """The ends' observations (the reference) and the samples each commit's steps ran, for one
    session."""

    recipe: Recipe
    good_end: list[Observation] | None = None
    bad_end: list[Observation] | None = None
    ran: dict[str, set[str]] = field(default_factory=dict)

    def plan(self, commit: str, role: Role) -> list[list[str] | None]:
        """The rounds this step may run. A commit stepped before (the search asks again: it wants
        more evidence there) runs the focused samples its earlier steps did not, the whole dataset
        once those are too few (the fallback to more samples)."""
        spec = self.recipe.accuracy
        assert spec is not None
        good, bad = samples_of(self.good_end or []), samples_of(self.bad_end or [])
        if role != "candidate" or not good or not bad:
            return [None] * spec.max_rounds
        return round_plan(spec, good, bad, commit, self.ran.get(commit, ()))

    def judge(self, observations: list[Observation], role: Role, final: bool) -> Verdict:
        spec = self.recipe.accuracy
        assert spec is not None
        return oracle.judge_accuracy(spec, observations, self.good_end, self.bad_end, role=role, final=final)

    def step(self, commit: str, role: Role, done: Sequence[TrialRun], run_round: RunRound, first_trial: int,
             load: Callable[[str], Observation]) -> tuple[list[TrialRun], Verdict]:
        """Rounds (the journaled `done` first) until the verdict is clear or the plan ends; a round's
        trial is the one the uninterrupted step gave it (`first_trial`: the session's next, after
        every journaled trial)."""
        plan = self.plan(commit, role)
        ran = self.ran.setdefault(commit, set())
        records: list[TrialRun] = []
        observations: list[Observation] = []
        verdict = Verdict(kind=VerdictKind.SKIP, reason="no round ran", trials=0)
        for number, sample_ids in enumerate(plan):
            record = done[number] if number < len(done) else run_round(next_round_trial(records, first_trial),
                                                                       sample_ids)
            records.append(record)
            if not record.observation:  # the harness or the engine failed: no verdict from this step
                return records, Verdict(kind=VerdictKind.SKIP, reason=record.reason or "the round wrote no "
                                        "observation", trials=len(records))
            observations.append(load(record.observation))
            ran.update(s.id for s in observations[-1].samples or [])
            verdict = self.judge(observations, role, final=number == len(plan) - 1)
            if not verdict.figures.get("more_rounds"):
                break
        if role == "good_end" and verdict.kind != VerdictKind.SKIP:
            self.good_end = observations
        if role == "bad_end" and verdict.kind != VerdictKind.SKIP:
            self.bad_end = observations
        return records, verdict

    def recall_ran(self, commit: str, observations: Sequence[Observation]) -> None:
        """A step at `commit` journaled before a resume: the samples its rounds ran, so a step the
        search asks there again runs the others, as the interrupted session would have."""
        self.ran.setdefault(commit, set()).update(s.id for obs in observations for s in obs.samples or [])

    def remember(self, role: Role, observations: list[Observation]) -> None:
        """An end judged before (a resumed session): its observations are the reference again."""
        if role == "good_end":
            self.good_end = observations
        elif role == "bad_end":
            self.bad_end = observations


def role_of(as_reference: bool, as_bad_end: bool) -> Role:
    return "good_end" if as_reference else "bad_end" if as_bad_end else "candidate"


def load_from(session_dir: Path) -> Callable[[str], Observation]:
    def load(path: str) -> Observation:
        return Observation.load(path if Path(path).is_absolute() else session_dir / path)

    return load
