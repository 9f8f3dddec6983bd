"""How many times a run that failed on the host is tried again: as often as the host's own failure
rate says it takes to make losing a trial rare.

A host that keeps succeeding between failures is a working host, however often it fails: a fixed
budget of retries loses trials on a host that fails often (at 37% of attempts failed, four attempts
lose one trial in fifty) and wastes time on a host that has stopped. So the session counts its
attempts (a failed one is a journaled retry, a finished one a journaled trial, so a resumed session
keeps the count) and estimates the host's failure rate p with a Beta posterior over them. A trial
gets the fewest attempts k whose all failing is at most LOSS likely under that posterior
(E[p^k], which the uncertainty of a short record makes larger than the estimate's own k-th power).
A trial whose k attempts all failed is what a working host at that rate does less than once in
1/LOSS trials: the host has stopped working, and the trial is given up (at an end of the range the
run stops with exit 5). A budget the user gives (`--retries`, the recipe's `trials.retries`)
bounds k from above.
"""

from __future__ import annotations

from dataclasses import dataclass

LOSS = 1e-4  # the chance a working host's failures may cost a trial
# The prior: as if a host had failed once in ten attempts before the session began (a host that
# mostly works; its own attempts soon outweigh this).
PRIOR_FAILURES = 1.0
PRIOR_SUCCESSES = 9.0
MIN_ATTEMPTS = 2  # one retry at least, however rarely the host fails
MAX_ATTEMPTS = 21  # the recipe's largest trials.retries (20) and the first run


@dataclass(frozen=True)
class HostRecord:
    """The attempts a session made on its host: those that failed on the host and those that ran."""

    failures: int = 0
    successes: int = 0

    @property
    def attempts(self) -> int:
        return self.failures + self.successes

    @property
    def failure_rate(self) -> float:
        """The posterior mean of the host's failure rate."""
        return (PRIOR_FAILURES + self.failures) / (PRIOR_FAILURES + PRIOR_SUCCESSES + self.attempts)


def all_fail_chance(record: HostRecord, attempts: int) -> float:
    """The posterior predictive chance that `attempts` attempts in a row all fail: E[p^k] under
    Beta(PRIOR_FAILURES + failures, PRIOR_SUCCESSES + successes)."""
    failed = PRIOR_FAILURES + record.failures
    total = failed + PRIOR_SUCCESSES + record.successes
    chance = 1.0
    for i in range(attempts):
        chance *= (failed + i) / (total + i)
    return chance


def attempts_allowed(record: HostRecord, bound: int | None = None, loss: float = LOSS) -> int:
    """The attempts one trial gets on a host with `record`: the fewest whose all failing is at most
    `loss` likely (MIN_ATTEMPTS at least, MAX_ATTEMPTS at most), and at most `bound` + 1 where the
    user bounded the retries (`bound` retries: that many attempts after the first)."""
    most = MAX_ATTEMPTS if bound is None else min(MAX_ATTEMPTS, bound + 1)
    attempts = MIN_ATTEMPTS
    while attempts < MAX_ATTEMPTS and all_fail_chance(record, attempts) > loss:
        attempts += 1
    return max(1, min(attempts, most))


def stopped_working(record: HostRecord, streak: int, bound: int | None = None, loss: float = LOSS) -> bool:
    """Whether `streak` failed attempts in a row of one trial are more than the host's rate
    explains (or more than the user's bound allows): the trial is given up."""
    return streak >= attempts_allowed(record, bound, loss)


def rate_said(record: HostRecord) -> str:
    """The estimate as a report line gives it: `host failure rate estimated at 31% (15 of 41 attempts
    failed, over a prior of 1 in 10)`."""
    return (f"host failure rate estimated at {record.failure_rate:.0%} ({record.failures} of {record.attempts} "
            f"attempt{'s' if record.attempts != 1 else ''} failed, over a prior of 1 in "
            f"{PRIOR_FAILURES + PRIOR_SUCCESSES:.0f})")
