"""The search's likelihood mode: each step's log likelihood ratio moves the change-point posterior."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.polynomial.hermite_e import hermegauss

from bisect_npu.search import EndsWrong, Evidence, Found, Narrowed, Next, Query, SearchProblem, Weight, decide
from bisect_npu.search.likelihood import ANSWER_MAX_STEPS, MAX_STEPS, TELLING_SHARE, change_point_posterior


def problem(n: int, slots: int = 1, confidence: float = 0.99) -> SearchProblem:
    return SearchProblem(n=n, mode="likelihood", slots=slots, confidence=confidence)


def test_the_ends_come_first_and_must_be_their_side() -> None:
    assert decide(problem(16), {}) == Next((Query(0),))
    assert decide(problem(16, slots=2), {}) == Next((Query(0), Query(16)))
    assert isinstance(decide(problem(16), {0: Evidence(bad=1), 16: Evidence(bad=1)}), EndsWrong)
    wrong = decide(problem(16), {0: Evidence(good=1), 16: Evidence(good=1)})
    assert isinstance(wrong, EndsWrong) and wrong.which == "bad"



def test_an_end_that_measured_the_other_side_weakly_is_asked_again() -> None:
    """A measured end near the line can fall on the wrong side once by chance: while its ratios do
    not make the other side `confidence` sure it is asked again (up to MAX_STEPS); a decisive
    ratio, or its steps spent, still stops the session."""
    weak = decide(problem(16), {0: Evidence(good=1), 16: Evidence(good=1).weigh(-0.4)})
    assert weak == Next((Query(16),))
    sure = decide(problem(16), {0: Evidence(good=1), 16: Evidence(good=2).weigh(-6.0)})
    assert isinstance(sure, EndsWrong) and sure.which == "bad"
    spent = Evidence(good=MAX_STEPS).weigh(-1.0)
    assert isinstance(decide(problem(16), {0: Evidence(good=1), 16: spent}), EndsWrong)
    righted = decide(problem(16), {0: Evidence(good=1), 16: Evidence(good=1, bad=1).weigh(2.6)})
    assert isinstance(righted, Next) and righted.queries != (Query(16),)

@settings(max_examples=40, deadline=None)
@given(st.integers(2, 300), st.data())
def test_decisive_steps_bisect_to_the_culprit(n: int, data: st.DataObject) -> None:
    """With every step decisive (|log_lr| = 10) the search is a binary search: ceil(log2 n) steps or so."""
    culprit = data.draw(st.integers(1, n))
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    for _ in range(4 * n):
        decision = decide(problem(n), evidence)
        if not isinstance(decision, Next):
            break
        for q in decision.queries:
            bad = q.index >= culprit
            evidence[q.index] = evidence.get(q.index, Evidence()).add("bad" if bad else "good").weigh(
                10.0 if bad else -10.0)
    assert isinstance(decision, Found) and decision.index == culprit
    assert len(evidence) - 2 <= int(np.ceil(np.log2(n))) + 1


def test_a_weak_step_is_asked_again_and_the_ratios_add_up() -> None:
    evidence = {0: Evidence(good=1), 4: Evidence(bad=1), 2: Evidence(bad=1, log_lr=1.0)}
    decision = decide(problem(4), evidence)
    assert isinstance(decision, Next)
    evidence[1] = Evidence(good=1, log_lr=-9.0)
    assert decide(problem(4), evidence) == Next((Query(2),))  # 2 holds too little evidence: again
    evidence[2] = evidence[2].add("bad").weigh(9.0)
    decision = decide(problem(4), evidence)
    assert isinstance(decision, Found) and decision.index == 2


def test_a_position_asked_max_steps_times_is_left_to_the_posterior() -> None:
    evidence = {0: Evidence(good=1), 2: Evidence(bad=1), 1: Evidence(good=MAX_STEPS, log_lr=0.1)}
    decision = decide(problem(2), evidence)
    assert isinstance(decision, Found | Narrowed)
    assert decision.figures["posterior"] < 0.99


def test_the_posterior_is_the_product_of_the_steps() -> None:
    post = change_point_posterior(3, {1: Evidence(log_lr=np.log(2.0)), 2: Evidence(log_lr=np.log(3.0))})
    # c = 1: both 1 and 2 on the bad side (2 * 3); c = 2: only 2 (3); c = 3: neither (1).
    assert np.allclose(post, np.array([6.0, 3.0, 1.0]) / 10.0)


def test_a_skipped_commit_joins_the_next_into_a_range() -> None:
    evidence = {0: Evidence(good=1), 3: Evidence(bad=1), 1: Evidence(good=1, log_lr=-20.0),
                2: Evidence(skipped=True)}
    decision = decide(problem(3), evidence)
    assert isinstance(decision, Narrowed) and (decision.lo, decision.hi) == (1, 3)


def test_with_the_mass_on_one_commit_its_weakly_judged_parent_is_asked() -> None:
    """The culprit's own step was decisive, its parent's barely: asking the culprit again tells
    nothing (P(c <= culprit) is 1 already); asking the parent does."""
    evidence = {0: Evidence(good=1), 20: Evidence(bad=1), 10: Evidence(good=1, log_lr=-30.0),
                13: Evidence(good=1, log_lr=-4.9), 14: Evidence(bad=1, log_lr=30.0)}
    assert decide(problem(20), evidence) == Next((Query(13),))


def _brute_force_posterior(n: int, evidence: dict[int, Evidence]) -> np.ndarray:
    """Every pair of nodes of the two ends' errors, each position's terms on its side of c."""
    k = len(next(ev for ev in evidence.values() if ev.shared_good).shared_good)
    weights = hermegauss(k)[1]
    weights = weights / weights.sum()
    post = np.zeros(n)
    for c in range(1, n + 1):
        for kg, wg in enumerate(weights):
            for kb, wb in enumerate(weights):
                total = 0.0
                for i, ev in evidence.items():
                    if not 0 < i < n:
                        continue
                    free = ev.log_lr - ev.shared_log_lr
                    if i >= c:
                        total += free + (ev.shared_bad[kb] if ev.shared_bad else 0.0)
                    elif ev.shared_good:
                        total += ev.shared_good[kg]
                post[c - 1] += wg * wb * np.exp(total)
    return post / post.sum()


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 7), st.integers(1, 5), st.data())
def test_the_ends_error_is_integrated_once_over_every_step(n: int, k: int, data: st.DataObject) -> None:
    """Steps sharing the ends: the posterior integrates their node terms over the ends' error jointly."""
    terms = st.lists(st.floats(-6, 0), min_size=k, max_size=k).map(tuple)
    evidence: dict[int, Evidence] = {0: Evidence(good=1), n: Evidence(bad=1)}
    for i in range(1, n):
        ev = Evidence(good=1)
        for _ in range(data.draw(st.integers(0, 2))):
            good, bad = data.draw(terms), data.draw(terms)
            ev = ev.weigh(Weight(data.draw(st.floats(-5, 5)), good, bad))
        evidence[i] = ev.weigh(data.draw(st.floats(-3, 3)))  # a step without node terms: its ratio alone
    np.testing.assert_allclose(change_point_posterior(n, evidence), _brute_force_posterior(n, evidence)
                               if any(ev.shared_good for ev in evidence.values())
                               else change_point_posterior(n, {i: Evidence(log_lr=ev.log_lr)
                                                                for i, ev in evidence.items()}), atol=1e-9)


