"""Likelihood mode with build groups: the round of most information per cost, one slot or several
(bisect_npu/search/costs.py)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.search import Evidence, Next, Query, SearchProblem, decide
from bisect_npu.search.costs import INFORMATION_FLOOR, MAX_CANDIDATES, StepCosts, most_information_per_cost
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


@given(searches(), st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_with_equal_costs_the_picks_are_the_posteriors_quantiles(search: tuple[SearchProblem, dict[int, Evidence]],
                                                                  slots: int) -> None:
    """One slot: the median; several: the quantiles, as a search told nothing of builds."""
    problem, evidence = search
    problem = replace(problem, slots=slots)
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


def entropy_of_round(below: np.ndarray, picks: tuple[int, ...]) -> float:
    """What a round teaches if its steps are decisive: the entropy of the ranges its picks cut."""
    edges = [0.0, *(float(below[x - 1]) for x in sorted(picks)), 1.0]
    masses = [max(b - a, 0.0) for a, b in itertools.pairwise(edges)]
    return float(-sum(m * np.log(m) for m in masses if m > 0))


def price_of_round(costs: StepCosts, picks: tuple[int, ...]) -> float:
    """Each step alone, or beside an earlier pick of the round in its build group."""
    total, seen = 0.0, set()
    for x in sorted(picks):
        group = None if costs.groups is None else int(costs.groups[x])
        total += float(costs.beside[x] if group in seen else costs.alone[x])
        seen.add(group)
    return total


@st.composite
def rounds(draw: st.DrawFn) -> tuple[np.ndarray, list[int], StepCosts, int]:
    """A posterior's P(c <= x), askable positions, contiguous build groups some of which are built
    (the rest cost a build alone, an overlay beside a pick of the round), asked positions (a step
    only), and the slots."""
    below = np.sort(np.array(draw(st.lists(st.floats(0.001, 0.999), min_size=2, max_size=9))))
    n = len(below) + 1
    askable = sorted(draw(st.sets(st.integers(1, n - 1), min_size=1)))
    changes = draw(st.lists(st.integers(1, n), max_size=4))
    groups = np.array([sum(1 for c in changes if c <= i) for i in range(n + 1)])
    build, overlay = draw(st.sampled_from([(6.0, 0.5), (20.0, 1.0), (1.0, 1.0), (0.0, 0.0), (3.0, 0.0)]))
    built = draw(st.sets(st.sampled_from(sorted(set(groups.tolist())))))
    alone = np.where(np.isin(groups, list(built)), 1.0 + overlay, 1.0 + build)
    beside = np.minimum(alone, 1.0 + overlay)
    for x in draw(st.sets(st.integers(0, n), max_size=3)):
        alone[x] = beside[x] = 1.0
    return below, askable, StepCosts(alone, beside, groups), draw(st.integers(1, 4))


def close_rounds(below: np.ndarray, askable: list[int], count: int) -> list[tuple[int, ...]]:
    every = list(itertools.combinations(askable, min(count, len(askable))))
    most = max(entropy_of_round(below, r) for r in every)
    return [r for r in every if entropy_of_round(below, r) >= INFORMATION_FLOOR * most * (1 - 1e-12)]


@given(rounds())
@settings(max_examples=300, deadline=None)
def test_the_round_has_the_most_information_per_cost_among_those_close_enough(
        drawn: tuple[np.ndarray, list[int], StepCosts, int]) -> None:
    """Against every round of the slots' size: the pick's ratio is the best among the rounds that
    teach at least the floor's share of the most; None exactly where those all cost the same.
    One slot is the single step's rule (its P(c <= x) nearest 1/2 among equal ratios)."""
    below, askable, costs, slots = drawn
    pick = most_information_per_cost(below, askable, costs, slots)
    close = close_rounds(below, askable, slots)
    if len({round(price_of_round(costs, r), 9) for r in close}) < 2:
        assert pick is None
        return
    assert pick is not None and pick == tuple(sorted(set(pick))) and len(pick) == min(slots, len(askable))
    assert set(pick) <= set(askable)
    ratio = {r: entropy_of_round(below, r) / price_of_round(costs, r) for r in close}
    assert entropy_of_round(below, pick) >= INFORMATION_FLOOR * max(entropy_of_round(below, r) for r in close) - 1e-9
    assert entropy_of_round(below, pick) / price_of_round(costs, pick) >= max(ratio.values()) * (1 - 1e-9)
    if slots == 1:
        tied = [r for r in close if ratio[r] >= ratio[pick] * (1 - 1e-9)]
        assert abs(below[pick[0] - 1] - 0.5) <= min(abs(below[r[0] - 1] - 0.5) for r in tied) + 1e-9


