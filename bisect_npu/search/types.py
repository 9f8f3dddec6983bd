"""The search's data: what it is asked (SearchProblem), what it was told (Evidence) and what it
answers (a Decision). Plain frozen values, so a decision depends on nothing but them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from bisect_npu.defaults import CONFIDENCE

Outcome = Literal["good", "bad", "skip"]
# Levels mode: runs made before the session at the good end and at the bad end, on the host the
# published baseline comes from (a nightly's), which need not be the session's.
EarlierLevels = tuple[tuple[float, ...], tuple[float, ...]]
NO_EARLIER: EarlierLevels = ((), ())


@dataclass(frozen=True)
class Weight:
    """One step's evidence in likelihood mode. ``log_lr``: its log likelihood ratio (bad side over
    good side). ``good``/``bad`` (optional, equal lengths K): log P(what it measured | the side,
    that side's end mean at node k) for the K nodes of the probabilists' Gauss-Hermite rule over
    the end mean's error (z_k standard errors off its estimate; one common constant dropped),
    when the step compared against estimated end means: every step shares those ends, so the
    search integrates over their error once, over all steps together, instead of per step."""

    log_lr: float
    good: tuple[float, ...] = ()
    bad: tuple[float, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """Everything observed at one position: trial counts and whether it was skipped.

    ``log_lr`` (likelihood mode) is what the position's steps said about its side, as a natural
    log likelihood ratio: log P(what was measured | the position is on the bad side) minus log
    P(it | the good side), summed over its steps (independent measurements multiply).
    ``shared_good``/``shared_bad`` sum the node terms of the steps that carried them
    (`Weight`), and ``shared_log_lr`` the part of ``log_lr`` those steps make up: the search
    uses the node terms in its place. ``measured`` (levels mode) holds the position's measured
    values themselves (a throughput run's tokens/s each), which that mode weighs all together.
    """

    good: int = 0
    bad: int = 0
    skipped: bool = False
    log_lr: float = 0.0
    shared_good: tuple[float, ...] = ()
    shared_bad: tuple[float, ...] = ()
    shared_log_lr: float = 0.0
    measured: tuple[float, ...] = ()

    def add(self, outcome: Outcome) -> Evidence:
        if outcome == "good":
            return replace(self, good=self.good + 1)
        if outcome == "bad":
            return replace(self, bad=self.bad + 1)
        return replace(self, skipped=True)

    def weigh(self, step: float | Weight) -> Evidence:
        """This evidence with one more step's log likelihood ratio (and its node terms, if any)."""
        if not isinstance(step, Weight):
            return replace(self, log_lr=self.log_lr + step)
        if not step.good:
            return replace(self, log_lr=self.log_lr + step.log_lr)
        if self.shared_good and len(self.shared_good) != len(step.good):
            raise ValueError("steps of one position carry node terms of different lengths")
        good = tuple(map(sum, zip(self.shared_good or (0.0,) * len(step.good), step.good, strict=True)))
        bad = tuple(map(sum, zip(self.shared_bad or (0.0,) * len(step.bad), step.bad, strict=True)))
        return replace(self, log_lr=self.log_lr + step.log_lr, shared_good=good, shared_bad=bad,
                       shared_log_lr=self.shared_log_lr + step.log_lr)

    def measure(self, values: tuple[float, ...]) -> Evidence:
        """This evidence with more measured values (levels mode)."""
        return replace(self, measured=self.measured + tuple(values))

    @property
    def trials(self) -> int:
        return self.good + self.bad


@dataclass(frozen=True)
class EarlierRuns:
    """Runs of the two ends made before the session: how the user knows the failure is flaky
    ("loops in 8 of 10 runs on the bad release, 0 of 10 on the good one").

    The noisy search counts them as trials of the ends it did not have to pay for, so it starts
    out knowing the two rates roughly; bench/noisy_bench.py shows the trials this saves. They
    must be real counts: figures claimed over more runs than were made make the search
    overconfident. The session still runs each end itself, and the sandwich check uses only
    the culprit's and its parent's own trials. "bad" is the side the search hunts for.
    """

    bad_failed: int
    bad_runs: int
    good_failed: int
    good_runs: int


@dataclass(frozen=True)
class SearchProblem:
    """What is searched and how sure the answer must be.

    ``confidence`` is the posterior mass the noisy mode needs on one culprit;
    ``sandwich_confidence`` is how sure the culprit's and its parent's own trials must make us
    that the culprit fails more often than its parent. ``max_trials_per_query`` caps the
    trials spent at any one position. ``earlier_runs`` (noisy mode) are the ends' runs made
    before the session. ``load_cost`` (noisy mode) is what starting the engine for a query costs,
    in trials: 0 asks one trial per query (the posterior steers every trial); above 0 a query may
    ask several trials of one commit, which share one engine start. ``build_cost`` (noisy mode) is
    what building a commit not tested yet costs, in trials: above 0 the search weighs a new
    commit's information against its build and prefers commits it has built already.

    ``build_groups`` gives each position 0..n the id of its build key: positions sharing one
    share a compiled image, so once one of them is tested the others cost only ``overlay_cost``
    (a python overlay) instead of ``build_cost`` (a full build); None: every position is its own
    build. Both costs are in trials in noisy mode and in steps (one query's trials) in exact
    and likelihood mode; the single-slot exact search then picks the pivot of least expected cost
    (bisect_npu/search/costs.py) instead of the midpoint, the single-slot likelihood search the
    step of most information per cost instead of the posterior's median. ``prebuilt_groups`` are groups whose
    compiled image exists though none of their positions need have been tested (an earlier
    session or a prefetch built it): their positions cost an overlay too.

    ``weights`` (exact mode, one slot) gives each position 0..n the number of commits it brings
    into the range: 1 for a plain commit, more for a merge of a side branch. The culprit is as
    likely to be any of those commits, so the pivot is the position that splits the weight of the
    open positions most evenly (git bisect's rule over the commit graph) instead of the midpoint;
    None: every position weighs 1.

    ``answer_log_lr`` (likelihood mode) is the |log likelihood ratio| the named culprit's steps
    and its parent's must each add up to (bad and good) before the answer names it; the search
    asks them again while they fall short and steps are left (steps that stop short of it only
    steer the search). 0: the posterior alone decides.

    ``threshold`` (levels mode) is the share of the good side's mean under which a mean is bad (a
    throughput recipe's `threshold`): the bad side lies under it. ``baseline`` (levels mode) is the
    published good-side mean (a nightly case's `baseline`), in the measured runs' unit: a prior on
    the good side's mean that the runs check; None: the runs alone place it. ``earlier_levels``
    (levels mode) are runs at the good end and at the bad end made on the baseline's host before
    the session (the last good nightly's and the failing nightly's throughput), in the same unit:
    they count as runs at the ends as far as that host is the session's, as the baseline does.
    ``rising`` (levels mode) is a fix search's history: the low level on the good side (the old
    end's), the bad side the restored level over it (rising.py searches it as the drop it mirrors;
    ``baseline`` is then the restored level and ``earlier_levels`` stay (good end, bad end)).
    """

    n: int
    mode: Literal["exact", "noisy", "likelihood", "levels"] = "exact"
    check_ends: bool = True
    slots: int = 1
    confidence: float = CONFIDENCE
    max_trials_per_query: int = 64
    sandwich_confidence: float = 0.95
    earlier_runs: EarlierRuns | None = None
    load_cost: float = 0.0
    build_cost: float = 0.0
    build_groups: tuple[int, ...] | None = None
    overlay_cost: float = 0.0
    prebuilt_groups: frozenset[int] = frozenset()
    weights: tuple[int, ...] | None = None
    threshold: float = 0.97
    answer_log_lr: float = 0.0
    baseline: float | None = None
    earlier_levels: EarlierLevels = NO_EARLIER
    rising: bool = False


@dataclass(frozen=True)
class Query:
    index: int
    trials: int = 1


@dataclass(frozen=True)
class Next:
    queries: tuple[Query, ...]


@dataclass(frozen=True)
class Found:
    index: int
    confidence: float = 1.0
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Narrowed:
    lo: int
    hi: int
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EndsWrong:
    which: Literal["good", "bad"]
    figures: dict[str, float] = field(default_factory=dict)


Decision = Next | Found | Narrowed | EndsWrong


def rests_on(decision: Decision, n: int) -> tuple[int, ...]:
    """The positions an answer rests on: a culprit and its parent, a narrowed range's two ends,
    the end judged wrong (0 or `n`); none for a decision to run more."""
    if isinstance(decision, Found):
        return (decision.index - 1, decision.index)
    if isinstance(decision, Narrowed):
        return (decision.lo, decision.hi)
    if isinstance(decision, EndsWrong):
        return (0 if decision.which == "good" else n,)
    return ()


def validate(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> None:
    """Programming errors of the caller, not user errors: fail loudly."""
    if problem.n < 1:
        raise ValueError(f"a search needs at least one candidate, got n={problem.n}")
    if problem.slots < 1:
        raise ValueError(f"slots must be >= 1, got {problem.slots}")
    if problem.mode not in ("exact", "noisy", "likelihood", "levels"):
        raise ValueError(f"unknown search mode {problem.mode!r}")
    if not 0.5 < problem.confidence < 1.0 or not 0.5 < problem.sandwich_confidence < 1.0:
        raise ValueError("confidence levels must lie in (0.5, 1)")
    if not 0.0 < problem.threshold <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1], got {problem.threshold}")
    if problem.baseline is not None and not (math.isfinite(problem.baseline) and problem.baseline > 0):
        raise ValueError(f"baseline must be a positive finite number, got {problem.baseline}")
    if any(not (math.isfinite(v) and v > 0) for side in problem.earlier_levels for v in side):
        raise ValueError(f"earlier_levels must be positive finite numbers, got {problem.earlier_levels}")
    if any(not all(map(math.isfinite, ev.measured)) for ev in evidence.values()):
        raise ValueError("measured values must be finite")
    if problem.max_trials_per_query < 1:
        raise ValueError("max_trials_per_query must be >= 1")
    if problem.build_groups is not None and len(problem.build_groups) != problem.n + 1:
        raise ValueError(f"build_groups needs one group per position 0..{problem.n}, got {len(problem.build_groups)}")
    if problem.weights is not None and (len(problem.weights) != problem.n + 1 or min(problem.weights) < 1):
        raise ValueError(f"weights needs one weight >= 1 per position 0..{problem.n}, got {problem.weights[:5]}...")
    if problem.prebuilt_groups and not set(problem.prebuilt_groups) <= set(problem.build_groups or ()):
        raise ValueError(f"prebuilt_groups {sorted(problem.prebuilt_groups)} are not all among build_groups")
    for name in ("load_cost", "build_cost", "overlay_cost"):
        if not 0.0 <= getattr(problem, name) < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {getattr(problem, name)}")
    runs = problem.earlier_runs
    if runs is not None and not (0 <= runs.bad_failed <= runs.bad_runs and 0 <= runs.good_failed <= runs.good_runs):
        raise ValueError(f"earlier runs need 0 <= failed <= runs at each end, got {runs}")
    if any(not math.isfinite(ev.log_lr) for ev in evidence.values()):
        raise ValueError("a log likelihood ratio must be finite (clip it where it is computed)")
    shared = {len(ev.shared_good) for ev in evidence.values() if ev.shared_good}
    if len(shared) > 1 or any(len(ev.shared_good) != len(ev.shared_bad)
                              or not all(map(math.isfinite, ev.shared_good + ev.shared_bad))
                              for ev in evidence.values()):
        raise ValueError("node terms need one length at every position, finite, good and bad alike")
    outside = [i for i in evidence if not 0 <= i <= problem.n]
    if outside:
        raise ValueError(f"evidence at positions outside 0..{problem.n}: {sorted(outside)[:5]}")
