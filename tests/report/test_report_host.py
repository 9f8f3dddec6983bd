"""The report's host section says how each venv the runs used got its packages (its key's lock,
dated by its commit, or afresh) and, on a host that failed, how many attempts were retried and the
failure rate they give."""

from __future__ import annotations

from pathlib import Path

from bisect_npu.builders.dated import MADE_BY_LOCK, MADE_DATED, made_text
from bisect_npu.journal import Journal
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.records import BuildInfo, EndRecord, RetryRecord, StepRecord, TrialRecord, TrialRun
from bisect_npu.report import load_view, render_markdown
from bisect_npu.report.host import host_rows
from tests.report.test_report_golden import commits_header

DATED = made_text(MADE_DATED, "2026-06-03T06:39:53Z")
LOCKED = made_text(MADE_BY_LOCK, None)


def test_the_host_section_says_how_each_venv_was_made_and_what_the_host_failed(tmp_path: Path) -> None:
    session = tmp_path / "session"
    with Journal.create(session, commits_header(tmp_path, command=["true"])) as journal:
        for index, kind, key, made in ((3, VerdictKind.BAD, "vllm-0.20.2--transformers-5.5.4", LOCKED),
                                       (0, VerdictKind.GOOD, "vllm-0.20.2--transformers-5.5.3", DATED),
                                       (2, VerdictKind.BAD, "vllm-0.20.2--transformers-5.5.4", LOCKED),
                                       (1, VerdictKind.GOOD, "vllm-0.20.2--transformers-5.5.3", DATED)):
            sha = "0" * 40 if index == 0 else str(index) * 40
            if index == 2:  # two failed attempts before its trial ran
                for attempt in (1, 2):
                    journal.append(RetryRecord(index=index, commit=sha, case_id="default", trial=0, attempt=attempt,
                                               kind="card_busy", cause="the card was still busy"))
            journal.append(TrialRecord(index=index, commit=sha, case_id="default", trial=0, outcome=kind))
            journal.append(StepRecord(index=index, commit=sha, verdict=Verdict(kind=kind, reason=kind.value),
                                      build=BuildInfo(how="built", key=key, venv_made=made),
                                      trials=[TrialRun(case_id="default", trial=0, outcome=kind)]))
        journal.append(EndRecord(status="found", culprit="2" * 40, index=2, message="first bad commit"))
    view = load_view(session)
    rows = dict(host_rows(view))
    assert rows["venv vllm-0.20.2--transformers-5.5.3"] == DATED
    assert rows["venv vllm-0.20.2--transformers-5.5.4"] == LOCKED
    assert rows["host failures"] == ("2 retries; host failure rate estimated at 19% (2 of 6 attempts failed, "
                                     "over a prior of 1 in 10)")
    markdown = render_markdown(view)
    assert f"venv vllm-0.20.2--transformers-5.5.3 | {DATED}" in markdown
    assert "host failure rate estimated at 19% (2 of 6 attempts failed, over a prior of 1 in 10)" in markdown


def test_a_host_that_never_failed_and_a_session_without_venvs_add_no_row(tmp_path: Path) -> None:
    session = tmp_path / "session"
    with Journal.create(session, commits_header(tmp_path, command=["true"])) as journal:
        journal.append(StepRecord(index=3, commit="3" * 40, verdict=Verdict(kind=VerdictKind.BAD, reason="exit 1"),
                                  build=BuildInfo(how="built", key="k")))
    labels = [label for label, _ in host_rows(load_view(session))]
    assert "host failures" not in labels and not any(label.startswith("venv ") for label in labels)
