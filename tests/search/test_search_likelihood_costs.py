"""Likelihood mode with build groups: the step of most information per cost (bisect_npu/search/costs.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.search import Evidence, Next, Query, SearchProblem, decide
from bisect_npu.search.costs import INFORMATION_FLOOR, most_information_per_cost
from bisect_npu.search.likelihood import MAX_STEPS


@st.composite
def searches(draw: st.DrawFn) -> tuple[SearchProblem, dict[int, Evidence]]:
    """A likelihood problem with random groups and costs, its ends tested, and random steps inside."""
    n = draw(st.integers(3, 40))
    changes = draw(st.lists(st.integers(1, n), max_size=6))
    groups = tuple(sum(1 for c in changes if c <= i) for i in range(n + 1))
    problem = SearchProblem(n=n, mode="likelihood", confidence=draw(st.sampled_from([0.9, 0.99])),
                            build_groups=groups, build_cost=draw(st.floats(0.0, 20.0)),
                            overlay_cost=draw(st.floats(0.0, 2.0)),
                            prebuilt_groups=frozenset(draw(st.sets(st.sampled_from(sorted(set(groups)))))))
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    for x in draw(st.sets(st.integers(1, n - 1), max_size=8)):
        if draw(st.integers(0, 5)) == 0:
            evidence[x] = Evidence(skipped=True)
            continue
        ev = Evidence()
        for _ in range(draw(st.integers(1, MAX_STEPS))):
            log_lr = draw(st.floats(-6.0, 6.0))
            ev = ev.add("bad" if log_lr > 0 else "good").weigh(log_lr)
        evidence[x] = ev
    return problem, evidence


def plain(problem: SearchProblem) -> SearchProblem:
    return replace(problem, build_groups=None, build_cost=0.0, overlay_cost=0.0, prebuilt_groups=frozenset())


@given(searches())
@settings(max_examples=200, deadline=None)
def test_with_equal_costs_the_pick_is_the_posteriors_median(search: tuple[SearchProblem, dict[int, Evidence]]) -> None:
    problem, evidence = search
    free = replace(problem, build_cost=0.0, overlay_cost=0.0)
    all_built = replace(problem, overlay_cost=0.0, prebuilt_groups=frozenset(problem.build_groups or ()))
    assert decide(free, evidence) == decide(plain(problem), evidence)
    assert decide(all_built, evidence) == decide(plain(problem), evidence)


@given(searches())
@settings(max_examples=200, deadline=None)
def test_never_asks_a_position_it_cannot_and_the_answer_is_the_same(
        search: tuple[SearchProblem, dict[int, Evidence]]) -> None:
    problem, evidence = search
    decision = decide(problem, evidence)
    without = decide(plain(problem), evidence)
    if isinstance(decision, Next):
        (query,) = decision.queries
        ev = evidence.get(query.index, Evidence())
        assert 0 < query.index < problem.n
        assert not ev.skipped and ev.trials < MAX_STEPS
        assert isinstance(without, Next)
    else:
        assert decision == without  # the costs choose where to look, never what is concluded


@given(st.integers(4, 100), st.sampled_from([-1, 1]), st.floats(1.0, 50.0))
@settings(max_examples=100, deadline=None)
def test_a_built_neighbour_of_the_midpoint_is_taken_over_an_unbuilt_midpoint(half: int, side: int,
                                                                                build: float) -> None:
    """Only the ends tested: the posterior is uniform, its median (n / 2) unbuilt, its neighbour
    in a built group, which teaches nearly as much for an overlay instead of a build."""
    n, middle = 2 * half, half
    neighbour = middle + side
    problem = SearchProblem(n=n, mode="likelihood", build_groups=tuple(range(n + 1)), build_cost=build,
                            overlay_cost=0.1, prebuilt_groups=frozenset({neighbour}))
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    assert decide(plain(problem), evidence) == Next((Query(middle),))
    assert decide(problem, evidence) == Next((Query(neighbour),))


@given(st.integers(40, 200), st.floats(1.0, 50.0))
@settings(max_examples=50, deadline=None)
def test_a_built_commit_that_teaches_little_is_not_taken(n: int, build: float) -> None:
    """A built group at the range's edge: a step there would split the mass 1 : n-1, under the
    information floor, so the median is asked although it costs a build."""
    problem = SearchProblem(n=n, mode="likelihood", build_groups=tuple(range(n + 1)), build_cost=build,
                            overlay_cost=0.0, prebuilt_groups=frozenset({1}))
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    assert decide(problem, evidence) == decide(plain(problem), evidence)


@given(st.lists(st.floats(0.0, 1.0), min_size=3, max_size=30), st.data())
@settings(max_examples=200, deadline=None)
def test_the_pick_has_the_most_information_per_cost_among_those_close_enough(
        shares: list[float], data: st.DataObject) -> None:
    below = np.sort(np.array(shares))
    askable = sorted(data.draw(st.sets(st.integers(1, len(below)), min_size=1)))
    cost = np.array([data.draw(st.sampled_from([1.0, 1.5, 7.0])) for _ in range(len(below) + 1)])
    pick = most_information_per_cost(below, askable, cost)

    def entropy(p: float) -> float:
        p = min(max(p, 1e-12), 1 - 1e-12)
        return float(-(p * np.log(p) + (1 - p) * np.log1p(-p)))

    information = {x: entropy(float(below[x - 1])) for x in askable}
    close = [x for x in askable if information[x] >= INFORMATION_FLOOR * max(information.values())]
    if len({float(cost[x]) for x in close}) < 2:
        assert pick is None
        return
    assert pick in close
    best = max(information[x] / cost[x] for x in close)
    assert information[pick] / cost[pick] >= best * (1 - 1e-9)
