"""The answer of a search that leans to one commit below the confidence asked: the credible range
around that best guess.

A search that has spent every step it may take (each telling position at its cap, or skipped)
can still lean to one commit without the confidence asked. Naming it as the culprit would say
"found" for an answer the search itself holds, say, 80% sure: a job that reads "found" as the
answer files the wrong commit one time in five. The answer is instead the narrowest run of
blocks around the best guess whose posterior reaches the confidence (a `Narrowed`), with the
best guess and its own posterior in its figures: "found" then means the confidence was reached.
The three searches that weigh their steps (likelihood, noisy, levels) share the rule.
"""

from __future__ import annotations

import numpy as np

from bisect_npu.search.types import Narrowed


def credible_range(blocks: np.ndarray, block_mass: np.ndarray, best: int, confidence: float) -> tuple[int, int, float]:
    """The range (lo, hi] of the blocks grown from ``best`` one neighbour at a time, the one of
    more posterior first, until they hold ``confidence`` (or the whole history), and its mass.
    ``blocks``: each position 1..n's block id (consecutive from 0), ``block_mass``: each block's
    posterior."""
    first = last = best
    mass = float(block_mass[best])
    while mass < confidence and (first > 0 or last < len(block_mass) - 1):
        below = float(block_mass[first - 1]) if first > 0 else -1.0
        above = float(block_mass[last + 1]) if last < len(block_mass) - 1 else -1.0
        if above > below:
            last, mass = last + 1, mass + above
        else:
            first, mass = first - 1, mass + below
    members = np.flatnonzero((blocks >= first) & (blocks <= last)) + 1
    return int(members[0]) - 1, int(members[-1]), min(mass, 1.0)


def best_guess(blocks: np.ndarray, block_mass: np.ndarray, best: int, confidence: float,
               figures: dict[str, float]) -> Narrowed:
    """The credible range around the single commit of block ``best`` (held below ``confidence``),
    the commit in ``best_guess`` and the range's own posterior in ``range_posterior`` beside the
    answer's ``figures`` (its ``posterior``: the best guess's)."""
    guess = int(np.flatnonzero(blocks == best)[-1]) + 1
    lo, hi, mass = credible_range(blocks, block_mass, best, confidence)
    return Narrowed(lo, hi, figures={**figures, "best_guess": float(guess), "range_posterior": mass})
