"""What a session knows, kept from its journal's records as they are appended: the search's
evidence per position, the finished steps, the trials of a step an interruption cut short, the
trial numbers used, the seconds its costs are measured by, and what came after the search (its
end, the finer level's answer, the dependency pins its culprit moved, the fix stage's records).
Built once from the journal a session opens with, then one record at a time, so neither a decision
nor the levels and the fix stage above it reread the journal; a resumed session builds the same
state from the same records (in any order of positions), hence the same decisions.

An end's step the host's failures left unjudged before this process (`given_up_at_ends`) is no
evidence and no finished step: the end runs again, its attempts numbered on from that step's.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection, Hashable, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from bisect_npu import search
from bisect_npu.fix_proposals import FixVerification
from bisect_npu.observations import VerdictKind
from bisect_npu.oracle.accuracy.stats import step_bound
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import (
    DependencyMoveRecord,
    EndRecord,
    FixRecord,
    FixVerifiedRecord,
    FixVerifyRecord,
    NextLevelRecord,
    Record,
    RetryRecord,
    RetryRun,
    StepRecord,
    TrialRecord,
    TrialRun,
    trial_seconds,
)
from bisect_npu.search.retry_policy import HostRecord

Term = Literal["good", "bad", "skip"]
Thing = TypeVar("Thing", bound=Hashable)  # a thing tested: a commit's position, a configuration's digest


def search_term(kind: str, find_fix: bool) -> Term:
    """The oracle says whether the symptom shows; with --find-fix the search looks for where it
    stops showing, so "symptom" is the old state (good) and "no symptom" the new one (bad)."""
    if find_fix and kind != "skip":
        return "good" if kind == "bad" else "bad"
    return "skip" if kind == "skip" else "good" if kind == "good" else "bad"


def accuracy_weight(confidence: float | None, last: int, *, find_fix: bool) -> Callable[[StepRecord], search.Weight]:
    """A step's likelihood ratio (accuracy oracle) in the search's terms, with its node terms
    over the ends' error where the verdict carries them (figure ``ends_error_nodes``): under
    --find-fix the symptom's side is the good one, so the ratio changes sign and the sides' node
    terms swap. A verdict without a ratio (the verdict store keeps the kind, not the figures)
    weighs what a step decided at the recipe's `confidence` at least said; the ends (0 and
    `last`) and other oracles' steps (`confidence` None) weigh 0."""

    def weigh(step: StepRecord) -> search.Weight:
        value = step.verdict.figures.get("log_likelihood_ratio")
        if not isinstance(value, int | float) or not math.isfinite(value):
            if confidence is None or step.verdict.kind == "skip" or step.index in (0, last):
                return search.Weight(0.0)
            bound = math.log(confidence / (1 - confidence))
            value = bound if step.verdict.kind == "bad" else -bound
        good, bad = _nodes(step.verdict.figures.get("ends_error_nodes"))
        if find_fix:
            return search.Weight(-float(value), bad, good)
        return search.Weight(float(value), good, bad)

    return weigh


def answer_log_lr(recipe: Recipe | None) -> float:
    """What the search's answer needs of its culprit's and parent's steps (`SearchProblem.answer_log_lr`):
    the accuracy oracle's full step bound, its candidate steps stopping earlier where they only
    steer the search (`stats.stop_bound`); 0 for other oracles."""
    spec = recipe.accuracy if recipe is not None else None
    return step_bound(spec.confidence) if spec is not None else 0.0


def measured_runs(step: StepRecord) -> tuple[float, ...]:
    """A step's measured throughput runs (its verdict's figure ``throughput_samples``), for the
    levels search; none where it measured nothing (a skip) or the figure is malformed."""
    samples = step.verdict.figures.get("throughput_samples")
    if step.verdict.kind == "skip" or not isinstance(samples, list):
        return ()
    values = [float(v) for v in samples if isinstance(v, int | float) and not isinstance(v, bool)]
    return tuple(v for v in values if math.isfinite(v)) if len(values) == len(samples) else ()


