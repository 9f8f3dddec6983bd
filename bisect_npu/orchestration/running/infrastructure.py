"""The one place that tells a run's infrastructure failure from a verdict.

A probe run that failed because of the host (the engine did not start, its port or card was still
taken, the engine was killed, the harness lost its connection to the server) says nothing about
the commit: it is retried (`RetryPolicy`, in the evaluator). Everything else a run shows (a loop, a wrong
score, a failing test, a crash inside the trial, a run past --timeout) is the commit's own and is
judged as before: never retried into a different answer. A build that failed on the network
(builders/failures.py's `BuildUnreachable`) is retried with the same policy.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bisect_npu.defaults import RETRY_BACKOFF_S
from bisect_npu.probe.harness import HARNESS_FAILED_EXIT
from bisect_npu.search.retry_policy import HostRecord, attempts_allowed, rate_said

FailureKind = Literal["port_in_use", "card_busy", "engine_start", "engine_killed", "transport", "network",
                      "node_lost"]

# What the host did wrong, in the report's words.
FAILURE_WORDS: dict[FailureKind, str] = {
    "port_in_use": "a port was still taken",
    "card_busy": "the card was still busy",
    "engine_start": "the engine did not start",
    "engine_killed": "the engine was killed",
    "transport": "the harness lost its connection to the server",
    "network": "a build could not reach the network",  # builders/failures.py tells it, not `classify`
    "node_lost": "a node of the engine was lost",
}

# First match wins: the more telling cause first (a start that failed on a taken port is "port").
_PATTERNS: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    # An engine across hosts (execute/ray_nodes.py): one of its nodes went, whatever the others then said.
    ("node_lost", re.compile(r"^node \d+ of the engine \(ray node \S+\) was lost: ")),
    ("port_in_use", re.compile(r"address already in use|EADDRINUSE|port \d+ is (already )?in use|"
                               r"port \d+ (is )?already (in use|taken)", re.IGNORECASE)),
    ("card_busy", re.compile(r"device (or resource )?busy|npu memory (is )?not (yet )?free|"
                             r"card memory (is )?still (held|in use)", re.IGNORECASE)),
    ("engine_start", re.compile(r"server exited with -?\d+ before /health answered|server not healthy after \d+|"
                                r"engine did not start", re.IGNORECASE)),
    ("transport", re.compile(r"connection (refused|reset|aborted)|ECONNREFUSED|ECONNRESET|RemoteDisconnected|"
                             r"broken pipe|HTTP Error 5\d\d|answered 5\d\d|\b5\d\d (Server Error|Internal|Bad "
                             r"Gateway|Service Unavailable|Gateway Timeout)|IncompleteRead|"
                             r"timed out (reaching|connecting to) the server|ConnectTimeout|ReadTimeout",
                             re.IGNORECASE)),
)
_READ_BYTES = 64 * 1024  # a log's end holds the failure; its start may be gigabytes of engine output


@dataclass(frozen=True)
class InfrastructureFailure:
    """Why a run failed without judging its commit: the kind and the log line that says so."""

    kind: FailureKind
    line: str

    def __str__(self) -> str:
        return f"{FAILURE_WORDS[self.kind]}: {self.line}"


def classify(returncode: int, timed_out: bool, log_text: str) -> InfrastructureFailure | None:
    """The infrastructure failure a finished probe run shows, or None when what it shows is the
    commit's (or it succeeded). A run past --timeout is never one here: a hang may be the
    regression (--timeout-is decides). A run killed by a signal (negative status: the OOM killer,
    a card reset) is one."""
    if returncode == 0 or timed_out:
        return None
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for kind, pattern in _PATTERNS:
        if kind == "transport" and returncode not in (HARNESS_FAILED_EXIT, 3):
            continue
        found = next((line for line in reversed(lines) if pattern.search(line)), None)
        if found is not None:
            return InfrastructureFailure(kind, found[:300])
    if returncode < 0:
        return InfrastructureFailure("engine_killed", f"the probe was killed by signal {-returncode}")
    return None


def classify_run(returncode: int, timed_out: bool, log_path: str | Path) -> InfrastructureFailure | None:
    """`classify` over the end of a run's log file (an unreadable log classifies as nothing)."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - _READ_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        text = ""
    return classify(returncode, timed_out, text)


class HostTally:
    """The session's HostRecord as its slots add to it (thread-safe)."""

    def __init__(self, record: HostRecord | None = None) -> None:
        self._record = record or HostRecord()
        self._lock = threading.Lock()

    @property
    def record(self) -> HostRecord:
        with self._lock:
            return self._record

    def add(self, failures: int = 0, successes: int = 0) -> None:
        with self._lock:
            self._record = HostRecord(self._record.failures + failures, self._record.successes + successes)


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and after how long, a run that failed on the host is run again: as often as the
    session's record of its host says (search/retry_policy.py), never more than `retries`
    times where the user gave a bound."""

    retries: int | None = None  # the user's bound (--retries, the recipe's trials.retries); None: the host's rate
    backoff_s: float = RETRY_BACKOFF_S
    host: HostTally = field(default_factory=HostTally)

    def allowed(self) -> int:
        """The attempts a trial gets now."""
        return attempts_allowed(self.host.record, self.retries)

    def spent(self, journaled: int) -> int:
        """The attempts of this budget already spent, of `journaled` journaled before a resume: a
        budget they used up (the run stopped on it, exit 5, and was resumed) starts anew."""
        return journaled % self.allowed()

    def given_up(self, streak: int) -> bool:
        """Whether a trial whose `streak` attempts in a row failed is given up: more failures in a row
        than the host's rate explains (it stopped working), or the user's bound spent."""
        return streak >= self.allowed()

    def ran(self, failures: int, trials: int) -> None:
        """A run finished `trials` trials after `failures` failed attempts: the working host's record.
        The failures of a trial given up are left out of it: they tell that the host stopped."""
        self.host.add(failures, trials)

    def said(self) -> str:
        """The host's rate and the user's bound, as a stop's message gives them."""
        bound = self.retries
        return rate_said(self.host.record) + ("" if bound is None else
                                              f"; at most {bound} retr{'y' if bound == 1 else 'ies'} as asked")

    @staticmethod
    def attempts_said(count: int) -> str:
        """`1 attempt`, `3 attempts`: how the stop's message counts them."""
        return f"{count} attempt{'s' if count != 1 else ''}"

    def delay(self, attempt: int) -> float:
        """Seconds to wait before the retry after the `attempt`-th failure (1-based): doubling, at most 5 min."""
        return min(self.backoff_s * 2.0 ** (attempt - 1), 300.0)
