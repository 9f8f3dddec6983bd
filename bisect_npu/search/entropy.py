"""Shannon entropy in nats, the measure the Bayesian searches and the cost-aware rounds all weigh
their queries by: one definition, so 0 log 0 and a probability off by rounding read the same in each."""

from __future__ import annotations

import numpy as np


def plogp(p: np.ndarray) -> np.ndarray:
    """-p log p, element by element: 0 at p = 0, and p clipped to [0, 1] first (a probability
    rounding left just outside, such as 1 less a cumulative sum just over 1)."""
    p = np.clip(p, 0.0, 1.0)
    terms: np.ndarray = -p * np.log(np.where(p > 0, p, 1.0))
    return terms


def entropy(p: np.ndarray) -> np.ndarray:
    """The entropy of each distribution along the last axis."""
    total: np.ndarray = plogp(p).sum(axis=-1)
    return total
