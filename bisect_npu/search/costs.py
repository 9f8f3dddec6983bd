"""What a step costs when builds differ: build groups, exact mode's pivot of least expected cost,
and the likelihood search's round of most information per cost.

On vllm-ascend about one commit in 17 changes what is compiled, so a range falls into a few
build groups: the first commit tested in a group pays a full build, the rest of the group only a
python overlay. The midpoint ignores that and often lands in a group nobody has built; here the
pivot minimises the expected cost of the whole remaining search, by dynamic programming over the
sub-ranges a search can reach (docs/design/search.md, "Build groups"). The Bayesian searches have
no range to plan over, so they weigh each position's expected information against what asking it
costs now (``build_costs``): the noisy search per trial batch, the likelihood search per round of
steps (one per slot).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from bisect_npu.search.entropy import plogp
from bisect_npu.search.types import Evidence, SearchProblem

# The table is O(m^3) for m untested candidates: above this the midpoint is kept until the range
# is small enough (a step or two; the expensive part of a range is its end: few groups, many overlays).
MAX_CANDIDATES = 300
_TIE = 1e-9  # far below any real cost difference: only breaks exact ties, towards the middle
# A cheaper step is taken only where it teaches at least this share of the most informative one:
# a search that always took the best ratio would walk a built group commit by commit, each step
# cheap and nearly useless. Tuned on bench/pivot_bench.py's tuning seeds (docs/design/search.md).
INFORMATION_FLOOR = 0.5
# Above MAX_CANDIDATES askable positions a round is chosen among the positions nearest this many
# evenly spaced quantiles of the posterior, for each step price (its table is O(m^2) a pick).
QUANTILE_GRID = 100


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


@dataclass(frozen=True)
class StepCosts:
    """What a step at each position 0..n costs in one round, in the search's unit: ``alone`` where
    no other pick of the round shares its build group, ``beside`` where the pick below it in the
    round does (that pick's build makes the image, so this one pays an overlay: the builder builds
    a key once, the other slots wait for it). ``groups`` the positions' build groups (None: each
    its own)."""

    alone: np.ndarray
    beside: np.ndarray
    groups: np.ndarray | None


def step_costs(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> StepCosts:
    """One step plus its build, its overlay or nothing (``build_costs``) at each position."""
    readying = build_costs(problem, evidence)
    if problem.build_groups is None:
        return StepCosts(1.0 + readying, 1.0 + readying, None)
    return StepCosts(1.0 + readying, 1.0 + np.minimum(readying, problem.overlay_cost), np.array(problem.build_groups))


def most_information_per_cost(below: np.ndarray, askable: Sequence[int], costs: StepCosts,
                              count: int = 1) -> tuple[int, ...] | None:
    """The round of ``count`` askable positions (all of them where fewer) that teaches the most
    about the culprit per unit of cost, among the rounds teaching at least ``INFORMATION_FLOOR`` of
    the most such a round teaches; None when those all cost the same (the information alone then
    decides: the posterior's median or quantiles). Sorted.

    ``below[x - 1]`` is P(c <= x) for x = 1..n-1. Steps are valued as if decisive, since their
    strength is unknown before they run: a round x_1 < ... < x_k teaches the entropy of which of
    the k + 1 ranges c <= x_1, x_1 < c <= x_2, ..., c > x_k holds the culprit (one pick: c <= x
    against c > x), and costs the sum of its steps (``costs``). For each mix of step prices a
    dynamic program over the picks in order finds the most informative round of that price, which
    is exact while build groups are contiguous runs of commits, as build keys are on a linear
    history; the best ratio over the mixes wins. Ties go to the more informative round (with one
    pick: P(c <= x) nearest 1/2), then the lower positions.
    """
    positions = np.array(sorted(askable), dtype=int)
    picks = min(count, len(positions))
    if len(positions) > MAX_CANDIDATES:
        positions = _thinned(positions, below[positions - 1], costs.alone[positions])
    prices = sorted(set(costs.alone[positions].tolist()) | set(costs.beside[positions].tolist()))
    if picks == 0 or len(prices) < 2:
        return None
    rounds = _most_informative_rounds(np.concatenate(([0.0], below[positions - 1])),
                                      np.searchsorted(prices, costs.alone[positions]),
                                      np.searchsorted(prices, costs.beside[positions]),
                                      None if costs.groups is None else costs.groups[positions], len(prices), picks)
    information = {mix: value for mix, (value, _) in rounds.items()}
    most = max(information.values())
    close = [mix for mix, value in information.items() if value >= INFORMATION_FLOOR * most]
    price = {mix: float(np.dot(mix, prices)) for mix in close}
    if len(set(price.values())) < 2:
        return None
    best = min(close, key=lambda mix: (-information[mix] / price[mix], -information[mix], rounds[mix][1]))
    return tuple(int(positions[b - 1]) for b in rounds[best][1])


def _thinned(positions: np.ndarray, below: np.ndarray, price: np.ndarray) -> np.ndarray:
    """For each of ``QUANTILE_GRID`` - 1 evenly spaced quantiles and each step price, the position
    of that price whose P(c <= x) is nearest it (the lower on a tie). 1/2 is on the grid, so one
    pick loses nothing (the best of a price is the one nearest 1/2); several land within a grid
    step of their best."""
    targets = np.arange(1, QUANTILE_GRID) / QUANTILE_GRID
    kept: set[int] = set()
    for value in np.unique(price):
        ours = positions[price == value]
        cdf = below[price == value]
        right = np.clip(np.searchsorted(cdf, targets), 0, len(ours) - 1)
        left = np.clip(right - 1, 0, len(ours) - 1)
        nearer = np.where(np.abs(cdf[left] - targets) <= np.abs(cdf[right] - targets), left, right)
        kept.update(ours[nearer].tolist())
    return np.array(sorted(kept), dtype=int)


def _most_informative_rounds(cdf: np.ndarray, alone: np.ndarray, beside: np.ndarray, groups: np.ndarray | None,
                             kinds: int, picks: int) -> dict[tuple[int, ...], tuple[float, tuple[int, ...]]]:
    """For each mix of step prices (how many picks pay each price) a round of ``picks`` can have:
    its most informative round, (entropy, picks as indices 1..m into ``cdf``).

    ``cdf[b]`` is P(c <= the b-th askable position), ``cdf[0]`` = 0; ``alone[b - 1]`` and
    ``beside[b - 1]`` index the price of the b-th position's step without and with the pick below
    it in its build group. best[mix][b]: the most entropy of the ranges below a round whose highest
    pick is b; each pick adds the range between it and the pick below, the last the range above."""
    size = len(cdf)
    later = np.arange(size)[:, None] < np.arange(size)[None, :]
    step = np.where(later, plogp(cdf[None, :] - cdf[:, None]), -np.inf)  # [a, b]: the range (a, b]
    step[:, 0] = -np.inf
    same = np.zeros((size, size), dtype=bool)
    if groups is not None:
        same[1:, 1:] = groups[:, None] == groups[None, :]
    price_of = np.concatenate(([0], alone)), np.concatenate(([0], beside))
    start = np.full(size, -np.inf)
    start[0] = 0.0
    layer: dict[tuple[int, ...], np.ndarray] = {(0,) * kinds: start}
    back: list[dict[tuple[int, ...], np.ndarray]] = []
    columns = np.arange(size)
    for _ in range(picks):
        grown: dict[tuple[int, ...], np.ndarray] = {}
        came: dict[tuple[int, ...], np.ndarray] = {}
        for mix, best in layer.items():
            through = best[:, None] + step
            for shared, kind_of in ((False, price_of[0]), (True, price_of[1])):
                options = np.where(same == shared, through, -np.inf)
                previous = options.argmax(axis=0)
                value = options[previous, columns]
                for kind in np.unique(kind_of[np.isfinite(value)]):
                    target = tuple(count + (i == kind) for i, count in enumerate(mix))
                    held = grown.setdefault(target, np.full(size, -np.inf))
                    origin = came.setdefault(target, np.zeros(size, dtype=int))
                    better = (kind_of == kind) & (value > held)
                    held[better], origin[better] = value[better], previous[better]
        layer = grown
        back.append(came)
    rounds: dict[tuple[int, ...], tuple[float, tuple[int, ...]]] = {}
    for mix, best in layer.items():
        total = best + plogp(1.0 - cdf)
        b = int(np.argmax(total))
        chosen: list[int] = []
        current = mix
        for came in reversed(back):
            a = int(came[current][b])
            kind = price_of[1][b] if same[a, b] else price_of[0][b]
            chosen.append(b)
            current = tuple(count - (i == kind) for i, count in enumerate(current))
            b = a
        rounds[mix] = (float(total.max()), tuple(reversed(chosen)))
    return rounds


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
