"""Exact mode with build groups: the pivot of least expected cost (bisect_npu/search/costs.py)."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.search import Decision, Evidence, Found, Narrowed, Next, Query, SearchProblem, decide

ENDS_TESTED = {0: Evidence(good=1)}


def contiguous_groups(n: int, changes: list[int]) -> tuple[int, ...]:
    """Group ids of positions 0..n on a linear history: a new key at each change position."""
    return tuple(sum(1 for c in changes if c <= i) for i in range(n + 1))


def search_cost(problem: SearchProblem, culprit: int,
                skipped: frozenset[int] = frozenset()) -> tuple[float, Decision, list[int]]:
    """Drive exact mode to its answer with a perfect oracle; the cost of its steps after the ends."""
    groups = problem.build_groups or tuple(range(problem.n + 1))
    evidence = {**ENDS_TESTED, problem.n: Evidence(bad=1)}
    built = {groups[0], groups[problem.n], *problem.prebuilt_groups}
    cost, asked = 0.0, []
    while True:
        decision = decide(problem, evidence)
        if not isinstance(decision, Next):
            return cost, decision, asked
        (query,) = decision.queries
        x = query.index
        asked.append(x)
        if x in skipped:
            evidence[x] = Evidence(skipped=True)
            continue
        cost += 1 + (problem.overlay_cost if groups[x] in built else problem.build_cost)
        built.add(groups[x])
        evidence[x] = Evidence(bad=1) if x >= culprit else Evidence(good=1)


def optimum(groups: tuple[int, ...], build: float, overlay: float, prebuilt: frozenset[int] = frozenset()) -> float:
    """Brute force: the least expected cost of any search strategy, the built set tracked along
    each path (no contiguity assumed), culprit uniform over 1..n, the ends tested, the
    ``prebuilt`` groups' images there from the start."""
    n = len(groups) - 1

    @cache
    def best(lo: int, hi: int, built: frozenset[int]) -> float:
        if hi - lo == 1:
            return 0.0
        costs = []
        for x in range(lo + 1, hi):
            step = 1 + (overlay if groups[x] in built else build)
            now = built | {groups[x]}
            left = (x - lo) / (hi - lo)
            costs.append(step + left * best(lo, x, now) + (1 - left) * best(x, hi, now))
        return min(costs)

    return best(0, n, frozenset({groups[0], groups[n]}) | prebuilt)


@st.composite
def layouts(draw: st.DrawFn, max_n: int = 9) -> tuple[int, tuple[int, ...]]:
    n = draw(st.integers(2, max_n))
    changes = draw(st.lists(st.integers(1, n), max_size=4, unique=True))
    return n, contiguous_groups(n, changes)


@settings(max_examples=60, deadline=None)
@given(layouts(), st.floats(0.5, 20), st.floats(0, 0.5))
def test_expected_cost_is_the_brute_force_optimum_on_a_linear_history(layout, build, overlay) -> None:
    n, groups = layout
    problem = SearchProblem(n=n, build_groups=groups, build_cost=build, overlay_cost=overlay)
    mean = sum(search_cost(problem, c)[0] for c in range(1, n + 1)) / n
    assert abs(mean - optimum(groups, build, overlay)) < 1e-6


@settings(max_examples=60, deadline=None)
@given(layouts(), st.data(), st.floats(0.5, 20), st.floats(0, 0.5))
def test_images_from_an_earlier_session_are_priced_as_built(layout, data, build, overlay) -> None:
    n, groups = layout
    prebuilt = data.draw(st.frozensets(st.sampled_from(sorted(set(groups)))))
    problem = SearchProblem(n=n, build_groups=groups, build_cost=build, overlay_cost=overlay, prebuilt_groups=prebuilt)
    mean = sum(search_cost(problem, c)[0] for c in range(1, n + 1)) / n
    assert abs(mean - optimum(groups, build, overlay, prebuilt)) < 1e-6


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 40).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.integers(0, 3), min_size=n + 1, max_size=n + 1),  # any layout, reverts included
    st.integers(1, n),
    st.frozensets(st.integers(1, n - 1), max_size=5),
)), st.floats(0, 30), st.floats(0, 3))
def test_always_answers_right_and_never_asks_twice(case, build, overlay) -> None:
    n, groups, culprit, skipped = case
    problem = SearchProblem(n=n, build_groups=tuple(groups), build_cost=build, overlay_cost=overlay)
    _, answer, asked = search_cost(problem, culprit, skipped - {culprit})
    assert len(asked) == len(set(asked))
    if isinstance(answer, Found):
        assert answer.index == culprit
    else:
        assert isinstance(answer, Narrowed) and answer.lo < culprit <= answer.hi
        assert all(i in skipped for i in range(answer.lo + 1, answer.hi))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 300), st.data())
