"""Verdicts that outlive a session, shared by the sessions of one host (or one CI runner).

A CI job that bisects again over a range it has seen should not pay for commits it has judged
already. Each verdict is kept under its `Scope` (the oracle's digest, the environment's digest and
the mode, plus the good end where the oracle compares against it), the commit and its build key,
and the session that judged it. Sessions read each other's verdicts and never their own: a noisy
session's stored tally is its own trials only, so summing over sessions counts each trial once.

SQLite from the standard library: its locking lets sessions running at once on one host write the
same file, which an append-only file would need its own locking for. A connection per call keeps
threads (a session's slots) and processes apart. The file lives on a local disk: SQLite's locks
are not to be trusted over NFS.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.observations import VerdictKind

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    oracle TEXT NOT NULL,
    environment TEXT NOT NULL,
    mode TEXT NOT NULL,
    reference TEXT NOT NULL,
    commit_sha TEXT NOT NULL,
    build_key TEXT NOT NULL,
    session TEXT NOT NULL,
    kind TEXT NOT NULL,
    good INTEGER NOT NULL,
    bad INTEGER NOT NULL,
    reason TEXT NOT NULL,
    facts TEXT NOT NULL,
    t REAL NOT NULL,
    PRIMARY KEY (oracle, environment, mode, reference, commit_sha, build_key, session)
);
CREATE INDEX IF NOT EXISTS verdicts_by_scope ON verdicts (oracle, environment, mode, kind);
"""


@dataclass(frozen=True)
class Scope:
    """What a verdict holds under: the oracle (a recipe's digest, a command's), the environment
    (a digest of the facts that change results, `facts` in words), the mode (exact verdicts and
    noisy tallies do not mix) and the reference (the good end's sha where the oracle compares
    against the good end's own runs, else empty)."""

    oracle: str
    environment: str
    mode: str
    reference: str = ""
    facts: str = ""


@dataclass(frozen=True)
class StoredVerdict:
    """One session's verdict of a commit: the step verdict, and its trials' tally (noisy mode)."""

    commit: str
    build_key: str
    session: str
    kind: VerdictKind
    good: int
    bad: int
    reason: str
    t: float


class StoreUnavailable(UsageError):
    """The store file cannot be used (it cannot be written, its lock is held past the timeout): a
    session goes on without it, as it does when the store fails in the middle of a run."""


class VerdictStore:
    """The store file at `path` (made on first use with its parent directories). A file found
    damaged when it is opened (not a database, pages that fail SQLite's integrity check) is moved
    aside, kept for inspection, and a new store takes its place: `set_aside` says so."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set_aside = ""  # the damage found when opening, and where the damaged file was moved
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if damage := self._damage():
                self._replace_damaged(damage)
            with self._connect() as db:
                db.executescript(_SCHEMA)
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version > _SCHEMA_VERSION:
                    raise UsageError(f"verdict store {path} was written by a newer bisect-npu (schema {version}); "
                                     "use that version, another --verdict-store, or --no-verdict-store")
                db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
        except (InfrastructureError, OSError) as exc:
            raise StoreUnavailable(f"cannot use verdict store {path} ({exc}); pass --verdict-store with a writable "
                                   "file on a local disk, or --no-verdict-store") from None

    def _damage(self) -> str:
        """What SQLite finds wrong with the file: its first integrity problem, or that it is no
        database at all ("" for a sound or missing one). A lock held past the timeout or a file
        that cannot be opened is no damage: InfrastructureError."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return ""
        try:
            db = sqlite3.connect(self.path, timeout=60)
            try:
                rows = db.execute("PRAGMA integrity_check(1)").fetchall()
            finally:
                db.close()
        except sqlite3.OperationalError as exc:  # locked, unreadable: the file may be sound
            raise InfrastructureError(f"verdict store {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:  # not a database, a malformed image
            return str(exc)
        return "" if rows == [("ok",)] else str(rows[0][0])

    def _replace_damaged(self, damage: str) -> None:
        """Move the damaged file (and its rollback journal) aside and start a new one, under a lock
        on the directory: of sessions that found it damaged at once, the first replaces it and the
        others find the new store sound."""
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(directory, fcntl.LOCK_EX)
            damage = self._damage()  # another session may have replaced it meanwhile
            if not damage:
                return
            aside = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            for suffix in ("-journal", "-wal", "-shm"):  # a stale journal must not meet the new file
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
            os.replace(self.path, aside)
        finally:
            os.close(directory)
        self.set_aside = (f"verdict store {self.path} was damaged ({damage}): moved aside to {aside}, kept for "
                          "inspection, and a new store replaces it (earlier sessions' verdicts are not reused)")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One transaction (committed on success, rolled back on an error); SQLite's failures (a
        corrupt file, a lock held past the timeout) as an InfrastructureError."""
        try:
            db = sqlite3.connect(self.path, timeout=60)
            try:
                with db:
                    yield db
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise InfrastructureError(f"verdict store {self.path}: {exc}") from exc

    def put(self, scope: Scope, verdict: StoredVerdict) -> None:
        """Keep (or replace) `verdict.session`'s verdict of its commit under `scope`."""
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (scope.oracle, scope.environment, scope.mode, scope.reference, verdict.commit,
                        verdict.build_key, verdict.session, verdict.kind.value, verdict.good, verdict.bad,
                        verdict.reason, scope.facts, verdict.t))

    def get(self, scope: Scope, commit: str, build_key: str, *, besides: str) -> list[StoredVerdict]:
        """Every other session's verdict of `commit` (built as `build_key`) under `scope`, oldest first;
        `besides` is the asking session, whose own verdicts are in its journal already."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT commit_sha, build_key, session, kind, good, bad, reason, t FROM verdicts WHERE oracle = ? "
                "AND environment = ? AND mode = ? AND reference = ? AND commit_sha = ? AND build_key = ? "
                "AND session != ? ORDER BY t",
                (scope.oracle, scope.environment, scope.mode, scope.reference, commit, build_key, besides)).fetchall()
        return [_verdict(row) for row in rows]

    def judged_good(self, scope: Scope) -> dict[str, StoredVerdict]:
        """The commits every session judged good under `scope`'s oracle, environment and mode (any
        reference), with their latest verdict: what `--good last-good` picks from."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT commit_sha, build_key, session, kind, good, bad, reason, t FROM verdicts WHERE oracle = ? "
                "AND environment = ? AND mode = ? ORDER BY t", (scope.oracle, scope.environment, scope.mode)).fetchall()
        good: dict[str, StoredVerdict] = {}
        judged_bad: set[str] = set()
        for row in rows:
            verdict = _verdict(row)
            if verdict.kind == VerdictKind.GOOD:
                good[verdict.commit] = verdict
            elif verdict.kind == VerdictKind.BAD:
                judged_bad.add(verdict.commit)
        return {sha: verdict for sha, verdict in good.items() if sha not in judged_bad}


def _verdict(row: tuple[str, str, str, str, int, int, str, float]) -> StoredVerdict:
    commit, build_key, session, kind, good, bad, reason, t = row
    return StoredVerdict(commit, build_key, session, VerdictKind(kind), good, bad, reason, t)
