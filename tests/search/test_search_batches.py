"""Noisy mode when engine starts and builds cost something: trials per query and commits chosen
by information per cost."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.forecast.simulate import Minutes, simulate_one
from bisect_npu.search import Evidence, Next, SearchProblem, decide
from bisect_npu.search.noisy import (
    MAX_BATCH,
    batch_information_gain,
    information_gain,
    position_mass,
    posterior_of_counts,
)

counts_strategy = st.dictionaries(st.integers(1, 11), st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=6)


def _posterior(n: int, counts: dict[int, tuple[int, int]]):
    full = {0: (3, 0), n: (0, 3), **counts}
    return position_mass(posterior_of_counts(n, {i: (float(g), float(b)) for i, (g, b) in full.items()}))


def _brute_force_gain(mass, mean_q, mean_p, m: int) -> list[float]:
    """I(J; c) by enumeration, position by position (no cumulative sums)."""
    n = len(mass)
    gains = []
    for x in range(n + 1):
        joint = [[0.0] * (m + 1) for _ in range(n)]
        for c in range(1, n + 1):
            rate = mean_p[c - 1] if c <= x else mean_q[c - 1]
            for j in range(m + 1):
                joint[c - 1][j] = mass[c - 1] * math.comb(m, j) * rate**j * (1 - rate) ** (m - j)
        marginal = [sum(joint[c][j] for c in range(n)) for j in range(m + 1)]
        gain = 0.0
        for c in range(n):
            for j in range(m + 1):
                if joint[c][j] > 0:
                    gain += joint[c][j] * math.log(joint[c][j] / (mass[c] * marginal[j]))
        gains.append(gain)
    return gains


@settings(max_examples=40, deadline=None)
@given(counts=counts_strategy, m=st.integers(1, 5))
def test_batch_gain_is_the_mutual_information_of_the_failure_count(counts, m):
    mass, mean_q, mean_p = _posterior(12, counts)
    fast = batch_information_gain(mass, mean_q, mean_p, m)
    assert np.allclose(fast, _brute_force_gain(mass, mean_q, mean_p, m), atol=1e-9)
    if m == 1:
        assert np.allclose(fast, information_gain(mass, mean_q, mean_p), atol=1e-9)
    entropy = -float((mass[mass > 0] * np.log(mass[mass > 0])).sum())
    assert (fast <= entropy + 1e-9).all()  # m trials never tell more than there is to know


@settings(max_examples=40, deadline=None)
@given(counts=counts_strategy)
def test_more_trials_at_a_position_never_tell_less(counts):
    mass, mean_q, mean_p = _posterior(12, counts)
    gains = np.array([batch_information_gain(mass, mean_q, mean_p, m) for m in range(1, 7)])
    assert (np.diff(gains, axis=0) >= -1e-9).all()


@settings(max_examples=60, deadline=None)
@given(
    counts=st.dictionaries(st.integers(1, 29), st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=10),
    skipped=st.sets(st.integers(1, 29), max_size=4),
    slots=st.integers(1, 6),
    load_cost=st.sampled_from([0.0, 0.5, 3.0, 40.0]),
    build_cost=st.sampled_from([0.0, 5.0, 200.0]),
)
def test_queries_respect_the_cap_and_ask_one_trial_when_starts_are_free(counts, skipped, slots, load_cost,
                                                                        build_cost):
    evidence = {i: Evidence(good, bad) for i, (good, bad) in counts.items()}
    for i in skipped:
        evidence[i] = Evidence(*counts.get(i, (0, 0)), skipped=True)
    evidence[0] = Evidence(4, 0)
    evidence[30] = Evidence(0, 4)
    problem = SearchProblem(n=30, mode="noisy", slots=slots, max_trials_per_query=12, load_cost=load_cost,
                            build_cost=build_cost)
    decision = decide(problem, evidence)
    if not isinstance(decision, Next):
        return
    asked: Counter[int] = Counter()
    for query in decision.queries:
        assert 1 <= query.trials <= MAX_BATCH
        if load_cost == build_cost == 0:
            assert query.trials == 1
        asked[query.index] += query.trials
    for index, trials in asked.items():
        assert index not in skipped
        assert evidence.get(index, Evidence()).trials + trials <= 12


def test_costly_engine_starts_batch_the_ends_and_the_search():
    fresh = decide(SearchProblem(n=64, mode="noisy", load_cost=20.0), {})
    assert isinstance(fresh, Next) and fresh.queries[0].index == 64 and fresh.queries[0].trials > 1
    assert decide(SearchProblem(n=64, mode="noisy"), {}).queries[0].trials == 1  # type: ignore[union-attr]
    ends = {0: Evidence(6, 1), 64: Evidence(1, 6)}
    cheap = decide(SearchProblem(n=64, mode="noisy", load_cost=0.5), ends)
    costly = decide(SearchProblem(n=64, mode="noisy", load_cost=30.0), ends)
    assert isinstance(cheap, Next) and isinstance(costly, Next)
    assert 0 < cheap.queries[0].index < 64 and 0 < costly.queries[0].index < 64
    assert costly.queries[0].trials > cheap.queries[0].trials


def test_the_sandwich_asks_a_batch_of_the_member_short_of_trials():
    # Culprit 21 is near certain from the neighbours, but its parent has a single trial of its own
    # and the culprit passed twice: the pair alone needs about five more passes of the parent.
    evidence = {0: Evidence(30, 0), 40: Evidence(0, 30), 20: Evidence(1, 0), 21: Evidence(2, 4),
                19: Evidence(8, 0), 22: Evidence(0, 8), 18: Evidence(8, 0), 23: Evidence(0, 8)}
    free = decide(SearchProblem(n=40, mode="noisy", sandwich_confidence=0.99), evidence)
    costly = decide(SearchProblem(n=40, mode="noisy", sandwich_confidence=0.99, load_cost=10.0), evidence)
    assert isinstance(free, Next) and isinstance(costly, Next)
    assert [(q.index, q.trials) for q in free.queries] == [(20, 1)]
    assert costly.queries[0].index == 20 and costly.queries[0].trials > 1


def _costs(load_cost: float, build_cost: float, told: tuple[float, float], runs: int = 60) -> dict[str, float]:
    rng = np.random.default_rng(11)
    problem = SearchProblem(n=32, mode="noisy", load_cost=told[0], build_cost=told[1])
    outcomes = [simulate_one(problem, int(rng.integers(1, 33)), bad_rate=0.8, good_rate=0.2, build_fail=0.0,
                             rng=rng, build_key_of=str,
                             costs=Minutes(build=build_cost, run=1.0, load=load_cost)) for _ in range(runs)]
    return {
        "cost": float(np.mean([o.trials + load_cost * o.loads + build_cost * o.builds for o in outcomes])),
        "right": float(np.mean([o.correct for o in outcomes])),
        "starts_per_trial": float(np.mean([o.loads / o.trials for o in outcomes])),
        "builds": float(np.mean([o.builds for o in outcomes])),
    }


@pytest.mark.heavy  # a calibration run: many simulated bisections
def test_batches_cut_the_cost_of_a_bisection_when_starts_are_dear():
    one_by_one = _costs(10.0, 0.0, told=(0.0, 0.0))
    batched = _costs(10.0, 0.0, told=(10.0, 0.0))
    assert one_by_one["starts_per_trial"] == 1.0 and batched["starts_per_trial"] < 0.3
    assert batched["cost"] <= 0.5 * one_by_one["cost"]
    assert one_by_one["right"] >= 0.98 and batched["right"] >= 0.98


@pytest.mark.heavy  # a calibration run: many simulated bisections
def test_a_search_told_the_build_cost_builds_fewer_commits():
    starts_only = _costs(2.0, 50.0, told=(2.0, 0.0))
    builds_too = _costs(2.0, 50.0, told=(2.0, 50.0))
    assert builds_too["builds"] <= starts_only["builds"] - 1.0
    assert builds_too["cost"] < starts_only["cost"]
    assert builds_too["right"] >= 0.98


def test_a_dear_build_sends_the_next_query_to_a_built_commit():
    evidence = {0: Evidence(4, 0), 64: Evidence(0, 4), 32: Evidence(3, 1)}
    free = decide(SearchProblem(n=64, mode="noisy"), evidence)
    dear = decide(SearchProblem(n=64, mode="noisy", build_cost=1000.0), evidence)
    assert isinstance(free, Next) and isinstance(dear, Next)
    assert free.queries[0].index not in evidence  # the most informative commit is a new one
    assert dear.queries[0].index in evidence  # one more trial where it is built already


def test_an_image_from_an_earlier_session_makes_its_group_cheap_to_query():
    # Every untested commit a full build away except 40..47, whose image an earlier session left:
    # with builds dear, the next query goes there rather than to another built commit.
    evidence = {0: Evidence(4, 0), 64: Evidence(0, 4), 32: Evidence(3, 1)}
    groups = tuple(min(i // 8, 8) for i in range(65))
    dear = SearchProblem(n=64, mode="noisy", build_cost=1000.0, overlay_cost=1.0, build_groups=groups)
    kept = SearchProblem(n=64, mode="noisy", build_cost=1000.0, overlay_cost=1.0, build_groups=groups,
                         prebuilt_groups=frozenset({5}))
    first, again = decide(dear, evidence), decide(kept, evidence)
    assert isinstance(first, Next) and isinstance(again, Next)
    assert first.queries[0].index in {0, 32, 64} or groups[first.queries[0].index] in {0, 4, 8}
    assert groups[again.queries[0].index] == 5 and again.queries[0].index not in evidence
