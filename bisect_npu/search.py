"""Choosing the next commit to test: a pure function of the evidence so far.

Positions: 0 is the good end, ``n`` the bad end, candidates are 1..n (first-parent commits in
``(good, bad]``). The culprit is the first bad position. No I/O here: git, disk and the clock
belong to the caller, so the search is tested alone (tests/test_search*.py).

    decide(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision

A Decision is ``Next(queries)`` (run these; more than one only when ``problem.slots > 1``; each
query takes one slot and runs its ``trials`` there), ``Found(index, ...)``, ``Narrowed(lo, hi,
...)`` (skips hide the boundary: culprit in (lo, hi]), or ``EndsWrong(which)`` (the good end
judged bad, or the bad end judged good).

Because ``decide`` only reads the evidence, a resumed session that rebuilds the evidence from
its journal gets exactly the decision an uninterrupted one would have got.

Two modes:

- ``exact``: every evidence entry is one commit-level verdict. Binary search (k-ary with k
  slots) between the highest known-good and the lowest known-bad position; skipped commits are
  stepped around, and when only skipped commits are left the answer is git's range.
- ``noisy``: entries hold trial counts; a Bayesian bisection over the change point
  (bisect_npu/search_noisy.py) that names a culprit only at the requested confidence and after
  a sandwich check against its parent.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Evidence:
    """Everything observed at one position: trial counts and whether it was skipped."""

    good: int = 0
    bad: int = 0
    skipped: bool = False

    def add(self, outcome: Literal["good", "bad", "skip"]) -> Evidence:
        if outcome == "good":
            return Evidence(self.good + 1, self.bad, self.skipped)
        if outcome == "bad":
            return Evidence(self.good, self.bad + 1, self.skipped)
        return Evidence(self.good, self.bad, True)

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
    the culprit's and its parent's own trials.
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
    mode, where the single-slot search then picks the pivot of least expected cost
    (bisect_npu/search_costs.py) instead of the midpoint. ``prebuilt_groups`` are groups whose
    compiled image exists though none of their positions need have been tested (an earlier
    session or a prefetch built it): their positions cost an overlay too.
    """

    n: int
    mode: Literal["exact", "noisy"] = "exact"
    check_ends: bool = True
    slots: int = 1
    confidence: float = 0.99
    max_trials_per_query: int = 64
    sandwich_confidence: float = 0.95
    earlier_runs: EarlierRuns | None = None
    load_cost: float = 0.0
    build_cost: float = 0.0
    build_groups: tuple[int, ...] | None = None
    overlay_cost: float = 0.0
    prebuilt_groups: frozenset[int] = frozenset()


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

Verdict = Literal["good", "bad", "skip"]