@given(rounds())
@settings(max_examples=300, deadline=None)
def test_no_pick_is_dominated_by_an_unpicked_commit(drawn: tuple[np.ndarray, list[int], StepCosts, int]) -> None:
    """Swapping any pick for a commit left out never gives a round that teaches as much for less,
    or more for as little; and the same inputs give the same round."""
    below, askable, costs, slots = drawn
    pick = most_information_per_cost(below, askable, costs, slots)
    assert pick == most_information_per_cost(below.copy(), list(reversed(askable)), costs, slots)
    if pick is None:
        return
    information, price = entropy_of_round(below, pick), price_of_round(costs, pick)
    for out, into in itertools.product(pick, sorted(set(askable) - set(pick))):
        other = tuple(sorted({*pick, into} - {out}))
        more, cheaper = entropy_of_round(below, other) - information, price - price_of_round(costs, other)
        assert not (more >= -1e-12 and cheaper >= -1e-12 and (more > 1e-9 or cheaper > 1e-9)), (out, into)


@given(st.integers(MAX_CANDIDATES + 1, 3 * MAX_CANDIDATES), st.integers(1, 4), st.data())
@settings(max_examples=40, deadline=None)
def test_a_long_range_keeps_the_one_pick_rule_and_fills_the_slots(m: int, slots: int, data: st.DataObject) -> None:
    """Above MAX_CANDIDATES askable positions the round is chosen among a grid of quantiles: one
    pick is still the single step's best ratio among those close enough, several are distinct
    askable positions, as many as the slots."""
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    below = np.sort(rng.random(m))
    price_of_group = rng.choice([1.0, 1.5, 7.0], size=m + 2)
    groups = np.cumsum(rng.random(m + 2) < 1 / 17)
    alone = price_of_group[groups]
    costs = StepCosts(alone, np.minimum(alone, 1.5), groups)
    askable = list(range(1, m + 1))
    pick = most_information_per_cost(below, askable, costs, slots)
    if slots > 1:
        assert pick is None or (len(pick) == slots and list(pick) == sorted(set(pick)) and set(pick) <= set(askable))
        return
    information = {x: entropy_of_round(below, (x,)) for x in askable}
    close = [x for x in askable if information[x] >= INFORMATION_FLOOR * max(information.values())]
    if len({float(alone[x]) for x in close}) < 2:
        assert pick is None
        return
    assert pick is not None
    best = max(information[x] / alone[x] for x in close)
    assert information[pick[0]] / alone[pick[0]] >= best * (1 - 1e-9)


@given(searches(), st.integers(2, 4))
@settings(max_examples=200, deadline=None)
def test_several_slots_ask_distinct_askable_commits_and_conclude_the_same(
        search: tuple[SearchProblem, dict[int, Evidence]], slots: int) -> None:
    problem, evidence = search
    problem = replace(problem, slots=slots)
    decision = decide(problem, evidence)
    without = decide(plain(problem), evidence)
    if not isinstance(decision, Next):
        assert decision == without
        return
    assert isinstance(without, Next)
    indices = [q.index for q in decision.queries]
    assert len(indices) == len(set(indices)) <= slots
    if evidence[0].trials and evidence[problem.n].trials and not {0, problem.n} & set(indices):
        assert len(indices) == len(without.queries)  # as many slots busy as the quantiles keep
        for i in indices:
            ev = evidence.get(i, Evidence())
            assert 0 < i < problem.n and not ev.skipped and ev.trials < MAX_STEPS


@given(st.integers(8, 60), st.floats(5.0, 50.0))
@settings(max_examples=50, deadline=None)
def test_two_slots_take_the_built_neighbours_of_unbuilt_quantiles(third: int, build: float) -> None:
    """Only the ends tested: the quantiles n/3 and 2n/3 are unbuilt, a neighbour of each is in a
    built group; the pair of neighbours teaches nearly as much for two overlays."""
    n = 3 * third
    neighbours = frozenset({third + 1, 2 * third - 1})
    problem = SearchProblem(n=n, mode="likelihood", slots=2, build_groups=tuple(range(n + 1)), build_cost=build,
                            overlay_cost=0.1, prebuilt_groups=neighbours)
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    assert decide(plain(problem), evidence) == Next((Query(third), Query(2 * third)))
    assert decide(problem, evidence) == Next(tuple(Query(i) for i in sorted(neighbours)))


@given(st.integers(10, 60), st.floats(5.0, 50.0))
@settings(max_examples=50, deadline=None)
def test_two_slots_in_one_unbuilt_group_pay_one_build(half: int, build: float) -> None:
    """Only the ends built (each its own group): the quantiles n/3 and 2n/3 lie in two unbuilt
    groups, one more group holds what lies between them; two picks inside it pay one build and one
    overlay instead of two builds."""
    n = 6 * half
    groups = tuple(0 if i == 0 else 1 if i <= 2 * half else 2 if i < 4 * half else 3 if i < n else 4
                   for i in range(n + 1))
    problem = SearchProblem(n=n, mode="likelihood", slots=2, build_groups=groups, build_cost=build,
                            overlay_cost=0.1)
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    assert decide(plain(problem), evidence) == Next((Query(2 * half), Query(4 * half)))
    decision = decide(problem, evidence)
    assert isinstance(decision, Next) and len(decision.queries) == 2
    assert {groups[q.index] for q in decision.queries} == {2}
