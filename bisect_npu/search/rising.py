"""The levels search of a rise: a fix search's throughput history, broken (low) at the old end and
restored (high) from the fix on.

The two-levels model (two_levels.py) puts the low level on the search's bad side, to the right of
the change. Under --find-fix the search's good side is the old end, which has the symptom: the low
level lies left of the change, and the fix is the first position at the high level. Read from the
new end, that history is a drop again, so the rise is searched as the drop it mirrors: positions
i -> n - i (the new end is the mirrored good end, whose runs draw the line the old end lies
under), each position's evidence and costs with it, and the mirrored answer mapped back; the
baseline and the earlier runs are given by level, not by side, so they pass as they are. One model
serves both directions; nothing of it is written twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Literal

from bisect_npu.search.two_levels import decide_levels
from bisect_npu.search.types import Decision, EndsWrong, Evidence, Found, Narrowed, Next, Query, SearchProblem

_SWAPPED: dict[str, Literal["good", "bad"]] = {"good": "bad", "bad": "good"}


def decide_rising(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    """`decide_levels` on the mirrored history (a rise read from the new end is a drop), its
    decision in this search's positions and terms."""
    return _back(problem.n, decide_levels(_mirrored_problem(problem), _mirrored_evidence(problem.n, evidence)))


def _mirrored_problem(problem: SearchProblem) -> SearchProblem:
    """The problem read from the new end: each position's build at n - i, the culprits' weights at
    n + 1 - c (a commit that changed the level is the mirrored culprit's child). The baseline and
    the earlier runs keep their levels (`SearchProblem`): (the new end's, the old end's) are the
    mirrored (good end's, bad end's) as they stand."""
    groups, weights = problem.build_groups, problem.weights
    return replace(problem, build_groups=None if groups is None else groups[::-1],
                   weights=None if weights is None else (weights[0], *weights[:0:-1]))


def _mirrored_evidence(n: int, evidence: Mapping[int, Evidence]) -> dict[int, Evidence]:
    """Each position's evidence at n - i, its good and bad counts swapped with the sides."""
    return {n - i: replace(ev, good=ev.bad, bad=ev.good) for i, ev in evidence.items()}


def _back(n: int, decision: Decision) -> Decision:
    """A decision on the mirrored history in the search's own positions: the mirrored culprit c
    (the first low position from the new end) is the fix n + 1 - c; a range (lo, hi] is
    (n - hi, n - lo]; the mirrored good end is the new end (the search's bad one)."""
    if isinstance(decision, Next):
        return Next(tuple(Query(n - q.index, q.trials) for q in decision.queries))
    if isinstance(decision, Found):
        return Found(n + 1 - decision.index, decision.confidence, _sides_swapped(n, decision.figures))
    if isinstance(decision, Narrowed):
        return Narrowed(n - decision.hi, n - decision.lo, _sides_swapped(n, decision.figures))
    return EndsWrong(_SWAPPED[decision.which], decision.figures)


def _sides_swapped(n: int, figures: dict[str, float]) -> dict[str, float]:
    """The answer's side means in the search's terms (the mirrored good side is the fixed one), and
    the culprit a range's runs disagree with (or its best guess) in its positions."""
    names = {"good_mean": "bad_mean", "bad_mean": "good_mean"}
    swapped = {names.get(name, name): value for name, value in figures.items()}
    for name in ("disagreeing_culprit", "best_guess"):  # a mirrored culprit c is the fix n + 1 - c
        if name in swapped:
            swapped[name] = n + 1 - swapped[name]
    return swapped