def _nodes(figure: object) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The good and bad sides' node terms of a verdict's figure, or none when it is missing or
    malformed (the step then weighs its ratio alone)."""
    if not isinstance(figure, dict):
        return (), ()
    good, bad = figure.get("good"), figure.get("bad")
    if not (isinstance(good, list) and isinstance(bad, list) and good and len(good) == len(bad)
            and all(isinstance(t, int | float) and math.isfinite(t) for t in good + bad)):
        return (), ()
    return tuple(float(t) for t in good), tuple(float(t) for t in bad)


class StoreLedger(Generic[Thing]):
    """Which verdicts of each thing tested came from the verdict store and which from runs here,
    as a search's journal records them (`note`): what a session re-runs fresh before it answers,
    and whether a fresh run contradicted the store (`verdict_reuse.SessionVerdicts`). Thread-safe."""

    def __init__(self) -> None:
        self._ledger_lock = threading.Lock()
        self._stored: set[Thing] = set()  # things with a verdict taken from the store (a skip too)
        self._kinds: dict[bool, dict[Thing, set[str]]] = {True: {}, False: {}}  # stored or not -> thing's kinds

    def note(self, thing: Thing, kind: str, *, stored: bool) -> None:
        """A verdict of `thing` journaled: taken from the store (`stored`) or run here."""
        with self._ledger_lock:
            if stored:
                self._stored.add(thing)
            if kind != VerdictKind.SKIP.value:
                self._kinds[stored].setdefault(thing, set()).add(kind)

    def stored_at(self, thing: Thing) -> bool:
        """Whether a verdict of `thing` was taken from the verdict store."""
        with self._ledger_lock:
            return thing in self._stored

    def stored_kinds(self) -> dict[Thing, set[str]]:
        """Each thing's verdict kinds from the verdict store (skips left out)."""
        with self._ledger_lock:
            return {thing: set(kinds) for thing, kinds in self._kinds[True].items()}

    def fresh_kinds(self) -> dict[Thing, set[str]]:
        """Each thing's verdict kinds from the runs here (skips left out)."""
        with self._ledger_lock:
            return {thing: set(kinds) for thing, kinds in self._kinds[False].items()}

    def store_disagreed(self) -> bool:
        """Whether a thing run here was judged otherwise than the verdict store judged it."""
        with self._ledger_lock:
            fresh = self._kinds[False]
            return any(thing in fresh and fresh[thing] != kinds for thing, kinds in self._kinds[True].items())


Key = TypeVar("Key", bound=Hashable)  # a candidate as its attempts are kept: a position, (a digest, at the reference)


