"""A settings search's journal: `settings.jsonl` in its session directory, the commit session's
append-only journal (journal.py's `AppendOnlyJournal`: one fsync'd JSON line per finished trial and
configuration, behind a lock, a torn last line dropped) over the settings search's records.

Its own records and file name, not `journal.jsonl`'s: what it tests is a configuration at one
commit, not a commit of a range, and the file 0.2.x wrote (its journals resume) is named so. The
records are the commit journal's family: a judged configuration or reference is a `JudgedRun` under
its keys, as a commit's `step` is, a trial a `TrialRun`, a failed attempt a `RetryRun`, the end a
`SearchEnd`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from bisect_npu.defaults import CONFIDENCE, TRIAL_TIMEOUT_S
from bisect_npu.errors import UsageError
from bisect_npu.journal import AppendOnlyJournal
from bisect_npu.level import SettingsLevel
from bisect_npu.records import JudgedRun, Record, RetryRun, SearchEnd, TrialRun
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


class ConfigurationRetry(Record, RetryRun):
    """A failed attempt of a configuration's run (at the reference commit where `reference`),
    journaled the moment it failed, as a commit session journals a `retry`: a resumed search goes
    on with the budget its attempts left."""

    type: Literal["retry"] = "retry"
    configuration: list[int]
    digest: str
    reference: bool = False


class _ConfigurationKeys(Record):
    """Which configuration a record judged (first on its line, before the judged run, as 0.2.x wrote it)."""

    type: Literal["configuration"] = "configuration"
    configuration: list[int]
    digest: str
    settings: dict[str, Any] = Field(default_factory=dict)  # every differing key -> the value it ran with


class ConfigurationRecord(JudgedRun, _ConfigurationKeys):
    """A configuration judged: the keys at their bad value (`configuration`), the recipe digest it
    ran as and every differing key's value it ran with (`settings`); `stored`: the verdict store
    had it, nothing ran; `host_failure`: why it is unresolved where the host's failures spent its
    retries (a later search runs it again)."""

    value_check: str | None = None  # a --vary value checked alone: "KEY=VALUE"


class ReferenceTrial(Record, TrialRun):
    """A trial of a configuration at the reference commit, journaled the moment it finished."""

    type: Literal["reference_trial"] = "reference_trial"
    configuration: list[int]
    digest: str


class _ReferenceKeys(Record):
    """Which configuration a reference record ran, and at which commit."""

    type: Literal["reference"] = "reference"
    configuration: list[int]
    digest: str
    commit: str


class ReferenceRecord(JudgedRun, _ReferenceKeys):
    """A configuration run at the reference commit: its trials are the reference its run at the
    searched commit is judged against; `verdict` is how the oracle judged it there alone (a
    repetition loop makes it bad: the reference commit is not good for it). Never the verdict
    store's: `stored` stays None."""


class _SettingsEndStatus(Record):
    """How the settings search ended and its trigger (first on its line, as 0.2.x wrote it)."""

    type: Literal["settings_end"] = "settings_end"
    status: Literal["found", "ends_wrong", "unresolved"]
    trigger: list[int] = Field(default_factory=list)


class SettingsEnd(SearchEnd, _SettingsEndStatus):
    """The answer: the trigger (`found`), an end that does not behave as given (`ends_wrong`), or
    no trigger because configurations it rests on could not be judged for a reason of their own
    (`unresolved`: `unresolved` lists them)."""

    unresolved: list[list[int]] = Field(default_factory=list)


SettingsEntry = Annotated[ConfigurationTrial | ConfigurationRetry | ConfigurationRecord | ReferenceTrial |
                          ReferenceRecord | SettingsEnd, Field(discriminator="type")]
_ENTRY: TypeAdapter[SettingsEntry] = TypeAdapter(SettingsEntry)


class SettingsJournal(AppendOnlyJournal[SettingsHeader, SettingsEntry]):
    """The header and entries of one settings search, and the lock that makes this process its driver."""

    FILE = SETTINGS_FILE
    LOCK = "settings.lock"
    HEADER_TYPE = "settings_header"
    SCHEMA_VERSION = SETTINGS_SCHEMA_VERSION

    @classmethod
    def _read_header(cls, path: Path, raw: dict[str, Any]) -> SettingsHeader:
        try:
            return SettingsHeader.model_validate(raw)
        except ValidationError as exc:
            raise UsageError(f"{path}: not a settings journal ({type(exc).__name__}); start a new session") from None

    @classmethod
    def _parse_entry(cls, raw: dict[str, Any]) -> SettingsEntry | None:
        return _ENTRY.validate_python(raw) if raw.get("type") in _TYPES else None

    @classmethod
    def _schema_version(cls, header: SettingsHeader) -> int:
        return header.schema_version

    @classmethod
    def _refuse_existing(cls, session_dir: Path) -> UsageError:
        return UsageError(f"settings search {session_dir} exists already; continue it with the `bisect-npu settings` "
                          f"command that started it, with --session {session_dir}")

    @classmethod
    def _refuse_missing(cls, session_dir: Path) -> UsageError:
        return UsageError(f"no settings journal in {session_dir}; pass --session with a directory made by "
                          "`bisect-npu settings`")

    @classmethod
    def _refuse_busy(cls, session_dir: Path, holder: str) -> UsageError:
        return UsageError(f"settings search {session_dir} is being driven by another bisect-npu process (pid "
                          f"{holder}); wait for it or pick another --session")

    @classmethod
    def _resume_hint(cls, session_dir: Path) -> str:
        return f"run the settings search again with --session {session_dir}"


_TYPES = frozenset({"configuration_trial", "retry", "configuration", "reference_trial", "reference", "settings_end"})


def read_settings(session_dir: Path) -> tuple[SettingsHeader, list[SettingsEntry]] | None:
    """A settings journal's header and entries without the lock (for the report); None without one."""
    if not SettingsJournal.exists(session_dir):
        return None
    journal = SettingsJournal.open(session_dir, read_only=True)
    return journal.header, journal.entries