def test_one_group_or_no_build_premium_bisects_at_the_midpoint(n, data) -> None:
    culprit = data.draw(st.integers(1, n))
    plain = search_cost(SearchProblem(n=n), culprit)[2]
    one_group = SearchProblem(n=n, build_groups=(0,) * (n + 1), build_cost=9.0)
    premium_free = SearchProblem(n=n, build_groups=contiguous_groups(n, [n // 3, n // 2]), build_cost=1.0,
                                 overlay_cost=1.0)
    assert search_cost(one_group, culprit)[2] == plain
    assert search_cost(premium_free, culprit)[2] == plain


def test_a_built_group_draws_the_pivot_off_an_unbuilt_midpoint() -> None:
    # 0..11 share the good end's image, 12..15 a key of their own, 16 the bad end's: the midpoint
    # 8 needs no build, so it stays; once 8 is good, (8, 16] has its midpoint 12 in an unbuilt
    # group and an overlay at 11 is the cheaper way to cut.
    groups = contiguous_groups(16, [12, 16])
    problem = SearchProblem(n=16, build_groups=groups, build_cost=10.0, overlay_cost=0.1)
    evidence = {**ENDS_TESTED, 16: Evidence(bad=1)}
    assert decide(problem, evidence) == Next((Query(8),))
    evidence[8] = Evidence(good=1)
    plain = decide(SearchProblem(n=16), evidence)
    assert plain == Next((Query(12),))
    assert decide(problem, evidence) == Next((Query(11),))


def test_an_image_from_an_earlier_session_draws_the_pivot_to_its_group() -> None:
    # Only the ends' images: the search cuts at 3, the last commit on the good end's image, and
    # leaves the two unbuilt groups for later. With the image of 12..15 kept from an earlier
    # session a cut at 12 costs an overlay too, and it splits the range nearer the middle.
    groups = contiguous_groups(16, [4, 12, 16])
    evidence = {**ENDS_TESTED, 16: Evidence(bad=1)}
    fresh = SearchProblem(n=16, build_groups=groups, build_cost=10.0, overlay_cost=0.1)
    kept = SearchProblem(n=16, build_groups=groups, build_cost=10.0, overlay_cost=0.1, prebuilt_groups=frozenset({2}))
    assert decide(fresh, evidence) == Next((Query(3),))
    assert decide(kept, evidence) == Next((Query(12),))
    with pytest.raises(ValueError, match="prebuilt_groups"):
        decide(SearchProblem(n=16, prebuilt_groups=frozenset({2})), evidence)


def test_costs_less_than_the_midpoint_over_a_vllm_ascend_sized_range() -> None:
    # 176 candidates, a new compiled key every ~17 commits, a full build six steps long.
    groups = contiguous_groups(176, list(range(9, 176, 17)))
    aware = SearchProblem(n=176, build_groups=groups, build_cost=6.0, overlay_cost=0.2)
    blind = SearchProblem(n=176)
    cost_aware = sum(search_cost(aware, c)[0] for c in range(1, 177)) / 176
    blind_costs = []
    for culprit in range(1, 177):
        built = {groups[0], groups[176]}
        total = 0.0
        for x in search_cost(blind, culprit)[2]:
            total += 1 + (0.2 if groups[x] in built else 6.0)
            built.add(groups[x])
        blind_costs.append(total)
    assert cost_aware < 0.95 * sum(blind_costs) / 176
