"""What a step costs when builds differ: build groups, exact mode's pivot of least expected cost,
and the likelihood search's pick of most information per cost.

On vllm-ascend about one commit in 17 changes what is compiled, so a range falls into a few
build groups: the first commit tested in a group pays a full build, the rest of the group only a
python overlay. The midpoint ignores that and often lands in a group nobody has built; here the
pivot minimises the expected cost of the whole remaining search, by dynamic programming over the
sub-ranges a search can reach (docs/design/search.md, "Build groups"). The Bayesian searches have
no range to plan over, so they weigh each position's expected information against what asking it
costs now (``build_costs``): the noisy search per trial batch, the likelihood search per step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from bisect_npu.search.types import Evidence, SearchProblem

# The table is O(m^3) for m untested candidates: above this the midpoint is kept until the range
# is small enough (a step or two; the expensive part of a range is its end: few groups, many overlays).
MAX_CANDIDATES = 300
_TIE = 1e-9  # far below any real cost difference: only breaks exact ties, towards the middle
# A cheaper step is taken only where it teaches at least this share of the most informative one:
# a search that always took the best ratio would walk a built group commit by commit, each step
# cheap and nearly useless. Tuned on bench/pivot_bench.py's tuning seeds (docs/design/search.md).
INFORMATION_FLOOR = 0.5


def group_ids(keys: Sequence[str]) -> tuple[int, ...]:
    """Build keys as small integers for ``SearchProblem.build_groups``: one id per distinct key."""
    ids: dict[str, int] = {}
    return tuple(ids.setdefault(key, len(ids)) for key in keys)


def built_groups(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> frozenset[int]:
    """The build groups whose image exists: built before the search, or holding a tested
    position. Their other positions need only an overlay.

    A position that was only skipped does not count: its build may be what failed."""
    groups = problem.build_groups or ()
    return problem.prebuilt_groups | {groups[i] for i, ev in evidence.items() if ev.trials}


def build_costs(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> np.ndarray:
    """What asking each position 0..n costs before its runs: a full build where its group has no
    image, an overlay where it has, nothing where the position was asked already (its own image
    exists, or its build failed and it is not asked again)."""
    cost = np.full(problem.n + 1, problem.build_cost)
    if problem.build_groups is not None:
        built = np.isin(np.array(problem.build_groups), list(built_groups(problem, evidence)))
        cost[built] = problem.overlay_cost
    for i, ev in evidence.items():
        if ev.trials or ev.skipped:
            cost[i] = 0.0
    return cost


def _binary_entropy(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    entropy: np.ndarray = -(p * np.log(p) + (1 - p) * np.log1p(-p))
    return entropy


def most_information_per_cost(below: np.ndarray, askable: Sequence[int], step_cost: np.ndarray) -> int | None:
    """The askable position whose step teaches the most about the culprit per unit of cost, among
    those teaching at least ``INFORMATION_FLOOR`` of the most any teaches; None when those all
    cost the same (the information alone then decides).

    ``below[x - 1]`` is P(c <= x) for x = 1..n-1, ``step_cost[x]`` what a step at x costs (a
    step, plus its build or overlay). A step is valued as if decisive, the entropy of c <= x
    against c > x, since its strength is unknown before it runs. Ties go to the position whose
    P(c <= x) is nearest 1/2, then the lower one.
    """
    if not askable:
        return None
    positions = np.array(askable)
    information = _binary_entropy(below[positions - 1])
    close = information >= INFORMATION_FLOOR * information.max()
    positions, information = positions[close], information[close]
    if len(set(step_cost[positions].tolist())) < 2:
        return None
    split = below[positions - 1]
    per_cost = information / step_cost[positions]
    order = np.lexsort((positions, np.abs(split - 0.5), -per_cost))
    return int(positions[order[0]])


@lru_cache(maxsize=4096)
def cheapest_pivot(lo: int, hi: int, untested: tuple[int, ...], groups: tuple[int, ...],
                   built: frozenset[int], build_cost: float, overlay_cost: float) -> int | None:
    """The pivot in ``untested`` (sorted, inside (lo, hi)) with the least expected search cost.

    ``groups`` holds the build group of lo, of each untested position, then of hi; ``built``
    the groups built already. None when the midpoint is as good (one group only) or the range
    is too large for the table.

    cost(a, b) = min over k in (a, b) of step(k) + P(c <= k) cost(a, k) + P(c > k) cost(k, b), the
    culprit c uniform over (a, b], step(k) one step plus a build, or an overlay where k's group
    is built, holds a or b (the pivots that led there). Ties go to the pivot nearest the middle.
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
