"""Choosing the next commit to test: a pure function of the evidence so far.

Positions: 0 is the good end, ``n`` the bad end, candidates are 1..n (first-parent commits in
``(good, bad]``). The culprit is the first bad position. No I/O here: git, disk and the clock
belong to the caller, so the search is tested alone (tests/test_search*.py), and a resumed
session that rebuilds the evidence from its journal gets exactly the decision an uninterrupted
one would have got.

A Decision is ``Next(queries)`` (run these; more than one only when ``problem.slots > 1``; each
query takes one slot and runs its ``trials`` there), ``Found(index, ...)``, ``Narrowed(lo, hi,
...)`` (skips hide the boundary: culprit in (lo, hi]), or ``EndsWrong(which)`` (the good end
judged bad, or the bad end judged good). Four modes: ``exact`` (exact.py, one verdict per commit),
``noisy`` (noisy.py, trial counts), ``likelihood`` (likelihood.py, each step's likelihood ratio,
from the accuracy oracle or a throughput step stopped when sure) and ``levels`` (two_levels.py,
every measured run at once: one change between two levels, a fix's rise read mirrored by rising.py);
docs/design/search.md describes them.
"""

from __future__ import annotations

from collections.abc import Mapping

from bisect_npu.search.costs import group_ids
from bisect_npu.search.exact import decide_exact
from bisect_npu.search.likelihood import decide_likelihood
from bisect_npu.search.noisy import decide_noisy
from bisect_npu.search.rising import decide_rising
from bisect_npu.search.two_levels import decide_levels
from bisect_npu.search.types import (
    NO_EARLIER,
    Decision,
    EarlierLevels,
    EarlierRuns,
    EndsWrong,
    Evidence,
    Found,
    Narrowed,
    Next,
    Outcome,
    Query,
    SearchProblem,
    Weight,
    rests_on,
    validate,
)

__all__ = [
    "NO_EARLIER",
    "Decision",
    "EarlierLevels",
    "EarlierRuns",
    "EndsWrong",
    "Evidence",
    "Found",
    "Narrowed",
    "Next",
    "Outcome",
    "Query",
    "SearchProblem",
    "Weight",
    "decide",
    "group_ids",
    "rests_on",
]


def decide(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    """The next step of the search for this evidence (same inputs, same decision)."""
    validate(problem, evidence)
    if problem.mode == "noisy":
        return decide_noisy(problem, evidence)
    if problem.mode == "likelihood":
        return decide_likelihood(problem, evidence)
    if problem.mode == "levels":
        return decide_rising(problem, evidence) if problem.rising else decide_levels(problem, evidence)
    return decide_exact(problem, evidence)
