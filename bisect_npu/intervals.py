"""Confidence intervals for a rate of failing trials.

A leaf module (the standard library only) because two parts that must not import each other
use it: the stats oracle judges a commit by it, the noisy search reports its answer's rates
with it.
"""

from __future__ import annotations

import math
from statistics import NormalDist


def wilson_interval(bad: int, trials: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval for a binomial rate (sensible at 0 and at small n)."""
    if trials == 0:
        return 0.0, 1.0
    if bad == 0 or bad == trials:  # the closed form, without rounding noise at the boundary
        z = NormalDist().inv_cdf(0.5 + confidence / 2)
        edge = trials / (trials + z * z)
        return (0.0, 1 - edge) if bad == 0 else (edge, 1.0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = bad / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