def decide(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    """The next step of the search for this evidence (same inputs, same decision)."""
    _validate(problem, evidence)
    if problem.mode == "noisy":
        from bisect_npu.search_noisy import decide_noisy

        return decide_noisy(problem, evidence)
    return _decide_exact(problem, evidence)


def _validate(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> None:
    """Programming errors of the caller, not user errors: fail loudly."""
    if problem.n < 1:
        raise ValueError(f"a search needs at least one candidate, got n={problem.n}")
    if problem.slots < 1:
        raise ValueError(f"slots must be >= 1, got {problem.slots}")
    if problem.mode not in ("exact", "noisy"):
        raise ValueError(f"unknown search mode {problem.mode!r}")
    if not 0.5 < problem.confidence < 1.0 or not 0.5 < problem.sandwich_confidence < 1.0:
        raise ValueError("confidence levels must lie in (0.5, 1)")
    if problem.max_trials_per_query < 1:
        raise ValueError("max_trials_per_query must be >= 1")
    if problem.build_groups is not None and len(problem.build_groups) != problem.n + 1:
        raise ValueError(f"build_groups needs one group per position 0..{problem.n}, got {len(problem.build_groups)}")
    if problem.prebuilt_groups and not set(problem.prebuilt_groups) <= set(problem.build_groups or ()):
        raise ValueError(f"prebuilt_groups {sorted(problem.prebuilt_groups)} are not all among build_groups")
    for name in ("load_cost", "build_cost", "overlay_cost"):
        if not 0.0 <= getattr(problem, name) < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {getattr(problem, name)}")
    runs = problem.earlier_runs
    if runs is not None and not (0 <= runs.bad_failed <= runs.bad_runs and 0 <= runs.good_failed <= runs.good_runs):
        raise ValueError(f"earlier runs need 0 <= failed <= runs at each end, got {runs}")
    outside = [i for i in evidence if not 0 <= i <= problem.n]
    if outside:
        raise ValueError(f"evidence at positions outside 0..{problem.n}: {sorted(outside)[:5]}")


def commit_verdict(ev: Evidence) -> Verdict | None:
    """Exact mode's reading of one position: None when untested.

    A position with as many good as bad verdicts is contradictory and counts as skipped, so the
    search steps around it instead of trusting either.
    """
    if ev.bad > ev.good:
        return "bad"
    if ev.good > ev.bad:
        return "good"
    if ev.skipped or ev.bad:
        return "skip"
    return None


def known_bounds(n: int, verdicts: Mapping[int, Verdict]) -> tuple[int, int]:
    """(lo, hi): the highest good below the lowest bad; the ends are assumed when untested."""
    hi = min((i for i, v in verdicts.items() if v == "bad" and i >= 1), default=n)
    lo = max((i for i, v in verdicts.items() if v == "good" and i < hi), default=0)
    return lo, hi


def _end_problem(n: int, verdicts: Mapping[int, Verdict], check: bool) -> tuple[EndsWrong | None, list[int]]:
    """A contradicted end (or one that cannot be tested), else the ends still to test, bad first."""
    untested: list[int] = []
    ends: tuple[tuple[int, Literal["good", "bad"], Verdict], ...] = ((n, "bad", "bad"), (0, "good", "good"))
    for position, which, expected in ends:
        verdict = verdicts.get(position)
        if verdict is None:
            if check:
                untested.append(position)
        elif verdict == "skip":
            if check:
                return EndsWrong(which, {"skipped": 1.0}), []
        elif verdict != expected:
            return EndsWrong(which), []
    return None, untested


def _decide_exact(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    n = problem.n
    verdicts = {i: v for i, ev in evidence.items() if (v := commit_verdict(ev)) is not None}
    wrong, ends = _end_problem(n, verdicts, problem.check_ends)
    if wrong is not None:
        return wrong
    lo, hi = known_bounds(n, verdicts)
    untested = [i for i in range(lo + 1, hi) if i not in verdicts]
    queries = ends[: problem.slots]
    spare = problem.slots - len(queries)
    if spare > 0 and untested:
        pivot = _cheapest_pivot(problem, evidence, lo, hi, untested) if problem.slots == 1 else None
        queries += [pivot] if pivot is not None else spread_picks(lo, hi, untested, spare)
    if queries:
        return Next(tuple(Query(i) for i in queries))
    tested = float(len(verdicts))
    if hi - lo == 1:
        return Found(hi, figures={"tested": tested})
    return Narrowed(lo, hi, figures={"tested": tested})


def group_ids(keys: Sequence[str]) -> tuple[int, ...]:
    """Build keys as small integers for ``SearchProblem.build_groups``: one id per distinct key."""
    ids: dict[str, int] = {}
    return tuple(ids.setdefault(key, len(ids)) for key in keys)


def built_groups(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> frozenset[int]:
    """The build groups whose image exists: built before the search, or holding a tested
    position. Their other positions need only an overlay.

    A position that was only skipped does not count: its build may be what failed."""
    groups = problem.build_groups or ()
    return problem.prebuilt_groups | {groups[i] for i, ev in evidence.items() if ev.trials}


def _cheapest_pivot(problem: SearchProblem, evidence: Mapping[int, Evidence], lo: int, hi: int,
                    untested: list[int]) -> int | None:
    """The least-expected-cost pivot when full builds cost more than overlays, else None (midpoint)."""
    groups = problem.build_groups
    if groups is None or problem.build_cost <= problem.overlay_cost:
        return None
    from bisect_npu.search_costs import cheapest_pivot

    return cheapest_pivot(lo, hi, tuple(untested), tuple(groups[i] for i in (lo, *untested, hi)),
                          built_groups(problem, evidence), problem.build_cost, problem.overlay_cost)


def spread_picks(lo: int, hi: int, untested: list[int], count: int) -> list[int]:
    """Up to ``count`` distinct untested positions splitting (lo, hi] into count+1 equal parts.

    ``untested`` is sorted. Each target takes the nearest free position, looking at the
    target, then one above, one below, two above, ... so a skipped commit is stepped around
    deterministically and never asked twice. With count=1 the target is the midpoint
    (lo + hi) // 2, which keeps plain bisection within ceil(log2 N) steps.
    """
    if len(untested) <= count:
        return list(untested)
    free = list(untested)
    picks: list[int] = []
    for part in range(1, count + 1):
        target = lo + (hi - lo) * part // (count + 1)
        picks.append(_take_nearest(free, target))
    return sorted(picks)


def _take_nearest(free: list[int], target: int) -> int:
    """Remove and return the element of sorted ``free`` nearest to target (above wins ties)."""
    at = bisect_left(free, target)
    if at < len(free) and free[at] == target:
        return free.pop(at)
    above = at if at < len(free) else None
    below = at - 1 if at > 0 else None
    if below is None or (above is not None and free[above] - target <= target - free[below]):
        return free.pop(above)  # type: ignore[arg-type]
    return free.pop(below)
