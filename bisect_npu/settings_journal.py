"""A settings search's journal: `settings.jsonl` in its session directory, one fsync'd JSON line
per finished trial and configuration, behind a lock, as a commit session's journal is.

Its own file beside a commit session's `journal.jsonl` (a settings search after a commit search
lives in that session's `settings/`): the lines are a configuration's, not a commit's. A process
killed mid-write leaves at most a torn last line, which `SettingsJournal.open` drops and cuts
away before anything is appended after it.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from bisect_npu.contracts import Verdict
from bisect_npu.defaults import CONFIDENCE, TRIAL_TIMEOUT_S
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.level import SettingsLevel
from bisect_npu.records import BuildInfo, Record, StoredFrom, TrialRun
from bisect_npu.request import RunRequest

SETTINGS_FILE = "settings.jsonl"
# 2: the header keeps the run's request and the level (0.2.x wrote 1: the request's fields copied).
SETTINGS_SCHEMA_VERSION = 2


class DifferenceRecord(BaseModel):
    """One differing key: its value in the bad case and in the good variant (None: unset)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    key: str
    bad: Any = None
    good: Any = None


class SettingsHeader(Record):
    """What the settings search runs: the request every configuration's run is made under (its
    repository, recipe, executor, store and search options, as a commit session's header keeps
    it), the level (the commit and the good variant), the differences (key i is the search's key
    i) and how a configuration is read. Resume needs nothing else."""

    type: Literal["settings_header"] = "settings_header"
    schema_version: int = SETTINGS_SCHEMA_VERSION
    tool_version: str = ""
    request: RunRequest
    level: SettingsLevel
    ref: str
    title: str = ""
    recipe_digest: str
    good_given: list[str] = Field(default_factory=list)  # how the good variant was given, as typed
    differences: list[DifferenceRecord]
    vary: dict[str, list[Any]] = Field(default_factory=dict)  # --vary keys -> their further values
    mode: Literal["exact", "noisy"] = "exact"
    confidence: float = CONFIDENCE
    batch: int = 1
    max_trials: int = 64
    after_session: str | None = None  # the commit session whose culprit this search runs at
    # The commit where the case is good, at which each configuration's own output is its
    # reference (None: the good variant's output at `commit` is every configuration's).
    reference_ref: str | None = None
    reference_commit: str | None = None

    @property
    def commit(self) -> str:
        return self.level.commit

    @model_validator(mode="before")
    @classmethod
    def _from_0_2_x(cls, raw: Any) -> Any:
        """A 0.2.x header (schema 1) copied the request's fields it used; they become its request and level."""
        if not isinstance(raw, dict) or "request" in raw:
            return raw
        old = {key: raw.get(key) for key in ("repo", "commit", "recipe", "executor", "devices", "dep_repos",
                                             "timeout_s", "verdict_store", "mode", "differences")}
        good_set = [f"{d['key']}={json.dumps(d.get('good'))}" for d in old["differences"] or []]  # JSON is YAML
        request = {"range": {"good": old["commit"], "bad": old["commit"], "repo": old["repo"]},
                   "judge": {"recipe": old["recipe"], "timeout_s": old["timeout_s"] or TRIAL_TIMEOUT_S},
                   "executor": {"executor": old["executor"] or "local", "devices": old["devices"] or [], "slots": 1},
                   "search": {"mode": old["mode"], "dep_repos": old["dep_repos"] or []},
                   "store": {"verdict_store": old["verdict_store"]}}
        return {**raw, "request": request, "level": {"kind": "settings", "commit": old["commit"],
                                                     "good_set": good_set}}


class ConfigurationTrial(Record, TrialRun):
    """A trial of a configuration, journaled the moment it finished."""

    type: Literal["configuration_trial"] = "configuration_trial"
    configuration: list[int]
    digest: str


class ConfigurationRecord(Record):
    """A configuration judged: the keys at their bad value (`configuration`), the recipe digest it
    ran as, its build, trials and verdict; `stored`: the verdict store had it, nothing ran."""

    type: Literal["configuration"] = "configuration"
    configuration: list[int]
    digest: str
    settings: dict[str, Any] = Field(default_factory=dict)  # every differing key -> the value it ran with
    build: BuildInfo | None = None
    verdict: Verdict
    trials: list[TrialRun] = Field(default_factory=list)
    seconds: float = 0.0
    stored: StoredFrom | None = None
    value_check: str | None = None  # a --vary value checked alone: "KEY=VALUE"


class ReferenceTrial(Record, TrialRun):
    """A trial of a configuration at the reference commit, journaled the moment it finished."""

    type: Literal["reference_trial"] = "reference_trial"
    configuration: list[int]
    digest: str


