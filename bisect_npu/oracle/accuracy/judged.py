"""The candidates a search has already judged, as evidence about each sample's rate at a side.

A sample's rate at the good side is one rate for every commit on that side, and the same at the
bad side, so a candidate judged bad ran more runs of the bad side's rates, one judged good more
of the good side's. The ends' runs alone place a sample's two rates (`stats.side_rates`); a rate
they misplaced (a good end's 4 of 4 on a sample whose rate is 0.5) misleads every step that runs
the sample, at the same odds each time, while the search multiplies the steps' ratios as
independent. The judged candidates' runs, pooled onto the ends' for the side rates, count that
rate's error once over the search instead.

A judged side is not certain: its runs are weighed by how sure the candidate's own steps made it
(`side_weight`: nothing at even odds, all of them only as the odds grow without bound), so a
wrong step lends its runs to the wrong side only as far as it was sure, and a step that runs the
same samples next is not read as surer than the first one's own evidence. Only steps that ended
clear count (a verdict forced at the end of its plan is a lean, not a side), and only verdicts
that agree on one change point: a good verdict above a bad one leaves both out.

Both a session (`orchestration/running/accuracy.py`, which keeps them across a resume from the
journal) and the accuracy bench keep a `JudgedCandidates` and ask it for each step's `JudgedRuns`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bisect_npu.observations import SampleOutcome, Verdict, VerdictKind

# (correct, wrong) runs of a sample, weighed: fractional where a side is not certain.
Counts = tuple[float, float]


def side_weight(log_lr: float) -> float:
    """The weight of a judged candidate's runs on its side: P(that side) - P(the other) given its
    steps' summed log likelihood ratio at even odds, tanh(|ratio| / 2). A step that stopped on the
    steering bound (odds about 5 to 1) lends two thirds of its runs, one at the answer's bound
    nearly all; none at even odds."""
    return math.tanh(abs(log_lr) / 2)


@dataclass(frozen=True)
class JudgedRuns:
    """Per sample id, the weighed (correct, wrong) runs of the other candidates judged on each
    side, to add to the ends' runs where a step's side rates are read."""

    good: dict[str, Counts] = field(default_factory=dict)
    bad: dict[str, Counts] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.good or self.bad)

    def added(self, side: str, sample_id: str, counts: Counts) -> Counts:
        """An end's (correct, wrong) runs of a sample with this side's judged runs added."""
        extra = (self.good if side == "good" else self.bad).get(sample_id)
        if extra is None:
            return counts
        return counts[0] + extra[0], counts[1] + extra[1]


@dataclass
class _Candidate:
    """One candidate's runs over all its steps, its last step's side and whether it ended clear,
    and its steps' summed log likelihood ratio."""

    runs: dict[str, tuple[int, int]] = field(default_factory=dict)
    kind: VerdictKind = VerdictKind.SKIP
    clear: bool = False
    log_lr: float = 0.0


# Weighed counts are rounded here: the side rates are cached by counts, and a thousandth of a run
# moves no rate.
_DIGITS = 3


@dataclass
class JudgedCandidates:
    """The candidates judged so far by their position in the history (0 the good end's)."""

    candidates: dict[int, _Candidate] = field(default_factory=dict)

    def record(self, position: int, verdict: Verdict, samples: Sequence[SampleOutcome]) -> None:
        """A candidate's finished step at `position`: its runs (`samples`, the step's rounds
        pooled) join its earlier steps', its verdict is its side from now on. A skipped step
        adds nothing."""
        if verdict.kind == VerdictKind.SKIP:
            return
        candidate = self.candidates.setdefault(position, _Candidate())
        for s in samples:
            k = round(s.correct * s.runs)
            before = candidate.runs.get(s.id, (0, 0))
            candidate.runs[s.id] = (before[0] + k, before[1] + s.runs - k)
        candidate.kind = verdict.kind
        candidate.clear = verdict.figures.get("stopped") == "clear"
        candidate.log_lr += float(verdict.figures.get("log_likelihood_ratio", 0.0))

    def runs_for(self, position: int) -> JudgedRuns:
        """The other candidates' runs a step at `position` conditions its side rates on: each clear
        verdict whose side its steps' summed ratio agrees with, where the verdicts agree on one
        change point, weighed by `side_weight`."""
        sided = {p: c for p, c in self.candidates.items() if p != position and c.clear
                 and (c.log_lr > 0 if c.kind == VerdictKind.BAD else c.log_lr < 0)}
        highest_good = max((p for p, c in sided.items() if c.kind == VerdictKind.GOOD), default=-math.inf)
        lowest_bad = min((p for p, c in sided.items() if c.kind == VerdictKind.BAD), default=math.inf)
        good: dict[str, list[float]] = {}
        bad: dict[str, list[float]] = {}
        for p, c in sorted(sided.items()):
            if p >= lowest_bad if c.kind == VerdictKind.GOOD else p <= highest_good:
                continue  # a good verdict above a bad one: both left out
            side = good if c.kind == VerdictKind.GOOD else bad
            weight = side_weight(c.log_lr)
            for sample_id, (k, wrong) in c.runs.items():
                total = side.setdefault(sample_id, [0.0, 0.0])
                total[0] += weight * k
                total[1] += weight * wrong
        return JudgedRuns({i: (round(k, _DIGITS), round(w, _DIGITS)) for i, (k, w) in good.items()},
                          {i: (round(k, _DIGITS), round(w, _DIGITS)) for i, (k, w) in bad.items()})