def test_a_lone_step_weighs_what_its_node_terms_integrate_to() -> None:
    """One step, alone: the joint integral is its own, so the posterior is that of its ratio."""
    weights = hermegauss(3)[1] / hermegauss(3)[1].sum()
    good, bad = (0.0, -4.0, -9.0), (-7.0, -6.0, -2.0)
    ratio = float(np.log(weights @ np.exp(bad)) - np.log(weights @ np.exp(good)))
    shared = {0: Evidence(good=1), 2: Evidence(bad=1), 1: Evidence(good=1).weigh(Weight(ratio, good, bad))}
    alone = {0: Evidence(good=1), 2: Evidence(bad=1), 1: Evidence(good=1, log_lr=ratio)}
    np.testing.assert_allclose(change_point_posterior(2, shared), change_point_posterior(2, alone))


def test_a_position_that_cannot_move_the_undecided_mass_is_not_asked() -> None:
    """The mass split between commits 1 and 2 and position 1 asked its MAX_STEPS: asking 2 or
    later tells nothing about 1 against 2, so the search answers with what it has."""
    evidence = {0: Evidence(good=1), 8: Evidence(bad=1), 1: Evidence(good=MAX_STEPS, log_lr=0.0)}
    for i in range(2, 8):
        evidence[i] = Evidence(bad=1, log_lr=40.0)
    decision = decide(problem(8), evidence)
    assert not isinstance(decision, Next)
    assert decision.figures["posterior"] == pytest.approx(0.5)