class Attempts(Generic[Key]):
    """Each candidate's trials and failed attempts since its last record (an interrupted run's, kept
    across a resume), the trial numbers used, the outcomes of its trials, and the host's record of
    attempts as journaled (search/retry_policy.py: the trials that finished and the failed attempts
    before them). A record the host's failures left unjudged (`judged(..., given_up=True)`) keeps its
    attempts for the candidate's next run to number on from, and gives back its trial numbers (its
    trials never ran), so the next run's attempts fall on the same trials. The one book of both
    searches' attempts; not thread-safe (its state's lock is)."""

    def __init__(self) -> None:
        self.host_record = HostRecord()
        self._unsettled: dict[tuple[Key, str, int], int] = {}  # failed attempts of trials not finished (yet)
        self._pending: dict[Key, list[TrialRun]] = {}
        self._retries: dict[Key, list[RetryRun]] = {}
        self._given_up: dict[Key, list[RetryRun]] = {}  # attempts of records the host left unjudged
        self._last_trial: dict[Key, int] = {}
        self._judged_trial: dict[Key, int] = {}  # the last trial number when the candidate was last judged
        self._outcomes: dict[Key, list[VerdictKind | None]] = {}

    def trial(self, key: Key, trial: TrialRun) -> None:
        if trial.outcome != VerdictKind.SKIP:  # a run that finished (a skip of the host's is given up)
            failed = self._unsettled.pop((key, trial.case_id, trial.trial), 0)
            self.host_record = HostRecord(self.host_record.failures + failed, self.host_record.successes + 1)
        self._pending.setdefault(key, []).append(TrialRun.model_validate(trial.model_dump(
            include=set(TrialRun.model_fields))))
        self._last_trial[key] = max(self._last_trial.get(key, -1), trial.trial)
        self._outcomes.setdefault(key, []).append(trial.outcome)

    def retry(self, key: Key, retry: RetryRun) -> None:
        self._unsettled[(key, retry.case_id, retry.trial)] = self._unsettled.get((key, retry.case_id, retry.trial),
                                                                                0) + 1
        self._retries.setdefault(key, []).append(RetryRun.model_validate(retry.model_dump(
            include=set(RetryRun.model_fields))))

    def judged(self, key: Key, *, given_up: bool = False) -> None:
        """The candidate's record journaled: what came before it is no longer pending; `given_up`:
        the host's failures left it unjudged."""
        if given_up:
            self._given_up.setdefault(key, []).extend(self._retries.get(key, []))
            self._last_trial[key] = self._judged_trial.get(key, -1)
        else:
            self._given_up[key] = []
            self._judged_trial[key] = self._last_trial.get(key, -1)
        self._pending[key] = []
        self._retries[key] = []

    def given_up(self, key: Key) -> list[RetryRun]:
        return list(self._given_up.get(key, []))

    def pending_trials(self, key: Key) -> list[TrialRun]:
        return list(self._pending.get(key, []))

    def pending_retries(self, key: Key) -> list[RetryRun]:
        return list(self._retries.get(key, []))

    def next_trial(self, key: Key) -> int:
        """Trial numbers keep growing per candidate, so a repeated query never repeats a seed."""
        return self._last_trial.get(key, -1) + 1

    def outcomes(self, key: Key) -> list[VerdictKind | None]:
        return list(self._outcomes.get(key, []))


@dataclass
class MeasuredSeconds:
    """The seconds a session's costs are measured by (`costs.measured_costs`), record by record:
    each engine start's startup and each trial's run that ran to an outcome
    (`records.trial_seconds`), each finished step's probe seconds (the trials that ran since the
    position's last step), each full build's and overlay's. Not thread-safe (its state's lock is)."""

    startups: list[float] = field(default_factory=list)
    trial_runs: list[float] = field(default_factory=list)
    step_runs: list[float] = field(default_factory=list)
    builds: dict[str, list[float]] = field(default_factory=lambda: {"built": [], "overlay": []})
    _running: dict[int, float] = field(default_factory=dict)  # a position's trial seconds since its last step

    def apply(self, entry: Record) -> None:
        if isinstance(entry, TrialRecord):
            startups, runs = trial_seconds([entry])
            self.startups += startups
            self.trial_runs += runs
            if runs:
                self._running[entry.index] = self._running.get(entry.index, 0.0) + entry.seconds
        elif isinstance(entry, StepRecord):
            if entry.index in self._running:
                self.step_runs.append(self._running.pop(entry.index))
            build = entry.build
            if build is not None and build.how in self.builds and build.seconds:
                self.builds[build.how].append(build.seconds)

    def copy(self) -> MeasuredSeconds:
        return deepcopy(self)


class AfterSearch:
    """What a session journals besides its search's trials and steps, as the levels and the fix
    stage read it (`bisection.py`): how the search ended (its first `end` record), the finer
    levels' answers (`next_level`), the dependencies whose pin move is journaled, the fix stage's
    proposals (the first `fix` record), its verifications so far (`fix_verified`) and its end
    (`fix_verify`). Not thread-safe (its state's lock is)."""

    def __init__(self) -> None:
        self.end: EndRecord | None = None
        self.finer: list[NextLevelRecord] = []
        self.moved: set[str] = set()
        self.fix: FixRecord | None = None
        self.verified: list[FixVerification] = []
        self.fix_verify: FixVerifyRecord | None = None

    def apply(self, entry: Record) -> None:
        if isinstance(entry, EndRecord):
            self.end = entry if self.end is None else self.end
        elif isinstance(entry, NextLevelRecord):
            self.finer.append(entry)
        elif isinstance(entry, DependencyMoveRecord):
            self.moved.add(entry.name)
        elif isinstance(entry, FixRecord):
            self.fix = entry if self.fix is None else self.fix
        elif isinstance(entry, FixVerifiedRecord):
            self.verified.append(entry.verification)
        elif isinstance(entry, FixVerifyRecord):
            self.fix_verify = entry if self.fix_verify is None else self.fix_verify


