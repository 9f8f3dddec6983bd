"""Exact mode's pivot when builds cost different amounts: the least expected cost, not the midpoint.

On vllm-ascend about one commit in 17 changes what is compiled, so a range falls into a few
build groups: the first commit tested in a group pays a full build (``build_cost``, in steps),
the rest of the group only a python overlay (``overlay_cost``). The midpoint ignores that and
often lands in a group nobody has built. Here the pivot minimises the expected cost of the
whole remaining search, culprit uniform over (lo, hi], by dynamic programming over the
sub-ranges a search can reach: cost(a, b) = min over pivots k in (a, b) of
step(k) + P(culprit <= k) cost(a, k) + P(culprit > k) cost(k, b), where step(k) is one step
plus its build. Inside (a, b) a group counts as built when it is built already or holds a or b
(the pivots that led there), which is exact while groups are contiguous runs of commits, as
keys are on a linear history (a revert that restores an older key makes it an estimate).

The table has O(m^2) entries of O(m) choices for m untested candidates, so above
``MAX_CANDIDATES`` the caller keeps the midpoint until the range is small enough (at most a
step or two, and the expensive part of a range is its end: few groups, many overlays). Ties go
to the pivot nearest the middle, so a range of one group bisects exactly as plain bisection.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

MAX_CANDIDATES = 300
_TIE = 1e-9  # far below any real cost difference: only breaks exact ties, towards the middle


@lru_cache(maxsize=4096)
def cheapest_pivot(lo: int, hi: int, untested: tuple[int, ...], groups: tuple[int, ...],
                   built: frozenset[int], build_cost: float, overlay_cost: float) -> int | None:
    """The pivot in ``untested`` (sorted, inside (lo, hi)) with the least expected search cost.

    ``groups`` holds the build group of lo, of each untested position, then of hi; ``built``
    the groups built already. None when the midpoint is as good (one group only) or the range
    is too large for the table.
    """
    if not untested or len(untested) > MAX_CANDIDATES or len(set(groups[1:-1])) < 2:
        return None
    points = np.array((lo, *untested, hi), dtype=float)
    group = np.array(groups)
    built_before = np.isin(group, list(built))
    size = len(points)
    expected = np.zeros((size, size))
    choice = np.zeros((size, size), dtype=int)
    for width in range(2, size):
        a = np.arange(size - width)
        b = a + width
        k = a[:, None] + np.arange(1, width)[None, :]
        has_image = built_before[k] | (group[k] == group[a][:, None]) | (group[k] == group[b][:, None])
        step = 1.0 + np.where(has_image, overlay_cost, build_cost)
        span = (points[b] - points[a])[:, None]
        left = (points[k] - points[a][:, None]) / span
        total = step + left * expected[a[:, None], k] + (1.0 - left) * expected[k, b[:, None]]
        total += _TIE * np.abs(points[k] - (points[a] + points[b])[:, None] / 2) / span
        best = np.argmin(total, axis=1)
        rows = np.arange(len(a))
        expected[a, b] = total[rows, best]
        choice[a, b] = k[rows, best]
    return int(points[choice[0, size - 1]])