def test_an_answer_whose_culprit_stopped_short_of_the_answer_ratio_asks_it_again() -> None:
    """The posterior alone would name 3 (its parent's and its own steps, 5.5 each, make it 99%
    sure); held to 6, the culprit is asked again, then the parent; once both add up it is named."""
    evidence = {0: Evidence(good=1), 8: Evidence(bad=1), 1: Evidence(good=1).weigh(-8.0),
                2: Evidence(good=1).weigh(-5.5), 3: Evidence(bad=1).weigh(5.5), 4: Evidence(bad=1).weigh(8.0),
                6: Evidence(bad=1).weigh(8.0)}
    assert isinstance(decide(problem(8), evidence), Found)
    held = SearchProblem(n=8, mode="likelihood", confidence=0.99, answer_log_lr=6.0)
    assert decide(held, evidence) == Next((Query(3),))
    evidence[3] = evidence[3].add("bad").weigh(1.5)
    assert decide(held, evidence) == Next((Query(2),))
    evidence[2] = evidence[2].add("good").weigh(-1.5)
    found = decide(held, evidence)
    assert isinstance(found, Found) and found.index == 3


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 200), st.data())
def test_steering_steps_find_the_culprit_and_name_it_on_the_answer_ratio(n: int, data: st.DataObject) -> None:
    """Steps that stop early (a ratio of 0.5 to 3 on the right side) steer the search to the
    culprit; it is named only once its own steps and its parent's reach the answer ratio, or
    they have spent their steps (below the confidence asked: as the best guess in the range that
    holds it)."""
    bound = 6.0
    culprit = data.draw(st.integers(1, n))
    held = SearchProblem(n=n, mode="likelihood", confidence=0.99, answer_log_lr=bound)
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    for _ in range(6 * n):
        decision = decide(held, evidence)
        if not isinstance(decision, Next):
            break
        for q in decision.queries:
            bad = q.index >= culprit
            strength = data.draw(st.floats(0.5, 3.0))
            evidence[q.index] = evidence.get(q.index, Evidence()).add("bad" if bad else "good").weigh(
                strength if bad else -strength)
    if isinstance(decision, Narrowed):
        assert decision.figures["best_guess"] == culprit and decision.figures["posterior"] < held.confidence
        assert decision.lo < culprit <= decision.hi and decision.figures["range_posterior"] >= held.confidence
    else:
        assert isinstance(decision, Found) and decision.index == culprit and decision.confidence >= held.confidence
    for position, side in ((culprit, 1.0), (culprit - 1, -1.0)):
        ev = evidence.get(position, Evidence())
        assert position in (0, n) or side * ev.log_lr >= bound or ev.good + ev.bad >= MAX_STEPS


def test_an_answer_short_of_its_confidence_asks_its_spent_parent_again() -> None:
    """Three steering steps at the culprit 2 leaned good (-2.6 in all) and every telling position
    has spent MAX_STEPS: without an answer ratio the search leans to 3 at 93%, a best guess it
    names inside the range that holds the confidence asked; held to one, it asks 2 again (up to
    ANSWER_MAX_STEPS), and names 2 once its steps say so."""
    evidence = {0: Evidence(good=1), 8: Evidence(bad=1), 1: Evidence(good=3).weigh(-20.0),
                2: Evidence(good=2, bad=1).weigh(-2.6), 3: Evidence(bad=3).weigh(8.5)}
    for i in range(4, 8):
        evidence[i] = Evidence(bad=1).weigh(8.0)
    guess = decide(problem(8), evidence)
    assert isinstance(guess, Narrowed) and guess.figures["best_guess"] == 3 and guess.figures["posterior"] < 0.99
    assert (guess.lo, guess.hi) == (1, 3) and guess.figures["range_posterior"] >= 0.99
    held = SearchProblem(n=8, mode="likelihood", confidence=0.99, answer_log_lr=6.0)
    assert decide(held, evidence) == Next((Query(2),))
    evidence[2] = evidence[2].add("bad").weigh(4.0).add("bad").weigh(4.0)
    found = decide(held, evidence)
    assert isinstance(found, Found) and found.index == 2 and found.confidence >= 0.99


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 100), st.data())
def test_steering_steps_that_err_answer_at_the_confidence_or_with_every_step_spent(
        n: int, data: st.DataObject) -> None:
    """Steering steps on the wrong side one time in five: the answer, held to a ratio of its
    own, stops below the confidence asked (a best guess in the range that holds it) only once every
    position that could still move it has spent ANSWER_MAX_STEPS; a culprit found is as sure as asked."""
    culprit = data.draw(st.integers(1, n))
    held = SearchProblem(n=n, mode="likelihood", confidence=0.99, answer_log_lr=6.0)
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    for _ in range(ANSWER_MAX_STEPS * n + 2):
        decision = decide(held, evidence)
        if not isinstance(decision, Next):
            break
        for q in decision.queries:
            erred = data.draw(st.sampled_from([False] * 4 + [True]))
            bad = (q.index >= culprit) != erred
            strength = data.draw(st.floats(0.5, 3.0))
            evidence[q.index] = evidence.get(q.index, Evidence()).add("bad" if bad else "good").weigh(
                strength if bad else -strength)
    assert not isinstance(decision, Next)
    assert not isinstance(decision, Found) or decision.confidence >= held.confidence
    if isinstance(decision, Narrowed) and "best_guess" in decision.figures:
        cumulative = np.cumsum(change_point_posterior(n, evidence))[:-1]
        telling = TELLING_SHARE * (1 - held.confidence)
        for x in range(1, n):
            if telling < cumulative[x - 1] < 1 - telling:
                ev = evidence.get(x, Evidence())
                assert ev.good + ev.bad >= ANSWER_MAX_STEPS


