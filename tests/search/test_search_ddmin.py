"""The settings search (ddmin over differing keys): a 1-minimal failing set for any oracle, never
resting on a configuration it could not judge, never the same configuration twice, within ddmin's
bound, resumable; noisy readings from trial counts."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bisect_npu.search import EndsWrong, Evidence
from bisect_npu.search.ddmin import (
    Ask,
    Configuration,
    SettingsProblem,
    Trigger,
    Unresolved,
    decide_ddmin,
    reading,
    rests_on,
    worst_case_tests,
)

Oracle = Callable[[Configuration], str]


def drive(problem: SettingsProblem, oracle: Oracle,
          ) -> tuple[Trigger | EndsWrong | Unresolved, dict[Configuration, Evidence]]:
    """The caller's loop: ask, run, feed back; a configuration asked again must be one still undecided."""
    evidence: dict[Configuration, Evidence] = {}
    for _ in range(10_000):
        decision = decide_ddmin(problem, evidence)
        if not isinstance(decision, Ask):
            return decision, evidence
        if problem.mode == "exact":
            assert decision.configuration not in evidence, "asked the same configuration twice"
        seen = evidence.get(decision.configuration, Evidence())
        for _ in range(decision.trials):
            seen = seen.add(oracle(decision.configuration))  # type: ignore[arg-type]
        evidence[decision.configuration] = seen
    raise AssertionError("the search never ended")


def hashed_oracle(keys: int, seed: int, bad_share: float, skip_share: float) -> Oracle:
    """Any oracle at all (non-monotone): each configuration's verdict drawn once from its own seed;
    the good variant is good and the bad case bad, as the ends must be."""
    full = frozenset(range(keys))

    def oracle(configuration: Configuration) -> str:
        if configuration == full:
            return "bad"
        if not configuration:
            return "good"
        draw = random.Random(f"{seed}-{sorted(configuration)}").random()
        return "bad" if draw < bad_share else "skip" if draw < bad_share + skip_share else "good"

    return oracle


@settings(max_examples=300, deadline=None)
@given(keys=st.integers(1, 9), seed=st.integers(0, 10**6), bad_share=st.floats(0.0, 1.0),
       skip_share=st.floats(0.0, 0.3))
def test_any_oracle_gives_a_one_minimal_failing_set_within_the_bound(keys: int, seed: int, bad_share: float,
                                                                    skip_share: float) -> None:
    """A trigger only where it and each configuration with one of its keys set back were judged
    (bad, and good: 1-minimal); else Unresolved, naming the ones that could not be."""
    oracle = hashed_oracle(keys, seed, bad_share, skip_share)
    problem = SettingsProblem(keys)
    answer, evidence = drive(problem, oracle)
    assert len(evidence) <= worst_case_tests(keys)
    if isinstance(answer, Unresolved):
        assert answer.configurations and oracle(answer.trigger) == "bad"
        assert set(answer.configurations) <= set(rests_on(problem, Trigger(answer.trigger)))
        assert all(oracle(c) == "skip" for c in answer.configurations)
        return
    assert isinstance(answer, Trigger)
    assert answer.keys and oracle(answer.keys) == "bad"
    for key in answer.keys:  # 1-minimal: setting any one key back makes it pass
        assert oracle(answer.keys - {key}) == "good"
    assert set(answer.readings) == set(evidence)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_unresolved_configurations_never_give_another_trigger(data: st.DataObject) -> None:
    """A monotone trigger, and configurations the host keeps from running anywhere but the ends:
    the true trigger, or Unresolved naming configurations it rests on that could not be judged."""
    keys = data.draw(st.integers(1, 10))
    trigger = frozenset(data.draw(st.sets(st.integers(0, keys - 1), min_size=1, max_size=min(keys, 3))))
    seed, share = data.draw(st.integers(0, 10**6)), data.draw(st.floats(0.0, 0.6))
    problem = SettingsProblem(keys)

    def oracle(configuration: Configuration) -> str:
        if configuration not in (problem.bad, problem.good) and \
                random.Random(f"{seed}-{sorted(configuration)}").random() < share:
            return "skip"
        return "bad" if trigger <= configuration else "good"

    answer, evidence = drive(problem, oracle)
    if isinstance(answer, Trigger):
        assert answer.keys == trigger
    else:
        assert isinstance(answer, Unresolved) and answer.configurations
        assert all(evidence[c].skipped for c in answer.configurations)
        assert set(answer.configurations) <= set(rests_on(problem, Trigger(answer.trigger)))
    assert len(evidence) <= worst_case_tests(keys)


