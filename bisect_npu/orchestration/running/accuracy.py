"""One accuracy step: rounds of harness runs at a commit until the accuracy oracle is clear.

The Evaluator hands an accuracy recipe's steps here. A round is one trial (one probe run, one
harness run over some samples); which samples each round runs comes from the oracle's round plan
(oracle.accuracy.focus.round_plan): the ends run the whole dataset, a candidate the samples the
ends disagree on (with a control set), then more. After each round the oracle judges every round
so far and says whether another is wanted (figure ``more_rounds``). Rounds journaled before an
interruption are reused in order (the plan is deterministic), so a resumed step runs only the
rest.

The bad end's verdict may ask for the good end's next round first (figure ``good_end_again``:
the drop between the ends is unclear and the good end's mean the less known). Its step then has
the session run a step at the good end (`again`: one round of the whole dataset, pooled onto the
good end's rounds) and judges its own rounds so far again before its next. A resumed session
holds the good end's journaled steps pooled already (`remember`), so its bad end's step, judging
its journaled rounds against them, asks for what the interrupted one would have asked next.

A candidate's side rates are conditioned on the candidates already judged (oracle/accuracy/
judged.py): each finished candidate step's runs and verdict are kept by the commit's position in
the history (`positions`, the session's), and a step takes the others' as they stand when it
starts. A resumed session recalls them from its journaled steps in the order they were journaled
(`recall_ran`), so a step judges as the uninterrupted session's did.
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
from bisect_npu.oracle.accuracy.judged import JudgedCandidates, JudgedRuns
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
    # The bad end's verdict that asked for the good end's next round, while that round's step runs.
    asked_again: Verdict | None = None
    # Each commit's position in the searched history (the session's; none: a candidate's side rates
    # are the ends' alone, as where candidates are configurations, not commits in order).
    positions: dict[str, int] = field(default_factory=dict)
    judged: JudgedCandidates = field(default_factory=JudgedCandidates)

    @property
    def good_end_again(self) -> bool:
        """Whether the good end's step now running is one more round asked by the bad end's step
        (pooled onto its rounds; no earlier results are taken for it)."""
        return self.asked_again is not None and self.good_end is not None

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

    def judge(self, observations: list[Observation], role: Role, final: bool,
              judged: JudgedRuns | None = None) -> Verdict:
        spec = self.recipe.accuracy
        assert spec is not None
        return oracle.judge_accuracy(spec, observations, self.good_end, self.bad_end, role=role, final=final,
                                     judged=judged)

    def judged_for(self, commit: str, role: Role) -> JudgedRuns | None:
        """The other candidates' runs a candidate's step at `commit` conditions its side rates on."""
        position = self.positions.get(commit)
        if role != "candidate" or position is None:
            return None
        return self.judged.runs_for(position)

    def _judged(self, commit: str, role: Role, observations: Sequence[Observation], verdict: Verdict) -> None:
        """A candidate's finished step joins the judged ones (a step that ran nothing does not)."""
        position = self.positions.get(commit)
        samples = samples_of(observations)
        if role == "candidate" and position is not None and samples:
            self.judged.record(position, verdict, samples)

    def step(self, commit: str, role: Role, done: Sequence[TrialRun], run_round: RunRound, first_trial: int,
             load: Callable[[str], Observation], again: Callable[[], None] | None = None,
             ) -> tuple[list[TrialRun], Verdict]:
        """Rounds (the journaled `done` first) until the verdict is clear or the plan ends; a round's
        trial is the one the uninterrupted step gave it (`first_trial`: the session's next, after
        every journaled trial). `again` (the bad end's step): runs a step at the good end, where
        the bad end's verdict asks for the good end's next round."""
        repeat = role == "good_end" and self.good_end_again
        before = list(self.good_end or []) if repeat else []
        plan: list[list[str] | None] = [None] if repeat else self.plan(commit, role)
        ran = self.ran.setdefault(commit, set())
        judged = self.judged_for(commit, role)
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
            final = number == len(plan) - 1
            verdict = self.judge([*before, *observations], role, final=final, judged=judged)
            if role == "bad_end" and again is not None:
                verdict = self._good_end_again(observations, verdict, again, final)
            if not verdict.figures.get("more_rounds"):
                break
        if repeat and verdict.kind != VerdictKind.SKIP:
            verdict = self._said_again(verdict, len(records))
        if role == "good_end" and verdict.kind != VerdictKind.SKIP:
            self.good_end = [*before, *observations]
        if role == "bad_end" and verdict.kind != VerdictKind.SKIP:
            self.bad_end = observations
        self._judged(commit, role, observations, verdict)
        return records, verdict

    def _good_end_again(self, observations: list[Observation], verdict: Verdict, again: Callable[[], None],
                        final: bool) -> Verdict:
        """The bad end's rounds judged again after each round of the good end its verdict asks for,
        until it asks for none (or the good end's round gave nothing)."""
        while verdict.figures.get("good_end_again"):
            had = len(self.good_end or [])
            self.asked_again = verdict
            try:
                again()
            finally:
                self.asked_again = None
            if len(self.good_end or []) <= had:
                break
            verdict = self.judge(observations, "bad_end", final=final)
        return verdict

    def _said_again(self, verdict: Verdict, trials: int) -> Verdict:
        """The good end's extra round said as what it is: why it ran (the bad end's errors), its
        rounds in all, and the trials this step took."""
        asked = self.asked_again
        assert asked is not None
        spec = self.recipe.accuracy
        assert spec is not None
        figures = {**verdict.figures, "run_again": True, "bad_end_asked": asked.figures.get("rounds")}
        why = (f"run again, round {figures.get('rounds')} of at most {spec.max_rounds}: the drop to the bad end was "
               f"unclear after its round {asked.figures.get('rounds')} and the good end's mean the looser "
               f"(standard error {100 * float(asked.figures.get('good_error', 0.0)):.2f} points against the bad "
               f"end's {100 * float(asked.figures.get('bad_error', 0.0)):.2f}); ")
        return verdict.model_copy(update={"figures": figures, "reason": why + verdict.reason, "trials": trials})

    def recall_ran(self, commit: str, observations: Sequence[Observation], verdict: Verdict | None = None) -> None:
        """A step at `commit` journaled before a resume: the samples its rounds ran, so a step the
        search asks there again runs the others, as the interrupted session would have; with its
        `verdict`, a candidate's step joins the judged ones as it did when it finished."""
        self.ran.setdefault(commit, set()).update(s.id for obs in observations for s in obs.samples or [])
        position = self.positions.get(commit)
        if verdict is not None and position is not None and 0 < position < max(self.positions.values()):
            self._judged(commit, "candidate", observations, verdict)

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