def test_an_answer_its_spent_parent_contradicts_is_a_range_the_steps_agree_on() -> None:
    """Commit 7's three steps say bad (+7, past the answer ratio 6), yet the ends' shared error
    (one node here) lets the good side explain it, and the posterior names the bad end 8. Held to
    the ratio, the search names no culprit its parent's own steps contradict: the range from the
    nearest commit judged good by the ratio (6) to 8. The posterior alone still names 8."""
    evidence = {0: Evidence(good=1), 8: Evidence(bad=1),
                7: Evidence(bad=MAX_STEPS).weigh(Weight(7.0, good=(0.0,), bad=(-20.0,)))}
    for i in range(1, 7):
        evidence[i] = Evidence(good=1).weigh(-8.0)
    alone = decide(problem(8), evidence)
    assert isinstance(alone, Found) and alone.index == 8 and alone.confidence > 0.99
    held = SearchProblem(n=8, mode="likelihood", confidence=0.99, answer_log_lr=6.0)
    decision = decide(held, evidence)
    assert isinstance(decision, Narrowed) and (decision.lo, decision.hi) == (6, 8)
    assert decision.figures["disagreeing_culprit"] == 8


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 30), st.data())
def test_no_answer_is_named_that_its_neighbours_own_steps_contradict(n: int, data: st.DataObject) -> None:
    """Histories whose every inner commit has spent its steps, each weighed by a ratio of its own
    and node terms of the ends' shared error that may disagree with it: a culprit named is never
    one whose own steps, or its parent's, go against it by the answer ratio; a range it names
    instead holds the culprit the posterior named and has no commit outside it so judged against it."""
    bound = 6.0
    held = SearchProblem(n=n, mode="likelihood", confidence=0.99, answer_log_lr=bound)
    evidence = {0: Evidence(good=1), n: Evidence(bad=1)}
    for i in range(1, n):
        ratio = data.draw(st.floats(-15.0, 15.0))
        nodes = Weight(ratio, good=(data.draw(st.floats(-20.0, 0.0)),), bad=(data.draw(st.floats(-20.0, 0.0)),))
        evidence[i] = Evidence(good=ANSWER_MAX_STEPS).weigh(nodes)
    decision = decide(held, evidence)
    own = {i: evidence[i].log_lr for i in range(1, n)}
    if isinstance(decision, Found):
        assert own.get(decision.index, 0.0) > -bound and own.get(decision.index - 1, 0.0) < bound
    elif isinstance(decision, Narrowed) and "best_guess" in decision.figures:
        guess = int(decision.figures["best_guess"])
        assert own.get(guess, 0.0) > -bound and own.get(guess - 1, 0.0) < bound
    elif isinstance(decision, Narrowed) and "disagreeing_culprit" in decision.figures:
        assert all(v < bound for i, v in own.items() if i <= decision.lo)
        assert all(v > -bound for i, v in own.items() if i >= decision.hi)
        assert decision.lo < decision.figures["disagreeing_culprit"] <= decision.hi and decision.hi - decision.lo > 1
    else:
        assert not isinstance(decision, Next)