def test_the_issue_s_unjudged_async_alone_is_no_pass() -> None:
    """Two keys, the second the trigger, its configuration alone unjudged: no trigger of both."""
    problem = SettingsProblem(2)
    evidence = {problem.bad: Evidence(bad=1), problem.good: Evidence(good=1), frozenset({0}): Evidence(good=1),
                frozenset({1}): Evidence(skipped=True)}
    assert decide_ddmin(problem, evidence) == Unresolved((frozenset({1}),), frozenset({0, 1}))
    judged = decide_ddmin(problem, {**evidence, frozenset({1}): Evidence(bad=1)})
    assert isinstance(judged, Trigger) and judged.keys == frozenset({1})


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_monotone_oracle_gives_its_trigger(data: st.DataObject) -> None:
    keys = data.draw(st.integers(1, 16))
    trigger = frozenset(data.draw(st.sets(st.integers(0, keys - 1), min_size=1, max_size=min(keys, 3))))
    answer, evidence = drive(SettingsProblem(keys), lambda c: "bad" if trigger <= c else "good")
    assert isinstance(answer, Trigger) and answer.keys == trigger
    assert len(evidence) <= worst_case_tests(keys)


@settings(max_examples=100, deadline=None)
@given(keys=st.integers(2, 10), seed=st.integers(0, 10**6), order=st.randoms())
def test_evidence_in_any_order_gives_the_same_decisions(keys: int, seed: int, order: random.Random) -> None:
    """A resumed search rebuilds the evidence from its journal: the order must not matter."""
    oracle = hashed_oracle(keys, seed, 0.4, 0.1)
    problem = SettingsProblem(keys)
    answer, evidence = drive(problem, oracle)
    items = list(evidence.items())
    order.shuffle(items)
    assert decide_ddmin(problem, dict(items)) == answer
    partial = dict(items[: len(items) // 2])
    again = decide_ddmin(problem, partial)
    assert not isinstance(again, Ask) or again.configuration not in partial


@settings(max_examples=200, deadline=None)
@given(keys=st.integers(1, 9), seed=st.integers(0, 10**6), bad_share=st.floats(0.0, 1.0),
       skip_share=st.floats(0.0, 0.3))
def test_the_answer_rests_on_each_configuration_rests_on_names(keys: int, seed: int, bad_share: float,
                                                               skip_share: float) -> None:
    """What the verdict store's verdicts are confirmed by: every configuration `rests_on` names was
    tested, and any one of them judged otherwise (a stored verdict that was wrong) changes the answer."""
    problem = SettingsProblem(keys)
    answer, evidence = drive(problem, hashed_oracle(keys, seed, bad_share, skip_share))
    assume(isinstance(answer, Trigger))
    assert isinstance(answer, Trigger)
    resting = rests_on(problem, answer)
    assert resting[0] == answer.keys and len(resting) == len(answer.keys) + 1
    for configuration in resting:
        assert configuration in evidence
        wrong = Evidence(good=1) if configuration == answer.keys else Evidence(bad=1)
        assert decide_ddmin(problem, {**evidence, configuration: wrong}) != answer
    assert rests_on(problem, Ask(problem.good)) == ()


def test_an_end_judged_wrong_rests_on_that_end() -> None:
    problem = SettingsProblem(3)
    good_is_bad = decide_ddmin(problem, {problem.bad: Evidence(bad=1), problem.good: Evidence(bad=1)})
    bad_is_good = decide_ddmin(problem, {problem.bad: Evidence(good=1)})
    assert isinstance(good_is_bad, EndsWrong) and rests_on(problem, good_is_bad) == (problem.good,)
    assert isinstance(bad_is_good, EndsWrong) and rests_on(problem, bad_is_good) == (problem.bad,)


def test_the_ends_come_first_and_a_bad_good_variant_is_refused() -> None:
    problem = SettingsProblem(3)
    assert decide_ddmin(problem, {}) == Ask(problem.bad)
    assert decide_ddmin(problem, {problem.bad: Evidence(bad=1)}) == Ask(problem.good)
    assert decide_ddmin(problem, {problem.bad: Evidence(bad=1), problem.good: Evidence(bad=1)}) == EndsWrong("good")
    assert decide_ddmin(problem, {problem.bad: Evidence(good=1)}) == EndsWrong("bad")
    skipped = decide_ddmin(problem, {problem.bad: Evidence(skipped=True)})
    assert isinstance(skipped, EndsWrong) and skipped.which == "bad" and skipped.figures["skipped"] == 1.0


def rated_oracle(trigger: Configuration, bad_rate: float, good_rate: float, rng: np.random.Generator) -> Oracle:
    def oracle(configuration: Configuration) -> str:
        rate = bad_rate if trigger <= configuration else good_rate
        return "bad" if rng.random() < rate else "good"

    return oracle


@pytest.mark.parametrize(("bad_rate", "good_rate"), [(0.4, 0.0), (0.9, 0.1), (1.0, 0.0)])
def test_noisy_readings_find_the_trigger(bad_rate: float, good_rate: float) -> None:
    """Repeated trials decide each configuration; the search names the trigger nearly always."""
    rng = np.random.default_rng(7)
    problem = SettingsProblem(6, mode="noisy", confidence=0.99, batch=4, max_trials=48)
    right = 0
    for run in range(40):
        trigger = frozenset({run % 6, (run * 5 + 1) % 6}) if run % 3 == 0 else frozenset({run % 6})
        answer, evidence = drive(problem, rated_oracle(trigger, bad_rate, good_rate, rng))
        assert isinstance(answer, Trigger)
        assert len(evidence) <= worst_case_tests(6)
        assert all(seen.trials <= problem.max_trials for seen in evidence.values())
        right += answer.keys == trigger
    assert right >= 38


def test_noisy_ends_with_one_rate_are_refused() -> None:
    """A good variant that fails as often as the bad case: exit 4, as for commit ends."""
    rng = np.random.default_rng(3)
    problem = SettingsProblem(4, mode="noisy", confidence=0.95, batch=8, max_trials=64)
    answer, _ = drive(problem, lambda c: "bad" if rng.random() < 0.5 else "good")
    assert isinstance(answer, EndsWrong)


def test_a_noisy_reading_waits_for_enough_trials() -> None:
    problem = SettingsProblem(2, mode="noisy", confidence=0.99, batch=5, max_trials=20)
    ends = {problem.bad: Evidence(good=6, bad=4), problem.good: Evidence(good=10)}
    # The good variant's 10 passes leave room for a low rate: one failure is not conclusive, a few are.
    assert reading(problem, {**ends, frozenset({0}): Evidence(bad=1)}, frozenset({0})) is None
    assert reading(problem, {**ends, frozenset({0}): Evidence(bad=5)}, frozenset({0})) == "bad"
    assert reading(problem, {**ends, frozenset({0}): Evidence(good=2)}, frozenset({0})) is None
    assert reading(problem, {**ends, frozenset({0}): Evidence(good=20)}, frozenset({0})) == "good"


def drive_in_slots(problem: SettingsProblem, oracle: Oracle) -> tuple[Trigger | EndsWrong,
                                                                       dict[Configuration, Evidence], int]:
    """The caller's loop with slots: each ask and its `alongside` run as one round; the rounds run."""
    evidence: dict[Configuration, Evidence] = {}
    for rounds in range(10_000):
        decision = decide_ddmin(problem, evidence)
        if not isinstance(decision, Ask):
            return decision, evidence, rounds
        asks = [decision, *decision.alongside]
        assert len(asks) <= problem.slots
        assert not any(a.alongside for a in decision.alongside)
        configurations = [a.configuration for a in asks]
        assert len(set(configurations)) == len(configurations), "one configuration twice in a round"
        assert not set(configurations) & set(evidence), "asked a configuration already judged"
        for ask in asks:
            evidence[ask.configuration] = Evidence().add(oracle(ask.configuration))  # type: ignore[arg-type]
    raise AssertionError("the search never ended")


@settings(max_examples=200, deadline=None)
@given(keys=st.integers(1, 9), seed=st.integers(0, 10**6), bad_share=st.floats(0.0, 1.0),
       skip_share=st.floats(0.0, 0.3), slots=st.integers(2, 5))
def test_slots_give_the_answer_one_slot_gives_in_no_more_rounds(keys: int, seed: int, bad_share: float,
                                                                skip_share: float, slots: int) -> None:
    """Configurations run `slots` at a time: the same trigger as one at a time (the path is read from
    the evidence alone), in at most as many rounds, never more than ddmin's bound of configurations."""
    oracle = hashed_oracle(keys, seed, bad_share, skip_share)
    alone, alone_evidence = drive(SettingsProblem(keys), oracle)
    answer, evidence, rounds = drive_in_slots(SettingsProblem(keys, slots=slots), oracle)
    assert answer == alone
    assert set(alone_evidence) <= set(evidence) and len(evidence) <= worst_case_tests(keys)
    assert rounds <= len(alone_evidence)


def test_two_slots_ask_the_ends_together_then_both_halves() -> None:
    problem = SettingsProblem(4, slots=2)
    assert decide_ddmin(problem, {}) == Ask(problem.bad, alongside=(Ask(problem.good),))
    ends = {problem.bad: Evidence(bad=1), problem.good: Evidence(good=1)}
    assert decide_ddmin(problem, ends) == Ask(frozenset({0, 1}), alongside=(Ask(frozenset({2, 3})),))
    # The second half read as failing already: the first is asked alone (nothing past a failing one).
    assert decide_ddmin(problem, {**ends, frozenset({2, 3}): Evidence(bad=1)}) == Ask(frozenset({0, 1}))