class SessionState(StoreLedger[int]):
    """The records a session's decisions read, applied in journal order (`apply`), its positions'
    verdicts in the store's ledger, the seconds its costs are measured by (`seconds`) and what it
    journaled besides its search's trials and steps (`ended`, `finer`, `moved`, `fix`, ...);
    thread-safe: the slots of a round append while the progress asks how many candidates are left."""

    def __init__(self, noisy: bool, find_fix: bool, entries: Sequence[Record] = (),
                 weigh: Callable[[StepRecord], search.Weight] | None = None, ends: Collection[int] = (),
                 measured: bool = False) -> None:
        super().__init__()
        self.noisy = noisy
        self.find_fix = find_fix
        self.measured = measured  # levels mode: each step's throughput runs are the search's evidence
        self._weigh = weigh  # a step's log likelihood ratio in the search's terms (accuracy steps)
        self._lock = threading.Lock()
        self._evidence: dict[int, search.Evidence] = {}
        self._fresh: dict[int, search.Evidence] = {}  # the evidence without the verdict store's steps
        self._steps: list[StepRecord] = []
        self._journaled: list[StepRecord] = []  # every step, an end's given-up ones read from the journal too
        self._attempts: Attempts[int] = Attempts()
        self._seconds = MeasuredSeconds()
        self._after = AfterSearch()
        given_up = given_up_at_ends(entries, ends)
        for at, entry in enumerate(entries):
            self.apply(entry, evidence=at not in given_up)

    def apply(self, entry: Record, *, evidence: bool = True) -> None:
        """Fold one record in; `evidence` False: an end's given-up step or trial read from the
        journal (its attempts, seconds and journaled step are kept, nothing else)."""
        with self._lock:
            self._seconds.apply(entry)
            self._after.apply(entry)
            if isinstance(entry, StepRecord):
                self._journaled.append(entry)
            if isinstance(entry, TrialRecord):
                self._attempts.trial(entry.index, entry)
                if entry.outcome and self.noisy and evidence:
                    self._add(entry.index, entry.outcome.value, stored=False)
            elif isinstance(entry, RetryRecord):
                self._attempts.retry(entry.index, entry)
            elif isinstance(entry, StepRecord) and not evidence:
                self._attempts.judged(entry.index, given_up=True)
            elif isinstance(entry, StepRecord):
                self._apply_step(entry)

    @property
    def host_record(self) -> HostRecord:
        with self._lock:
            return self._attempts.host_record

    def _apply_step(self, step: StepRecord) -> None:
        self._steps.append(step)
        self._attempts.judged(step.index, given_up=step.host_failure is not None)
        stored = step.stored is not None
        self.note(step.index, step.verdict.kind.value, stored=stored)
        if self.noisy and step.stored is not None:
            for kind, count in (("good", step.stored.good), ("bad", step.stored.bad)):
                for _ in range(count):
                    self._add(step.index, kind, stored=True)
        elif not self.noisy or (step.verdict.kind == "skip" and not step.trials):
            self._add(step.index, step.verdict.kind.value, stored=stored,
                      weight=self._weigh(step) if self._weigh is not None else search.Weight(0.0),
                      values=measured_runs(step) if self.measured else ())

    def _add(self, index: int, kind: str, *, stored: bool, weight: search.Weight | float = 0.0,
             values: tuple[float, ...] = ()) -> None:
        books = (self._evidence,) if stored else (self._evidence, self._fresh)
        for book in books:
            book[index] = book.get(index, search.Evidence()).add(search_term(kind, self.find_fix)).weigh(
                weight).measure(values)

    def evidence(self, *, without_stored: bool = False) -> dict[int, search.Evidence]:
        """Each position's evidence; `without_stored`: only what this session ran itself (the
        verdict store's verdicts dropped, once a commit run fresh disagreed with one)."""
        with self._lock:
            return dict(self._fresh if without_stored else self._evidence)

    def steps(self) -> list[StepRecord]:
        """The finished steps, in journal order."""
        with self._lock:
            return list(self._steps)

    def journaled_steps(self) -> list[StepRecord]:
        """Every step journaled, in journal order: the finished ones and an end's steps the host
        left unjudged before this process (what a session's step count and its ends' story hold)."""
        with self._lock:
            return list(self._journaled)

    @property
    def seconds(self) -> MeasuredSeconds:
        """The seconds of the trials, steps and builds journaled (`costs.measured_costs`)."""
        with self._lock:
            return self._seconds.copy()

    def ended(self) -> EndRecord | None:
        """How the search ended (its first `end` record), if it has."""
        with self._lock:
            return self._after.end

    def finer(self) -> list[NextLevelRecord]:
        """The finer levels' answers journaled (`next_level`), in journal order."""
        with self._lock:
            return list(self._after.finer)

    def moved(self) -> set[str]:
        """The dependencies whose pin move is journaled (`dependency_move`)."""
        with self._lock:
            return set(self._after.moved)

    def fix(self) -> FixRecord | None:
        """The fix stage's proposals (the first `fix` record), if ranked."""
        with self._lock:
            return self._after.fix

    def fix_verified(self) -> list[FixVerification]:
        """The fix proposals verified so far (`fix_verified`), in journal order."""
        with self._lock:
            return list(self._after.verified)

    def fix_verify(self) -> FixVerifyRecord | None:
        """The verification stage's end (the first `fix_verify` record), if it ended."""
        with self._lock:
            return self._after.fix_verify

    def judged(self) -> set[int]:
        """The positions with a finished step (run here or taken from the verdict store)."""
        with self._lock:
            return {step.index for step in self._steps}

    def pending_trials(self, index: int) -> list[TrialRun]:
        """Trials of `index` journaled after its last finished step: an interrupted step's work."""
        with self._lock:
            return self._attempts.pending_trials(index)

    def pending_retries(self, index: int) -> list[RetryRun]:
        """Failed attempts at `index` journaled after its last finished step (kept across a resume)."""
        with self._lock:
            return self._attempts.pending_retries(index)

    def given_up(self, index: int) -> list[RetryRun]:
        """The attempts of `index`'s steps the host left unjudged since it was last judged."""
        with self._lock:
            return self._attempts.given_up(index)

    def next_trial(self, index: int) -> int:
        """Trial numbers keep growing per position, so a repeated query never repeats a seed."""
        with self._lock:
            return self._attempts.next_trial(index)

    def outcomes(self, index: int) -> list[VerdictKind]:
        """The outcomes of every trial journaled at `index` (the trials judged alone)."""
        with self._lock:
            return [outcome for outcome in self._attempts.outcomes(index) if outcome]

    def candidates_left(self, n: int) -> int:
        """Commits still between the highest good and the lowest bad position the evidence holds."""
        evidence = self.evidence()
        good = max((i for i, e in evidence.items() if e.good and not e.bad), default=0)
        bad = min((i for i, e in evidence.items() if e.bad and i > good), default=n)
        return max(1, bad - good)


def given_up_at_ends(entries: Sequence[Record], ends: Collection[int]) -> set[int]:
    """Where in `entries` an end's step the host's failures left unjudged stands, with that step's
    trials: none of it is evidence when the journal is opened again (the end runs again)."""
    marked: set[int] = set()
    trials: dict[int, list[int]] = {}
    for at, entry in enumerate(entries):
        if isinstance(entry, TrialRecord) and entry.index in ends:
            trials.setdefault(entry.index, []).append(at)
        elif isinstance(entry, StepRecord):
            since = trials.pop(entry.index, [])
            if entry.index in ends and entry.host_failure is not None:
                marked.update([at, *since])
    return marked
