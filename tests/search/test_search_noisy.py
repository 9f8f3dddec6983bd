"""Noisy-mode search: right at the requested confidence, exact for a perfect test, resumable."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bisect_npu.forecast.simulate import simulate_one
from bisect_npu.intervals import wilson_interval
from bisect_npu.search import EarlierRuns, EndsWrong, Evidence, Found, Narrowed, Next, Query, SearchProblem, decide
from bisect_npu.search.noisy import separation


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


@pytest.mark.heavy  # a calibration run: many simulated bisections
def test_flaky_test_is_right_at_least_99_percent():
    """0.8/0.2: the good side fails too; the prior's q = 0 atom must not make that look conclusive."""
    rng = np.random.default_rng(2)
    outcomes = [run_noisy(16, int(rng.integers(1, 17)), 0.8, 0.2, seed) for seed in range(300)]
    assert np.mean([o.correct for o in outcomes]) >= 0.99
    assert all(isinstance(o.answer, Found) for o in outcomes)


@pytest.mark.heavy  # a calibration run: many simulated bisections
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


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(3, 40),
    counts=st.lists(st.tuples(st.integers(1, 39), st.integers(0, 6), st.integers(0, 6)), max_size=12),
    ends=st.tuples(st.integers(1, 8), st.integers(0, 2), st.integers(0, 2), st.integers(1, 8)),
    earlier=st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30), st.integers(0, 30)),
)
def test_earlier_runs_weigh_exactly_like_trials_at_the_ends(n, counts, ends, earlier):
    """Earlier runs are not a vague prior: wherever the session's own trials do not matter (its
    ends are established, the culprit and parent are inner commits), the decision is the one the
    search makes with those runs added to the ends' trials."""
    bad_failed, bad_runs, good_failed, good_runs = earlier
    runs = EarlierRuns(min(bad_failed, bad_runs), bad_runs, min(good_failed, good_runs), good_runs)
    evidence = {min(i, n - 1): Evidence(good, bad) for i, good, bad in counts}
    evidence[0] = Evidence(ends[0], ends[1])
    evidence[n] = Evidence(ends[2], ends[3])
    with_runs = decide(SearchProblem(n=n, mode="noisy", earlier_runs=runs), evidence)
    as_trials = dict(evidence)
    as_trials[0] = Evidence(ends[0] + runs.good_runs - runs.good_failed, ends[1] + runs.good_failed)
    as_trials[n] = Evidence(ends[2] + runs.bad_runs - runs.bad_failed, ends[3] + runs.bad_failed)
    plain = decide(SearchProblem(n=n, mode="noisy"), as_trials)
    if isinstance(with_runs, Next) and all(0 < q.index < n for q in with_runs.queries):
        assert plain == with_runs
    if isinstance(with_runs, Found) and 1 < with_runs.index < n:
        assert isinstance(plain, Found) and plain.index == with_runs.index
        assert plain.confidence == pytest.approx(with_runs.confidence)


def test_an_answer_with_earlier_runs_is_the_answer_with_them_as_end_trials():
    runs = EarlierRuns(bad_failed=27, bad_runs=30, good_failed=4, good_runs=30)
    problem = SearchProblem(n=40, mode="noisy", earlier_runs=runs)
    rng = np.random.default_rng(4)
    evidence: dict[int, Evidence] = {}
    while isinstance(decision := decide(problem, evidence), Next):
        for query in decision.queries:
            failed = rng.random() < (0.9 if query.index >= 17 else 0.1)
            evidence[query.index] = evidence.get(query.index, Evidence()).add("bad" if failed else "good")
    assert isinstance(decision, Found) and decision.index == 17
    as_trials = dict(evidence)
    as_trials[0] = Evidence(evidence[0].good + 26, evidence[0].bad + 4)
    as_trials[40] = Evidence(evidence[40].good + 3, evidence[40].bad + 27)
    plain = decide(SearchProblem(n=40, mode="noisy"), as_trials)
    assert isinstance(plain, Found) and plain.index == 17
    assert plain.confidence == pytest.approx(decision.confidence)


def test_earlier_runs_do_not_replace_the_session_s_own_ends():
    runs = EarlierRuns(bad_failed=8, bad_runs=40, good_failed=0, good_runs=40)
    problem = SearchProblem(n=128, mode="noisy", earlier_runs=runs)
    assert decide(problem, {}) == Next((Query(128),))
    assert decide(problem, {128: Evidence(0, 1)}) == Next((Query(0),))
    # A bad end that has not failed in 21 runs here (0.8^21 = 1% at the earlier 8/40) gets more
    # runs rather than being judged good: the earlier runs say the rate changed.
    assert decide(problem, {128: Evidence(21, 0)}) == Next((Query(128),))
    # One that never fails in the session is judged good once its own trials alone say so.
    verdict = decide(problem, {128: Evidence(64, 0)})
    assert isinstance(verdict, EndsWrong) and verdict.which == "bad"


@pytest.mark.heavy  # a calibration run: many simulated bisections
def test_earlier_runs_save_trials_without_losing_accuracy():
    rng = np.random.default_rng(11)
    culprits = rng.integers(1, 65, size=80)

    def run(earlier: int) -> list:
        seeds = np.random.default_rng(12)
        return [simulate_one(SearchProblem(n=64, mode="noisy"), int(c), bad_rate=0.8, good_rate=0.2, build_fail=0.0,
                             rng=seeds, build_key_of=str, earlier_runs=earlier) for c in culprits]

    without, with_runs = run(0), run(40)
    assert np.mean([o.correct for o in with_runs]) >= 0.98
    assert np.mean([o.trials for o in with_runs]) < 0.85 * np.mean([o.trials for o in without])
    # The session still runs each end itself before it searches.
    assert all(o.trials >= 2 for o in with_runs)


