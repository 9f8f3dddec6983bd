"""A session's append-only journal: one JSON line per finished step, fsync'd, behind a lock.

The journal is the session's only state: resume and report read nothing else. So every line is
written with a single `os.write` to an O_APPEND descriptor and fsync'd before the step counts
as done; a process killed mid-write leaves at most a torn last line, which `Journal.open`
drops and truncates away before anything is appended after it. Lines are typed records: the
header first, then what the session appends. `AppendOnlyJournal` is that file over any header and
record types: a commit session's `Journal` (`bisect_npu.records`) and a settings search's
(settings_journal.py).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar

from pydantic import BaseModel, ValidationError

from bisect_npu.defaults import SESSIONS_ROOT
from bisect_npu.errors import InfrastructureError, UsageError, validation_problem
from bisect_npu.records import JOURNAL_SCHEMA_VERSION, HeaderRecord, JournalRecord, Record, parse_record

JOURNAL_FILE = "journal.jsonl"
LOCK_FILE = "lock"
LATEST_FILE = "latest"
DEFAULT_ROOT = SESSIONS_ROOT
R = TypeVar("R", bound=Record)
H = TypeVar("H", bound=Record)
E = TypeVar("E", bound=Record)


def _unwritable(session_dir: Path, exc: OSError) -> UsageError:
    """A session that cannot be written (a read-only copy, another user's) cannot go on here."""
    return UsageError(f"session {session_dir} cannot be written ({exc.strerror}), and going on appends to its "
                      "journal: copy the directory somewhere writable and go on there (`bisect-npu report "
                      f"--session {session_dir}` reads it as it is)")


def sessions_root(root: Path = DEFAULT_ROOT) -> Path:
    """`root`, except that the default is taken at the top of the git checkout the current
    directory is in: one `.bisect-npu/` per checkout, whichever subdirectory a command runs from
    (it scattered into each of them), and `resume` finds the sessions from anywhere in it."""
    if root != DEFAULT_ROOT:
        return root
    here = Path.cwd().resolve()
    top = next((d for d in (here, *here.parents) if (d / ".git").exists()), here)
    return root if top == here else top / root


def new_session_dir(root: Path = DEFAULT_ROOT) -> Path:
    """Create `root/<YYYYmmdd-HHMMSS-xxxxxx>/` (the default root: `sessions_root`) and point
    `root/latest` at it. The root holds a `.gitignore` of `*`: sessions are made inside the
    user's checkout and are none of its changes."""
    root = sessions_root(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        ignore = root / ".gitignore"
        if not ignore.exists():
            _write_atomically(ignore, "# bisect-npu's sessions: not part of the repository\n*\n")
        while True:
            session_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
            session_dir = root / session_id
            try:
                session_dir.mkdir()
            except FileExistsError:
                continue
            break
        _write_atomically(root / LATEST_FILE, session_id + "\n")
    except OSError as exc:
        raise UsageError(f"cannot make a session under {root} ({exc.strerror}); run from a writable directory, or "
                         "pass --session (`demo`: --session-root) with a writable place") from None
    return session_dir


def session_label(session_dir: Path) -> str:
    """A session's name on this host: its directory's name plus a digest of its full path, so two
    sessions named alike (a/s and b/s) never share worktrees or containers."""
    return f"{session_dir.name}-{hashlib.sha256(str(session_dir.resolve()).encode()).hexdigest()[:8]}"


def session_named(path: Path) -> Path:
    """The session directory `--session PATH` names: the one a sessions root's `latest` file points
    at when PATH is that file (the root offers it beside the sessions), else PATH itself."""
    if path.name != LATEST_FILE or not path.is_file():
        return path
    try:
        name = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return path
    if not name or "/" in name or name in (".", ".."):  # `new_session_dir` writes a sibling's name
        return path
    return path.parent / name if (path.parent / name).is_dir() else path


def latest_session(root: Path = DEFAULT_ROOT) -> Path:
    """The session `root/latest` names, else the newest session directory holding a journal (the
    default root: `sessions_root`)."""
    root = sessions_root(root)
    try:
        named = root / (root / LATEST_FILE).read_text().strip()
        if (named / JOURNAL_FILE).is_file():
            return named
    except (FileNotFoundError, NotADirectoryError):
        pass
    if root.is_dir():
        sessions = sorted(p for p in root.iterdir() if (p / JOURNAL_FILE).is_file())
        if sessions:
            return sessions[-1]
    raise UsageError(f"no session found under {root}; start one with `bisect-npu run`")


class AppendOnlyJournal(Generic[H, E]):
    """The header (`H`) and entries (`E`) of one journal file, and the lock that makes this process
    its driver.

    Use as a context manager (or call `close()`): the lock is held until then. It is an
    `fcntl.flock` on `session_dir/LOCK`, so the kernel drops it when the process dies, SIGKILL
    included, and a resume can take over at once. Descriptors are not inherited by subprocesses
    (Python's default); a child forked without exec would share the lock. A subclass names its
    file, lock, header type and schema version, reads its lines (`_read_header`, `_parse_entry`)
    and words its refusals.
    """

    FILE: ClassVar[str]
    LOCK: ClassVar[str]
    HEADER_TYPE: ClassVar[str]  # the header line's `type`
    SCHEMA_VERSION: ClassVar[int]  # the highest header schema this version appends to

    def __init__(self, session_dir: Path, header: H, entries: list[E], dropped_tail: str | None, fd: int | None,
                 lock_fd: int | None, size: int) -> None:
        self.session_dir = session_dir
        self.path = session_dir / self.FILE
        self.header = header
        self.entries = entries
        self.dropped_tail = dropped_tail
        self._fd = fd
        self._lock_fd = lock_fd
        self._size = size
        self._append_lock = threading.Lock()  # one line at a time: a rollback must not cut another's

    def records(self, kind: type[R]) -> list[R]:
        """The entries of one record type, in journal order."""
        return [entry for entry in self.entries if isinstance(entry, kind)]

    @classmethod
    def exists(cls, session_dir: Path) -> bool:
        return (session_dir / cls.FILE).is_file()

    @classmethod
    def create(cls, session_dir: Path, header: H) -> Self:
        """Start a journal in `session_dir` (created if needed) with its header line."""
        try:
            session_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot make session directory {session_dir} ({exc.strerror}); "
                             "pass --session with a writable directory path") from None
        lock_fd = cls._acquire_lock(session_dir)
        try:
            path = session_dir / cls.FILE
            if path.exists():
                raise cls._refuse_existing(session_dir)
            line = _encode(header)
            # Header first to a temporary file, then renamed: a journal never exists without one.
            _write_atomically(path, line.decode("utf-8"))
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except BaseException:
            os.close(lock_fd)
            raise
        return cls(session_dir, header, [], None, fd, lock_fd, len(line))

    @classmethod
    def open(cls, session_dir: Path, read_only: bool = False) -> Self:
        """Read a journal; unless `read_only`, lock it and cut a torn last line off for appending.

        `read_only` is for looking at a session another process may be driving (a report while
        a run goes on): no lock, nothing changed on disk, `append` refused. A journal a newer
        bisect-npu wrote (a higher schema version) is read, never appended to.
        """
        path = session_dir / cls.FILE
        if not path.is_file():
            raise cls._refuse_missing(session_dir)
        lock_fd = None if read_only else cls._acquire_lock(session_dir)
        try:
            data = path.read_bytes()
            header, entries, good_size, dropped_tail = cls._parse(path, data)
            fd = None
            if not read_only:
                version = cls._schema_version(header)
                if version > cls.SCHEMA_VERSION:
                    raise UsageError(f"{path} was written by a newer bisect-npu (journal schema version {version}; "
                                     f"this one writes {cls.SCHEMA_VERSION}): resume it with that version "
                                     "(`bisect-npu report` reads it here)")
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                except OSError as exc:
                    raise _unwritable(session_dir, exc) from None
                if good_size < len(data):
                    os.ftruncate(fd, good_size)
                    os.fsync(fd)
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        return cls(session_dir, header, entries, dropped_tail, fd, lock_fd, good_size)

    def append(self, record: E) -> None:
        """Write one record as one line and fsync it.

        Free-form values (a verdict's figures) must be JSON or os.PathLike (stored as text);
        anything else is a TypeError raised before a byte is written. Safe to call from several threads.
        """
        if getattr(record, "type", None) == self.HEADER_TYPE:
            raise ValueError("only create writes the header")
        line = _encode(record)
        with self._append_lock:
            self._write_line(line)
            self.entries.append(type(record).model_validate_json(line))  # as a reader of the file sees it

    def _write_line(self, line: bytes) -> None:
        if self._fd is None:
            raise ValueError(f"journal {self.path} is closed or opened read-only")
        try:
            written = os.write(self._fd, line)
            while written < len(line):  # a regular file writes short only on a full disk
                written += os.write(self._fd, line[written:])
            os.fsync(self._fd)
        except OSError as exc:
            # Cut the partial line off now: anything appended after it would corrupt the middle.
            os.ftruncate(self._fd, self._size)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise InfrastructureError(f"no room to write {self.path} ({exc.strerror}); free space, then "
                                          f"{self._resume_hint(self.session_dir)}") from exc
            raise
        self._size += len(line)

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- what a subclass says -----------------------------------------------------------------

    @classmethod
    def _read_header(cls, path: Path, raw: dict[str, Any]) -> H:
        """The header line as its record, or the one-line refusal of a journal that is not this kind's."""
        raise NotImplementedError

    @classmethod
    def _parse_entry(cls, raw: dict[str, Any]) -> E | None:
        """A line after the header as its record; None for a type this version does not know (a
        newer writer's); a known type that does not fit its model is a pydantic ValidationError."""
        raise NotImplementedError

    @classmethod
    def _schema_version(cls, header: H) -> int:
        raise NotImplementedError

    @classmethod
    def _refuse_existing(cls, session_dir: Path) -> UsageError:
        raise NotImplementedError

    @classmethod
    def _refuse_missing(cls, session_dir: Path) -> UsageError:
        raise NotImplementedError

    @classmethod
    def _refuse_busy(cls, session_dir: Path, holder: str) -> UsageError:
        raise NotImplementedError

    @classmethod
    def _resume_hint(cls, session_dir: Path) -> str:
        raise NotImplementedError

    # -- the file -----------------------------------------------------------------------------

    @classmethod
    def _parse(cls, path: Path, data: bytes) -> tuple[H, list[E], int, str | None]:
        """(header, entries, size of the valid prefix, dropped tail text or None)."""
        lines = data.split(b"\n")
        tail = lines.pop()  # bytes after the last newline: empty unless a write was torn
        raws: list[dict[str, Any]] = []
        offset = 0
        dropped: bytes | None = tail or None
        for number, raw in enumerate(lines, start=1):
            record = _decode(raw)
            if record is None:
                if number == len(lines) and tail == b"":
                    dropped = raw  # a complete but invalid last line: torn by a crash, not trusted
                    break
                raise UsageError(
                    f"{path}:{number}: not a valid journal line (corrupted, not a torn write); "
                    "fix or delete that line, then resume"
                )
            raws.append(record)
            offset += len(raw) + 1
        if not raws or raws[0].get("type") != cls.HEADER_TYPE:
            raise UsageError(f"{path} has no header line; it is not a bisect-npu journal")
        header = cls._read_header(path, raws[0])
        entries: list[E] = []
        for number, raw_entry in enumerate(raws[1:], start=2):
            try:
                entry = cls._parse_entry(raw_entry)
            except ValidationError as exc:
                raise UsageError(f"{path}:{number}: a {raw_entry['type']} record this bisect-npu cannot read "
                                 f"({_first_error(exc, within_union=True)}); the journal is corrupt") from None
            if entry is not None:
                entries.append(entry)
        dropped_text = dropped.decode("utf-8", errors="replace") if dropped is not None else None
        return header, entries, offset, dropped_text

    @classmethod
    def _acquire_lock(cls, session_dir: Path) -> int:
        try:
            fd = os.open(session_dir / cls.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _unwritable(session_dir, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise cls._refuse_busy(session_dir, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd


class Journal(AppendOnlyJournal[HeaderRecord, JournalRecord]):
    """A commit session's journal (`journal.jsonl`): its header, then its steps, trials and end."""

    FILE = JOURNAL_FILE
    LOCK = LOCK_FILE
    HEADER_TYPE = "header"
    SCHEMA_VERSION = JOURNAL_SCHEMA_VERSION

    @classmethod
    def _read_header(cls, path: Path, raw: dict[str, Any]) -> HeaderRecord:
        """What the header lacks, in one line rather than a validation trace."""
        try:
            return HeaderRecord.model_validate(raw)
        except ValidationError as exc:
            missing = [str(e["loc"][0]) for e in exc.errors() if e["type"] == "missing" and len(e["loc"]) == 1]
            what = f"lacks {', '.join(missing)}" if missing else f"cannot be read ({_first_error(exc)})"
            raise UsageError(f"{path}:1: the header {what}; the journal is corrupt or not a bisect-npu "
                             "session's: start a new session") from None

    @classmethod
    def _parse_entry(cls, raw: dict[str, Any]) -> JournalRecord | None:
        return parse_record(raw)

    @classmethod
    def _schema_version(cls, header: HeaderRecord) -> int:
        return header.schema_version

    @classmethod
    def _refuse_existing(cls, session_dir: Path) -> UsageError:
        return UsageError(f"session {session_dir} already holds a journal; continue it with "
                          f"`bisect-npu resume --session {session_dir}` or pick a new directory")

    @classmethod
    def _refuse_missing(cls, session_dir: Path) -> UsageError:
        if not session_dir.exists() or (session_dir.is_dir() and {p.name for p in session_dir.iterdir()} <= {cls.LOCK}):
            return UsageError(f"{session_dir} {'holds no session' if session_dir.exists() else 'does not exist'}: "
                              "the run that was to make it stopped before anything was journaled, so nothing is "
                              "left to resume; start it again with `bisect-npu run` (the same --session works)")
        return UsageError(f"no journal in {session_dir}; pass --session with a directory made by `bisect-npu run`")

    @classmethod
    def _refuse_busy(cls, session_dir: Path, holder: str) -> UsageError:
        return UsageError(f"session {session_dir} is being driven by another bisect-npu process (pid {holder}); "
                          "wait for it or stop it (a new bisection needs a --session of its own)")

    @classmethod
    def _resume_hint(cls, session_dir: Path) -> str:
        return "`bisect-npu resume`"


def _first_error(exc: ValidationError, *, within_union: bool = False) -> str:
    """The first problem as "field.path: message" (a union's errors start with the record's type: dropped)."""
    where, problem = validation_problem(exc, skip=1 if within_union else 0, root="the line")
    return f"{where}: {problem}"


def _decode(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # nested past the parser's stack
        return None
    # Every line is a mapping that names its type; anything else is corrupt, not a newer writer's record.
    return value if isinstance(value, dict) and isinstance(value.get("type"), str) else None


def _encode(record: BaseModel) -> bytes:
    text = json.dumps(record.model_dump(), ensure_ascii=False, separators=(",", ":"), default=_jsonable)
    return (text + "\n").encode("utf-8")


def _jsonable(value: object) -> str:
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    raise TypeError(f"journal records hold JSON values and paths, not {type(value).__name__}")


def _write_atomically(path: Path, text: str) -> None:
    """Write `path` via a fsync'd temporary file and rename, then fsync the directory."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
