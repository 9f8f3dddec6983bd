"""What a settings search knows, kept from its journal's records as they are appended, as
`state.SessionState` keeps a commit session's and in the same book of attempts (`state.Attempts`):
each configuration's records, the trials and failed attempts an interruption cut short, the trial
numbers used, the host's record of attempts, the end. Built once from the journal the search opens
with, then one record at a time (`apply`, which the search's one way of journaling calls), so
nothing rereads the journal; a resumed search builds the same state from the same records.

A record the host's failures left unjudged before this process (`_stale`) is not evidence: its
configuration runs again, its attempts numbered on from that record's with the budget they left,
as a commit search runs again an end the host left unjudged (`state.given_up_at_ends`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.opening.state import Attempts, StoreLedger
from bisect_npu.records import RetryRun, TrialRun
from bisect_npu.search import Evidence
from bisect_npu.search.ddmin import Configuration
from bisect_npu.search.retry_policy import HostRecord
from bisect_npu.settings_journal import (
    ConfigurationRecord,
    ConfigurationRetry,
    ConfigurationTrial,
    ReferenceRecord,
    ReferenceTrial,
    SettingsEnd,
    SettingsEntry,
)

Judged = ConfigurationRecord | ReferenceRecord


class ConfigurationState(StoreLedger[str]):
    """The records a settings search's decisions read, applied in journal order; its configurations'
    verdicts (by recipe digest) in the store's ledger. Thread-safe: slots journal at once."""

    def __init__(self, noisy: bool, entries: Iterable[SettingsEntry] = ()) -> None:
        super().__init__()
        self.noisy = noisy
        self._lock = threading.Lock()
        self._applied = 0
        self._opened = 0  # entries journaled before this process
        self._order: list[tuple[int, ConfigurationTrial | ConfigurationRecord]] = []  # evidence, in journal order
        self._judged: list[tuple[int, Judged]] = []
        self._attempts: Attempts[tuple[str, bool]] = Attempts()  # by (digest, at the reference commit)
        self.end: SettingsEnd | None = None
        for entry in entries:
            self.apply(entry)
        self._opened = self._applied

    def apply(self, entry: SettingsEntry) -> None:
        with self._lock:
            at = self._applied
            self._applied += 1
            if isinstance(entry, ConfigurationTrial | ReferenceTrial):
                self._attempts.trial((entry.digest, isinstance(entry, ReferenceTrial)), entry)
                if isinstance(entry, ConfigurationTrial):
                    self._order.append((at, entry))
            elif isinstance(entry, ConfigurationRetry):
                self._attempts.retry((entry.digest, entry.reference), entry)
            elif isinstance(entry, ConfigurationRecord | ReferenceRecord):
                self._apply_record(at, entry)
            else:
                self.end = entry

    def _apply_record(self, at: int, record: Judged) -> None:
        reference = isinstance(record, ReferenceRecord)
        self._judged.append((at, record))
        self._attempts.judged((record.digest, reference), given_up=record.host_failure is not None)
        if isinstance(record, ConfigurationRecord):
            self._order.append((at, record))
            self.note(record.digest, record.verdict.kind.value, stored=record.stored is not None)

    def _stale(self, at: int, record: Judged) -> bool:
        return record.host_failure is not None and at < self._opened

    # -- what the search reads ------------------------------------------------------------------

    def records(self, configuration: Configuration) -> list[ConfigurationRecord]:
        """The configuration's records in the search (a --vary value's check aside), in order."""
        with self._lock:
            return [r for _, r in self._judged if isinstance(r, ConfigurationRecord) and r.value_check is None
                    and frozenset(r.configuration) == configuration]

    def value_records(self, check: str) -> list[ConfigurationRecord]:
        """The records of a --vary value's check, but those the host left unjudged before this process."""
        with self._lock:
            return [r for at, r in self._judged if isinstance(r, ConfigurationRecord) and r.value_check == check
                    and not self._stale(at, r)]

    def reference_record(self, digest: str) -> ReferenceRecord | None:
        """A configuration's judged run at the reference commit (one the host left unjudged before
        this process runs again)."""
        with self._lock:
            return next((r for at, r in self._judged if isinstance(r, ReferenceRecord) and r.digest == digest
                         and not self._stale(at, r)), None)

    def failed_reference(self, configuration: Configuration) -> ReferenceRecord | None:
        """The configuration's first run at the reference commit that was not judged good."""
        with self._lock:
            return next((r for _, r in self._judged if isinstance(r, ReferenceRecord)
                         and frozenset(r.configuration) == configuration and r.verdict.kind != VerdictKind.GOOD), None)

    def tried(self) -> int:
        """How many configurations (recipe digests) have a record."""
        with self._lock:
            return len({r.digest for _, r in self._judged if isinstance(r, ConfigurationRecord)})

    def evidence(self, *, without_stored: bool = False) -> dict[Configuration, Evidence]:
        """Each configuration's evidence (ddmin's): noisy, its trials' outcomes; exact, its records'
        verdicts. `without_stored`: the verdict store's left out, once one was contradicted. Records
        the host left unjudged before this process are left out: those configurations run again."""
        with self._lock:
            order = list(self._order)
        evidence: dict[Configuration, Evidence] = {}
        for at, entry in order:
            key = frozenset(entry.configuration)
            if isinstance(entry, ConfigurationTrial):
                if self.noisy and entry.outcome in (VerdictKind.GOOD, VerdictKind.BAD):
                    evidence[key] = evidence.get(key, Evidence()).add(
                        "bad" if entry.outcome == VerdictKind.BAD else "good")
                continue
            if entry.value_check is not None or (without_stored and entry.stored is not None) or \
                    self._stale(at, entry):
                continue
            seen = evidence.get(key, Evidence())
            if entry.stored is not None and self.noisy:
                seen = Evidence(seen.good + entry.stored.good, seen.bad + entry.stored.bad, seen.skipped)
            elif not self.noisy or (entry.verdict.kind == VerdictKind.SKIP and
                                    not any(t.outcome in (VerdictKind.GOOD, VerdictKind.BAD) for t in entry.trials)):
                seen = seen.add(entry.verdict.kind.value)
            evidence[key] = seen
        return evidence

    @property
    def host_record(self) -> HostRecord:
        with self._lock:
            return self._attempts.host_record

    def pending_trials(self, digest: str, *, reference: bool = False) -> list[TrialRun]:
        """Trials journaled after the configuration's last record: an interrupted run's work."""
        with self._lock:
            return self._attempts.pending_trials((digest, reference))

    def pending_retries(self, digest: str, *, reference: bool = False) -> list[RetryRun]:
        """Failed attempts journaled after the configuration's last record (the budget goes on from them)."""
        with self._lock:
            return self._attempts.pending_retries((digest, reference))

    def given_up(self, digest: str, *, reference: bool = False) -> list[RetryRun]:
        """The attempts of the configuration's records the host left unjudged since it was last judged."""
        with self._lock:
            return self._attempts.given_up((digest, reference))

    def next_trial(self, digest: str) -> int:
        """Trial numbers grow per configuration, so more trials never repeat a seed."""
        with self._lock:
            return self._attempts.next_trial((digest, False))

    def outcomes(self, digest: str) -> list[VerdictKind | None]:
        """Every trial's outcome this search ran of a configuration."""
        with self._lock:
            return self._attempts.outcomes((digest, False))
