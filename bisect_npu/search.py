"""Choosing the next commit to test: a pure function of the evidence so far.

Positions: 0 is the good end, ``n`` the bad end, candidates are 1..n (first-parent commits in
``(good, bad]``). The culprit is the first bad position. No I/O here: git, disk and the clock
belong to the caller, so the search is tested alone (tests/test_search*.py).

INTERFACE (used by session.py; implementation owned by the search work):

    decide(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision

A Decision is ``Next(queries)`` (run these; more than one only when ``problem.slots > 1``),
``Found(index, ...)``, ``Narrowed(lo, hi, ...)`` (skips hide the boundary: culprit in (lo, hi]),
or ``EndsWrong(which)`` (the good end judged bad, or the bad end judged good).
"""

from __future__ import annotations

from collections.abc import Mapping
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


@dataclass(frozen=True)
class SearchProblem:
    n: int
    mode: Literal["exact", "noisy"] = "exact"
    check_ends: bool = True
    slots: int = 1
    confidence: float = 0.99
    max_trials_per_query: int = 64


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


def decide(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    raise NotImplementedError("search implementation pending")
