"""Exact mode: every evidence entry is one commit-level verdict.

Binary search between the highest known-good and the lowest known-bad position, k-ary with k
slots; skipped commits are stepped around, and when only skipped commits are left the answer is
git's range. With build groups the single-slot search takes the pivot of least expected cost
(costs.py) instead of the midpoint; with weights (merges that bring in many commits) the pivot
that splits the open commits most evenly. docs/design/search.md says how the picks are made.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import Literal

from bisect_npu.search.costs import built_groups, cheapest_pivot
from bisect_npu.search.types import (
    Decision,
    EndsWrong,
    Evidence,
    Found,
    Narrowed,
    Next,
    Outcome,
    Query,
    SearchProblem,
)


def commit_verdict(ev: Evidence) -> Outcome | None:
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


def known_bounds(n: int, verdicts: Mapping[int, Outcome]) -> tuple[int, int]:
    """(lo, hi): the highest good below the lowest bad; the ends are assumed when untested."""
    hi = min((i for i, v in verdicts.items() if v == "bad" and i >= 1), default=n)
    lo = max((i for i, v in verdicts.items() if v == "good" and i < hi), default=0)
    return lo, hi


def _end_problem(n: int, verdicts: Mapping[int, Outcome], check: bool) -> tuple[EndsWrong | None, list[int]]:
    """A contradicted end (or one that cannot be tested), else the ends still to test, bad first."""
    untested: list[int] = []
    ends: tuple[tuple[int, Literal["good", "bad"], Outcome], ...] = ((n, "bad", "bad"), (0, "good", "good"))
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


def decide_exact(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    """The next step for commit-level verdicts: the ends first (bad end first), then the pivots."""
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
        pivot = None
        if problem.slots == 1:
            pivot = _cheapest_pivot(problem, evidence, lo, hi, untested)
            if pivot is None and problem.weights is not None:
                pivot = weighted_pivot(lo, hi, untested, problem.weights)
        queries += [pivot] if pivot is not None else spread_picks(lo, hi, untested, spare)
    if queries:
        return Next(tuple(Query(i) for i in queries))
    tested = float(len(verdicts))
    if hi - lo == 1:
        return Found(hi, figures={"tested": tested})
    return Narrowed(lo, hi, figures={"tested": tested})


def _cheapest_pivot(problem: SearchProblem, evidence: Mapping[int, Evidence], lo: int, hi: int,
                    untested: list[int]) -> int | None:
    """The least-expected-cost pivot when full builds cost more than overlays, else None (midpoint)."""
    groups = problem.build_groups
    if groups is None or problem.build_cost <= problem.overlay_cost:
        return None
    return cheapest_pivot(lo, hi, tuple(untested), tuple(groups[i] for i in (lo, *untested, hi)),
                          built_groups(problem, evidence), problem.build_cost, problem.overlay_cost)


def weighted_pivot(lo: int, hi: int, untested: list[int], weights: tuple[int, ...]) -> int:
    """The untested position p whose answer leaves the least weight in the worse case: bad keeps
    (lo, p], good keeps (p, hi]. Ties go to the position nearer the midpoint, then the lower one,
    so equal weights pick what the midpoint bisection picks."""
    below = 0  # weight of (lo, p]
    before: dict[int, int] = {}
    for position in range(lo + 1, hi + 1):
        below += weights[position]
        before[position] = below
    total = below
    return max(untested, key=lambda p: (min(before[p], total - before[p]), -abs(2 * p - lo - hi), -p))


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
