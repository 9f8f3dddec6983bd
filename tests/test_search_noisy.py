"""Noisy-mode search: right at the requested confidence, exact for a perfect test, resumable."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.oracle.stats import wilson_interval
from bisect_npu.search import EndsWrong, Evidence, Found, Narrowed, Next, SearchProblem, decide
from bisect_npu.search_noisy import separation
from bisect_npu.simulate import simulate_one


def run_noisy(n, culprit, bad_rate, good_rate, seed, slots=1, build_fail=0.0):
    return simulate_one(
        SearchProblem(n=n, mode="noisy", slots=slots),
        culprit,
        bad_rate=bad_rate,
        good_rate=good_rate,
        build_fail=build_fail,
        rng=np.random.default_rng(seed),
        build_key_of=str,
    )


def test_perfect_test_is_always_exact_and_cheap():
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 17, 64):
        for seed in range(12):
            culprit = int(rng.integers(1, n + 1))
            outcome = run_noisy(n, culprit, 1.0, 0.0, seed)
            assert outcome.correct, (n, culprit, outcome.answer)
            # Binary search, the ends, and confirmation trials until the posterior reaches 0.99.
            assert outcome.trials <= np.ceil(np.log2(max(n, 2))) + 12


def test_flaky_test_is_right_at_least_99_percent():
    """0.8/0.2: the good side fails too; the prior's q = 0 atom must not make that look conclusive."""
    rng = np.random.default_rng(2)
    outcomes = [run_noisy(16, int(rng.integers(1, 17)), 0.8, 0.2, seed) for seed in range(300)]
    assert np.mean([o.correct for o in outcomes]) >= 0.99
    assert all(isinstance(o.answer, Found) for o in outcomes)


def test_rare_failure_on_bad_side_only_is_right_at_least_99_percent():
    """0.2/0.0 (a loop in 1 run of 5): one failure is conclusive, a pass says little; still right."""
    rng = np.random.default_rng(3)
    outcomes = [run_noisy(12, int(rng.integers(1, 13)), 0.2, 0.0, seed) for seed in range(200)]
    assert np.mean([o.correct for o in outcomes]) >= 0.99


def test_found_carries_the_sandwich_evidence():
    outcome = run_noisy(40, 23, 0.9, 0.1, seed=5)
    answer = outcome.answer
    assert isinstance(answer, Found) and answer.index == 23
    figures = answer.figures
    assert figures["separation"] >= 0.95
    assert figures["posterior"] >= 0.99
    assert figures["culprit_rate_lo"] <= figures["culprit_rate"] <= figures["culprit_rate_hi"]
    assert figures["parent_rate_hi"] < 1.0
    assert figures["trials"] == outcome.trials


def test_ends_wrong_when_the_bad_end_never_fails():
    outcome = run_noisy(20, 10, 0.0, 0.0, seed=0)
    assert outcome.answer == EndsWrong("bad", outcome.answer.figures)
    assert outcome.answer.figures["bad_end_trials"] >= 1


def test_ends_wrong_when_the_good_end_fails_as_often():
    outcome = run_noisy(20, 10, 0.7, 0.7, seed=1)
    assert isinstance(outcome.answer, EndsWrong) and outcome.answer.which == "good"
    figures = outcome.answer.figures
    assert figures["change_probability"] < 0.5
    assert figures["good_end_rate_lo"] <= figures["bad_end_rate_hi"]


def test_skipped_builds_give_git_range():
    # Position 7 cannot be built and the culprit is 7: the answer must be the range (6, 8].
    problem = SearchProblem(n=16, mode="noisy")
    rng = np.random.default_rng(4)
    evidence: dict[int, Evidence] = {}
    while isinstance(decision := decide(problem, evidence), Next):
        for query in decision.queries:
            ev = evidence.get(query.index, Evidence())
            if query.index == 7:
                evidence[7] = ev.add("skip")
                continue
            fails = int((rng.random(query.trials) < (0.9 if query.index >= 7 else 0.1)).sum())
            evidence[query.index] = Evidence(ev.good + query.trials - fails, ev.bad + fails, ev.skipped)
    assert isinstance(decision, Narrowed)
    assert (decision.lo, decision.hi) == (6, 8)


def test_slots_cut_rounds_for_a_perfect_test():
    one = run_noisy(200, 77, 1.0, 0.0, seed=0)
    four = run_noisy(200, 77, 1.0, 0.0, seed=0, slots=4)
    assert one.correct and four.correct
    assert four.rounds < one.rounds


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 60), st.sampled_from([(0.85, 0.15), (0.2, 0.0), (1.0, 0.0)]),
       st.sampled_from([1, 3]), st.data())
def test_resume_from_any_prefix_gives_the_same_next_decision(seed, n, rates, slots, data):
    """A resumed session rebuilds the evidence from its journal (in any order): the decision the
    uninterrupted session took at that point, for any journal prefix ending between decisions."""
    culprit = data.draw(st.integers(1, n))
    bad_rate, good_rate = rates
    rng = np.random.default_rng(seed)
    problem = SearchProblem(n=n, mode="noisy", slots=slots)
    journal: list[tuple[int, str]] = []
    evidence: dict[int, Evidence] = {}
    taken: list[tuple[int, object]] = []
    while len(journal) < 60:
        decision = decide(problem, evidence)
        taken.append((len(journal), decision))
        if not isinstance(decision, Next):
            break
        for query in decision.queries:
            for _ in range(query.trials):
                rate = bad_rate if query.index >= culprit else good_rate
                outcome = "bad" if rng.random() < rate else "good"
                journal.append((query.index, outcome))
                evidence[query.index] = evidence.get(query.index, Evidence()).add(outcome)
    cut, expected = data.draw(st.sampled_from(taken))
    order = data.draw(st.permutations(range(cut)))
    replayed: dict[int, Evidence] = {}
    for k in order:
        index, outcome = journal[k]
        replayed[index] = replayed.get(index, Evidence()).add(outcome)
    assert decide(problem, replayed) == expected


def test_separation_and_wilson_behave():
    assert separation(Evidence(bad=1), Evidence(good=1)) > 0.9
    assert separation(Evidence(bad=10, good=10), Evidence(bad=10, good=10)) == pytest.approx(0.5, abs=0.01)
    assert separation(Evidence(good=5), Evidence(bad=5)) < 0.01
    lo, hi = wilson_interval(0, 20, 0.95)
    assert lo == 0.0 and 0.1 < hi < 0.2
