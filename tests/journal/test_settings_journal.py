"""A settings search's journal is the session journal's file over its own records: one driver at a
time (the refusal names the settings search), a torn last line dropped and cut before the next
append, a report reading it while a driver holds it. Real files, real locks."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_npu.errors import UsageError
from bisect_npu.level import SettingsLevel
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.request import RunRequest
from bisect_npu.settings_journal import (
    SETTINGS_FILE,
    ConfigurationRecord,
    DifferenceRecord,
    SettingsHeader,
    SettingsJournal,
    read_settings,
)

COMMIT = "a" * 40


def header(tmp_path: Path) -> SettingsHeader:
    request = RunRequest.of(repo=str(tmp_path), good=COMMIT, bad=COMMIT, recipe="demo-async-penalty")
    return SettingsHeader(request=request,
                          level=SettingsLevel(commit=COMMIT, good_set=["engine.args.async_scheduling=false"]),
                          ref="v1", recipe_digest="d" * 16,
                          differences=[DifferenceRecord(key="engine.args.async_scheduling", bad=True, good=False)])


def judged(digest: str) -> ConfigurationRecord:
    return ConfigurationRecord(configuration=[0], digest=digest, verdict=Verdict(kind=VerdictKind.BAD, reason="x"))


def test_a_second_driver_is_refused_and_a_reader_is_not(tmp_path: Path) -> None:
    session = tmp_path / "search"
    with SettingsJournal.create(session, header(tmp_path)) as journal:
        journal.append(judged("one"))
        with pytest.raises(UsageError, match=r"settings search .* is being driven by another bisect-npu process"):
            SettingsJournal.open(session)
        read = read_settings(session)
        assert read is not None and [e.digest for e in read[1] if isinstance(e, ConfigurationRecord)] == ["one"]
    with pytest.raises(UsageError, match="exists already"):
        SettingsJournal.create(session, header(tmp_path))


def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path: Path) -> None:
    session = tmp_path / "search"
    with SettingsJournal.create(session, header(tmp_path)) as journal:
        journal.append(judged("one"))
    path = session / SETTINGS_FILE
    path.write_text(path.read_text() + '{"type":"configuration","configur')
    with SettingsJournal.open(session) as journal:
        assert journal.dropped_tail is not None and [e.type for e in journal.entries] == ["configuration"]
        journal.append(judged("two"))
    with SettingsJournal.open(session) as journal:
        assert [e.digest for e in journal.entries if isinstance(e, ConfigurationRecord)] == ["one", "two"]
        assert journal.header.commit == COMMIT


def test_a_corrupt_middle_line_is_one_line_naming_it(tmp_path: Path) -> None:
    session = tmp_path / "search"
    with SettingsJournal.create(session, header(tmp_path)) as journal:
        journal.append(judged("one"))
    path = session / SETTINGS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + '{"type":"configuration","digest":3}\n' + lines[1])
    with pytest.raises(UsageError, match=rf"{SETTINGS_FILE}:2: a configuration record this bisect-npu cannot read"):
        SettingsJournal.open(session)
