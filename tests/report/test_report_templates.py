"""The report templates are compiled once per cache root, not by every command that writes a
report: a later render reads their compiled code; a cache root that cannot be written still
gets its report."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import jinja2
import pytest

from bisect_npu.report import write_reports
from tests.helpers.paths import DATA


def session_copy(tmp_path: Path) -> Path:
    session = tmp_path / "session"
    shutil.copytree(DATA / "sessions" / "loop", session)
    journal = session / "journal.jsonl"
    journal.write_text(journal.read_text().replace("@SESSION@", str(session)))
    return session


def test_a_second_report_reads_the_compiled_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    session = session_copy(tmp_path)
    md_path, _ = write_reports(session)
    first = md_path.read_text(encoding="utf-8")
    assert list((tmp_path / "cache" / "report-templates").iterdir()), "no compiled template was kept"

    def no_compile(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a template was compiled again")

    monkeypatch.setattr(jinja2.Environment, "compile", no_compile)
    md_path.unlink()
    write_reports(session)
    assert md_path.read_text(encoding="utf-8") == first


def test_a_cache_root_that_cannot_be_written_still_gets_its_report(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() == 0:  # root writes through the mode bits: a file where the directory would be
        (tmp_path / "cache").write_text("not a directory", encoding="utf-8")
    else:
        (tmp_path / "cache").mkdir(mode=0o500)
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    md_path, _ = write_reports(session_copy(tmp_path))
    assert md_path.read_text(encoding="utf-8").startswith("#")
