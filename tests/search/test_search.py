"""Exact-mode search: agrees with a brute-force scan for any range, culprit and skip set."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.search import (
    EndsWrong,
    Evidence,
    Found,
    Narrowed,
    Next,
    SearchProblem,
    decide,
    rests_on,
)


def expected_answer(n: int, culprit: int, skipped: frozenset[int]) -> Found | Narrowed:
    """Brute force: the smallest (lo, hi] git can report, lo and hi the nearest testable ends."""
    lo = max((i for i in range(culprit) if i not in skipped), default=0)
    hi = min(i for i in range(culprit, n + 1) if i not in skipped or i == n)
    if lo == culprit - 1 and hi == culprit:
        return Found(culprit)
    return Narrowed(lo, hi)


def where(answer: Found | Narrowed) -> tuple[str, int, int]:
    """An answer without its figures: what the user is told."""
    if isinstance(answer, Found):
        return ("found", answer.index, answer.index)
    return ("narrowed", answer.lo, answer.hi)


def run_exact(n: int, culprit: int, skipped: frozenset[int], slots: int = 1, check_ends: bool = True):
    """Drive decide with a perfect oracle; return (answer, queried positions in order, rounds)."""
    problem = SearchProblem(n=n, slots=slots, check_ends=check_ends)
    evidence: dict[int, Evidence] = {}
    asked: list[int] = []
    rounds = 0
    while isinstance(decision := decide(problem, evidence), Next):
        rounds += 1
        assert 1 <= len(decision.queries) <= slots
        for query in decision.queries:
            asked.append(query.index)
            outcome = "skip" if query.index in skipped else ("bad" if query.index >= culprit else "good")
            evidence[query.index] = evidence.get(query.index, Evidence()).add(outcome)
    return decision, asked, rounds


@st.composite
def ranges(draw, max_n: int = 2000):
    n = draw(st.integers(1, max_n))
    culprit = draw(st.integers(1, n))
    inner = st.integers(1, max(1, n - 1))
    skipped = set(draw(st.sets(inner, max_size=min(40, n - 1)))) if n > 1 else set()
    if n > 2 and draw(st.booleans()):  # a run of broken builds around the culprit, as in real history
        a, b = draw(st.integers(0, 6)), draw(st.integers(0, 6))
        skipped |= set(range(max(1, culprit - a), min(n - 1, culprit + b) + 1))
    return n, culprit, frozenset(s for s in skipped if 0 < s < n)


@settings(max_examples=300, deadline=None)
@given(ranges())
def test_exact_matches_brute_force_and_never_repeats(case):
    n, culprit, skipped = case
    answer, asked, _ = run_exact(n, culprit, skipped)
    assert where(answer) == where(expected_answer(n, culprit, skipped))
    assert len(asked) == len(set(asked))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2000).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))))
def test_step_count_without_skips(case):
    n, culprit = case
    answer, asked, _ = run_exact(n, culprit, frozenset())
    assert where(answer) == ("found", culprit, culprit)
    assert len(asked) <= math.ceil(math.log2(n)) + 2
    assert asked[:2] == ([n, 0] if n >= 1 else [])


@settings(max_examples=150, deadline=None)
@given(ranges(), st.sampled_from([2, 3, 7]))
def test_k_slots_same_answer_fewer_rounds(case, slots):
    n, culprit, skipped = case
    one, _, rounds_one = run_exact(n, culprit, skipped)
    many, asked, rounds_many = run_exact(n, culprit, skipped, slots=slots)
    assert where(many) == where(one)
    assert len(asked) == len(set(asked))
    assert rounds_many <= rounds_one


@pytest.mark.parametrize("slots", [1, 3, 7])
def test_k_slot_rounds_follow_log_k_plus_1(slots):
    n = 1000
    worst = max(run_exact(n, c, frozenset(), slots=slots)[2] for c in range(1, n + 1, 7))
    # One round for the ends (they share it with the first picks when slots > 2), then k-ary search.
    assert worst <= math.ceil(math.log(n, slots + 1)) + (2 if slots == 1 else 1)


def test_ends_contradicted():
    problem = SearchProblem(n=10)
    assert decide(problem, {10: Evidence(good=1)}) == EndsWrong("bad")
    assert decide(problem, {10: Evidence(bad=1), 0: Evidence(bad=1)}) == EndsWrong("good")
    skipped_end = decide(problem, {10: Evidence(skipped=True)})
    assert isinstance(skipped_end, EndsWrong) and skipped_end.which == "bad"
    assert skipped_end.figures["skipped"] == 1.0


def test_unchecked_ends_are_assumed():
    answer, asked, _ = run_exact(16, 5, frozenset(), check_ends=False)
    assert answer.index == 5
    assert 0 not in asked and 16 not in asked
    assert len(asked) <= 4


def test_both_ends_share_a_round_with_two_slots():
    decision = decide(SearchProblem(n=100, slots=2), {})
    assert [q.index for q in decision.queries] == [100, 0]


def test_decide_is_deterministic_and_rejects_bad_input():
    evidence = {100: Evidence(bad=1), 0: Evidence(good=1), 50: Evidence(skipped=True)}
    assert decide(SearchProblem(n=100), evidence) == decide(SearchProblem(n=100), dict(evidence))
    with pytest.raises(ValueError):
        decide(SearchProblem(n=0), {})
    with pytest.raises(ValueError):
        decide(SearchProblem(n=5), {7: Evidence(good=1)})


def test_an_answer_rests_on_the_culprit_and_its_parent_the_range_s_ends_or_the_wrong_end() -> None:
    """What a commit search runs fresh before answering where the verdict store judged it."""
    problem = SearchProblem(n=10)
    found = decide(problem, {0: Evidence(good=1), 10: Evidence(bad=1), 3: Evidence(good=1), 4: Evidence(bad=1)})
    assert isinstance(found, Found) and found.index == 4 and rests_on(found, 10) == (3, 4)
    assert rests_on(Narrowed(2, 5), 10) == (2, 5)
    assert rests_on(decide(problem, {10: Evidence(good=1)}), 10) == (10,)
    assert rests_on(decide(problem, {10: Evidence(bad=1), 0: Evidence(bad=1)}), 10) == (0,)
    assert rests_on(decide(problem, {}), 10) == ()
