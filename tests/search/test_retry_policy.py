"""The retry budget follows the host: property tests of search/retry_policy.py, and a
simulation of hosts that fail at a steady rate (a working host loses a trial rarely) or stop
working (given up after a few attempts, not after MAX_ATTEMPTS)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bisect_npu.orchestration.running.infrastructure import RetryPolicy
from bisect_npu.search.retry_policy import (
    LOSS,
    MAX_ATTEMPTS,
    MIN_ATTEMPTS,
    HostRecord,
    all_fail_chance,
    attempts_allowed,
    rate_said,
    stopped_working,
)

counts = st.integers(min_value=0, max_value=2000)
records = st.builds(HostRecord, counts, counts)


@given(records, st.one_of(st.none(), st.integers(min_value=0, max_value=20)))
def test_the_budget_is_within_its_bounds_and_the_users_bound(record: HostRecord, bound: int | None) -> None:
    allowed = attempts_allowed(record, bound)
    assert 1 <= allowed <= MAX_ATTEMPTS
    if bound is not None:
        assert allowed <= bound + 1
        assert allowed == min(attempts_allowed(record), bound + 1)


@given(records)
def test_the_budget_is_the_fewest_attempts_that_make_a_loss_rare(record: HostRecord) -> None:
    allowed = attempts_allowed(record)
    if allowed < MAX_ATTEMPTS:
        assert all_fail_chance(record, allowed) <= LOSS
    if allowed > MIN_ATTEMPTS:
        assert all_fail_chance(record, allowed - 1) > LOSS


@given(records, st.integers(min_value=1, max_value=50))
def test_more_failures_never_shrink_the_budget_and_more_successes_never_grow_it(record: HostRecord,
                                                                                 more: int) -> None:
    allowed = attempts_allowed(record)
    assert attempts_allowed(HostRecord(record.failures + more, record.successes)) >= allowed
    assert attempts_allowed(HostRecord(record.failures, record.successes + more)) <= allowed


@given(records, st.integers(min_value=1, max_value=8))
def test_the_chance_that_all_fail_falls_with_each_attempt(record: HostRecord, attempts: int) -> None:
    assert 0.0 < all_fail_chance(record, attempts + 1) < all_fail_chance(record, attempts) <= 1.0


@given(records, st.integers(min_value=0, max_value=30))
def test_a_trial_is_given_up_exactly_when_its_streak_reaches_the_budget(record: HostRecord, streak: int) -> None:
    assert stopped_working(record, streak) == (streak >= attempts_allowed(record))


def test_a_host_that_fails_often_gets_more_attempts_than_one_that_rarely_does() -> None:
    rare = attempts_allowed(HostRecord(failures=2, successes=200))
    often = attempts_allowed(HostRecord(failures=150, successes=250))
    assert rare <= 4 < 9 <= often < MAX_ATTEMPTS
    assert 0.37 ** often <= LOSS  # what the old fixed budget (4 attempts) lost one trial in fifty to


def test_the_estimate_and_its_words() -> None:
    record = HostRecord(failures=15, successes=26)
    assert math.isclose(record.failure_rate, 16 / 51)
    assert rate_said(record) == "host failure rate estimated at 31% (15 of 41 attempts failed, over a prior of 1 in 10)"


def simulate(rate: float, trials: int, rng: random.Random, dies_after: int | None = None) -> tuple[int, int]:
    """`trials` trials on a host whose attempts fail at `rate` (every attempt from the
    `dies_after`-th trial on, where given), each retried while the policy allows; (trials lost,
    attempts made on the trials after it died)."""
    policy = RetryPolicy(None, 0.0)
    lost = after_death = 0
    for trial in range(trials):
        dead = dies_after is not None and trial >= dies_after
        streak = 0
        while True:
            after_death += dead
            if dead or rng.random() < rate:
                streak += 1
                if policy.given_up(streak):
                    lost += 1
                    break
            else:
                policy.ran(streak, 1)
                break
    return lost, after_death


@pytest.mark.parametrize("rate", [0.05, 0.2, 0.37, 0.5])
def test_a_working_host_loses_almost_no_trial(rate: float) -> None:
    """Over fixed seeds, not drawn ones: a loss is a rare event by design (about 1 session in 200
    loses two trials at a 50% rate), so any one drawn session may lose a second trial."""
    losses = [simulate(rate, 300, random.Random(seed))[0] for seed in range(200)]
    assert sum(losses) / (200 * 300) < 1e-3
    assert max(losses) <= 3


def test_a_working_host_at_37_percent_loses_fewer_than_one_trial_in_a_thousand() -> None:
    """Tuned on seeds 0-9 (the property above draws its own); this reports seeds 100-139."""
    lost = sum(simulate(0.37, 500, random.Random(seed))[0] for seed in range(100, 140))
    assert lost / (40 * 500) < 1e-3


def test_a_host_that_stops_working_is_given_up_in_a_few_attempts_a_trial() -> None:
    lost, attempts = simulate(0.1, 40, random.Random(1), dies_after=30)
    assert lost == 10  # every trial after it died, and only those
    assert attempts <= 10 * 6  # a handful each, never MAX_ATTEMPTS: its rate said it worked