class ReferenceRecord(Record):
    """A configuration run at the reference commit: its trials are the reference its run at the
    searched commit is judged against; `verdict` is how the oracle judged it there alone (a
    repetition loop makes it bad: the reference commit is not good for it)."""

    type: Literal["reference"] = "reference"
    configuration: list[int]
    digest: str
    commit: str
    build: BuildInfo | None = None
    verdict: Verdict
    trials: list[TrialRun] = Field(default_factory=list)
    seconds: float = 0.0


class SettingsEnd(Record):
    """The answer: the trigger (`found`), or an end that does not behave as given (`ends_wrong`)."""

    type: Literal["settings_end"] = "settings_end"
    status: Literal["found", "ends_wrong"]
    trigger: list[int] = Field(default_factory=list)
    message: str = ""
    which: Literal["good", "bad"] | None = None
    figures: dict[str, float] = Field(default_factory=dict)


SettingsEntry = Annotated[ConfigurationTrial | ConfigurationRecord | ReferenceTrial | ReferenceRecord | SettingsEnd,
                          Field(discriminator="type")]
_ENTRY: TypeAdapter[SettingsEntry] = TypeAdapter(SettingsEntry)


class SettingsJournal:
    """The header and entries of one settings search, and the lock that makes this process its driver."""

    def __init__(self, session_dir: Path, header: SettingsHeader, entries: list[SettingsEntry], fd: int,
                 lock_fd: int) -> None:
        self.session_dir = session_dir
        self.path = session_dir / SETTINGS_FILE
        self.header = header
        self.entries = entries
        self._fd: int | None = fd
        self._lock_fd: int | None = lock_fd

    @classmethod
    def exists(cls, session_dir: Path) -> bool:
        return (session_dir / SETTINGS_FILE).is_file()

    @classmethod
    def create(cls, session_dir: Path, header: SettingsHeader) -> SettingsJournal:
        session_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = _lock(session_dir)
        path = session_dir / SETTINGS_FILE
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_bytes(_encode(header))
        with temporary.open("rb") as made:
            os.fsync(made.fileno())
        os.replace(temporary, path)  # a journal never exists without its header
        return cls(session_dir, header, [], os.open(path, os.O_WRONLY | os.O_APPEND), lock_fd)

    @classmethod
    def open(cls, session_dir: Path) -> SettingsJournal:
        """Read, lock and cut a torn last line off for appending."""
        path = session_dir / SETTINGS_FILE
        lock_fd = _lock(session_dir)
        data = path.read_bytes()
        lines = data.split(b"\n")
        torn = lines.pop()
        good_size = len(data) - len(torn)
        raws = []
        for number, raw in enumerate(lines, start=1):
            try:
                raws.append(json.loads(raw))
            except (json.JSONDecodeError, UnicodeDecodeError):
                if number != len(lines):
                    os.close(lock_fd)
                    raise UsageError(f"{path}:{number}: not a valid journal line; fix or delete it, then run "
                                     "the settings search again") from None
                good_size -= len(raw) + 1  # a complete but invalid last line: torn by a crash
        try:
            header = SettingsHeader.model_validate(raws[0])
            entries = [_ENTRY.validate_python(raw) for raw in raws[1:] if raw.get("type") in _TYPES]
        except (ValidationError, IndexError) as exc:
            os.close(lock_fd)
            raise UsageError(f"{path}: not a settings journal ({type(exc).__name__}); start a new session") from None
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        if good_size < len(data):
            os.ftruncate(fd, good_size)
            os.fsync(fd)
        return cls(session_dir, header, entries, fd, lock_fd)

    def append(self, entry: SettingsEntry) -> None:
        if self._fd is None:
            raise ValueError(f"settings journal {self.path} is closed")
        line = _encode(entry)
        try:
            os.write(self._fd, line)
            os.fsync(self._fd)
        except OSError as exc:
            raise InfrastructureError(f"cannot write {self.path} ({exc.strerror}); free space, then run the "
                                      "settings search again with the same --session") from exc
        self.entries.append(_ENTRY.validate_json(line))

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock_fd = None


_TYPES = frozenset({"configuration_trial", "configuration", "reference_trial", "reference", "settings_end"})


def read_settings(session_dir: Path) -> tuple[SettingsHeader, list[SettingsEntry]] | None:
    """A settings journal's header and entries without the lock (for the report); None without one."""
    path = session_dir / SETTINGS_FILE
    if not path.is_file():
        return None
    raws = []
    for raw in path.read_bytes().split(b"\n"):
        try:
            raws.append(json.loads(raw))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
    header = SettingsHeader.model_validate(raws[0])
    return header, [_ENTRY.validate_python(raw) for raw in raws[1:] if raw.get("type") in _TYPES]


def _encode(record: BaseModel) -> bytes:
    return (json.dumps(record.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _lock(session_dir: Path) -> int:
    fd = os.open(session_dir / "settings.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"settings search {session_dir} is being driven by another bisect-npu process; wait for "
                         "it or pick another --session") from None
    return fd
