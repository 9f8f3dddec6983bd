"""Whether the posteriors the answers were named at are the confidence they deliver.

Each culprit named with exit 0 comes with the posterior the search named it at: if that posterior
is calibrated, an answer named at p is wrong with chance 1 - p, and the wrong answers of a row
number about the sum of those chances. `reliability` bins the answers by posterior and counts the
answers, the wrong ones and the wrong ones expected in each bin and overall; `poisson_tail` says how
often chance alone would reach the wrong count seen given the expected one (a Poisson of that mean:
its tail is at least the exact sum-of-Bernoullis one's past the mean, so a small figure is
conservative evidence that the posteriors promise more than they deliver).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EDGES = (0.0, 0.99, 0.995, 0.999)  # bins' lower edges: below the confidence asked, then three above it


@dataclass(frozen=True)
class Bin:
    lo: float
    hi: float  # the bin holds lo <= posterior < hi; the last bin holds 1.0 too
    answers: int
    wrong: int
    expected: float  # the sum of 1 - posterior over the bin's answers


@dataclass(frozen=True)
class Reliability:
    answers: int
    wrong: int
    expected: float
    bins: tuple[Bin, ...]

    @property
    def p_value(self) -> float:
        """P(wrong >= the wrong seen) were the posteriors calibrated."""
        return poisson_tail(self.wrong, self.expected)

    def __add__(self, other: Reliability) -> Reliability:
        """Two rows pooled (the same bins)."""
        return Reliability(self.answers + other.answers, self.wrong + other.wrong, self.expected + other.expected,
                           tuple(Bin(a.lo, a.hi, a.answers + b.answers, a.wrong + b.wrong, a.expected + b.expected)
                                 for a, b in zip(self.bins, other.bins, strict=True)))


def reliability(answers: Iterable[tuple[float, bool]], edges: Sequence[float] = EDGES) -> Reliability:
    """Answers (posterior, wrong), one per culprit named with exit 0, binned at `edges` (lower edges)."""
    highs = (*edges[1:], 1.0)
    counts = [[0, 0, 0.0] for _ in edges]
    for posterior, wrong in answers:
        at = max(i for i, lo in enumerate(edges) if posterior >= lo or i == 0)
        counts[at][0] += 1
        counts[at][1] += bool(wrong)
        counts[at][2] += 1.0 - posterior
    bins = tuple(Bin(lo, hi, int(n), int(w), float(e)) for lo, hi, (n, w, e) in zip(edges, highs, counts, strict=True))
    return Reliability(sum(b.answers for b in bins), sum(b.wrong for b in bins), sum(b.expected for b in bins), bins)


def poisson_tail(observed: int, expected: float) -> float:
    """P(X >= observed) for X Poisson with mean `expected`; 1 when nothing wrong was seen."""
    if observed <= 0:
        return 1.0
    if expected <= 0:
        return 0.0
    below = sum(math.exp(-expected + k * math.log(expected) - math.lgamma(k + 1)) for k in range(observed))
    return max(0.0, 1.0 - below)


def p_label(p: float) -> str:
    """A tail probability as printed: three decimals, small ones in powers of ten."""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def bin_label(b: Bin) -> str:
    close = "]" if b.hi >= 1.0 else ")"
    return f"[{b.lo:g}, {b.hi:g}{close}"


def table_header(r: Reliability) -> list[str]:
    """The reliability table's two header lines: per bin, answers / wrong / wrong expected."""
    cells = " | ".join(f"{bin_label(b)}: answers / wrong / expected" for b in r.bins)
    return [f"| row | {cells} | all: answers / wrong / expected | P(wrong >= seen) |",
            "|---|" + "---:|" * (len(r.bins) + 2)]


def table_row(name: str, r: Reliability) -> str:
    cells = " | ".join(f"{b.answers} / {b.wrong} / {b.expected:.2f}" for b in r.bins)
    return f"| {name} | {cells} | {r.answers} / {r.wrong} / {r.expected:.2f} | {p_label(r.p_value)} |"