def test_earlier_runs_must_be_counts():
    with pytest.raises(ValueError, match="earlier runs"):
        decide(SearchProblem(n=8, mode="noisy", earlier_runs=EarlierRuns(11, 10, 0, 10)), {})


def test_a_late_round_puts_several_slots_on_the_culprit_and_its_parent():
    evidence = {0: Evidence(20, 2), 40: Evidence(3, 20), 19: Evidence(3, 0), 20: Evidence(3, 1),
                21: Evidence(1, 3), 22: Evidence(0, 3)}
    decision = decide(SearchProblem(n=40, mode="noisy", slots=6), evidence)
    assert isinstance(decision, Next)
    asked = Counter(q.index for q in decision.queries)
    assert sum(asked.values()) == 6
    assert asked[20] >= 2 and asked[21] >= 2  # not six different commits around them


@settings(max_examples=60, deadline=None)
@given(
    counts=st.dictionaries(st.integers(1, 29), st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=10),
    skipped=st.sets(st.integers(1, 29), max_size=4),
    slots=st.integers(2, 8),
)
def test_a_round_never_passes_the_per_commit_cap_or_asks_a_skipped_commit(counts, skipped, slots):
    evidence = {i: Evidence(good, bad) for i, (good, bad) in counts.items()}
    for i in skipped:
        evidence[i] = Evidence(*counts.get(i, (0, 0)), skipped=True)
    evidence[0] = Evidence(4, 0)
    evidence[30] = Evidence(0, 4)
    problem = SearchProblem(n=30, mode="noisy", slots=slots, max_trials_per_query=5)
    decision = decide(problem, evidence)
    if isinstance(decision, Next):
        assert len(decision.queries) <= slots
        for index, asked in Counter(q.index for q in decision.queries).items():
            assert index not in skipped
            assert evidence.get(index, Evidence()).trials + asked <= 5


def _stepped(n: int, cap: int, step: int, good_failed: int, bad_passed: int, parent_failed: int,
             culprit_failed: int) -> dict[int, Evidence]:
    """Every position run `cap` times (the per-commit cap): the good side failing `good_failed`
    times, the bad side passing `bad_passed` times, the step's two neighbours as given."""
    evidence = {i: Evidence(cap - good_failed, good_failed) if i < step else Evidence(bad_passed, cap - bad_passed)
                for i in range(n + 1)}
    evidence[step - 1] = Evidence(cap - parent_failed, parent_failed)
    evidence[step] = Evidence(cap - culprit_failed, culprit_failed)
    return evidence


def test_neighbours_capped_without_showing_the_step_are_a_range_not_a_culprit():
    """The rates learnt from the other commits (1 in 16 against 15 in 16) put 0.9993 of the
    posterior on 20, but 20's and 19's own 16 trials each (10 and 6 failures) show no step
    (separation 0.92 < 0.95) and both have spent their trials: the answer is the narrowest range
    whose ends' own trials do show one, (19, 21], holding the most mass of the two, not Found(20)."""
    evidence = _stepped(40, 16, 20, 1, 1, 6, 10)
    decision = decide(SearchProblem(n=40, mode="noisy", max_trials_per_query=16), evidence)
    assert isinstance(decision, Narrowed) and (decision.lo, decision.hi) == (19, 21)
    assert decision.figures["disagreeing_culprit"] == 20 and decision.figures["posterior"] >= 0.99
    assert decision.figures["separation"] < 0.95 <= separation(evidence[21], evidence[19])
    # One trial left at the parent: it is asked again instead.
    evidence[19] = Evidence(9, 6)
    assert decide(SearchProblem(n=40, mode="noisy", max_trials_per_query=16), evidence) == Next((Query(19),))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(20, 40), cap=st.integers(10, 24), step=st.integers(2, 39), good_failed=st.integers(0, 2),
       bad_passed=st.integers(0, 2), parent_share=st.integers(25, 50), culprit_share=st.integers(50, 75))
@example(n=40, cap=16, step=20, good_failed=1, bad_passed=1, parent_share=38, culprit_share=63)  # the test above's
def test_a_culprit_is_named_only_where_its_own_and_its_parents_trials_show_the_step(
        n, cap, step, good_failed, bad_passed, parent_share, culprit_share):
    """Every commit at the per-commit cap, the step's neighbours failing at shares between the
    sides' (in percent): a Found at the confidence asked always has the culprit's and its parent's
    own trials separated, and a range named for a culprit they do not separate holds it, between
    ends whose own trials are separated (or the whole range where none are)."""
    step = min(step, n - 1)
    evidence = _stepped(n, cap, step, good_failed, bad_passed, cap * parent_share // 100, cap * culprit_share // 100)
    problem = SearchProblem(n=n, mode="noisy", max_trials_per_query=cap)
    decision = decide(problem, evidence)
    if isinstance(decision, Found) and decision.confidence >= problem.confidence:
        assert separation(evidence[decision.index], evidence[decision.index - 1]) >= problem.sandwich_confidence
    if isinstance(decision, Narrowed) and "disagreeing_culprit" in decision.figures:
        assert decision.lo < decision.figures["disagreeing_culprit"] <= decision.hi
        assert ((decision.lo, decision.hi) == (0, n)
                or separation(evidence[decision.hi], evidence[decision.lo]) >= problem.sandwich_confidence)
