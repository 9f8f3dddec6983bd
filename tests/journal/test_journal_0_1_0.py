"""A session bisect-npu 0.1.0 wrote (tests/data/journals/demo-0.1.0) still reads, reports and resumes.

Real journal, real demo upstream regenerated from its seed, real builds and probe runs for the
steps the cut journal lacks.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from bisect_npu.journal import JOURNAL_FILE, Journal
from bisect_npu.records import (
    EndRecord,
    FixRecord,
    FixVerifiedRecord,
    FixVerifyRecord,
    HeaderRecord,
    StepRecord,
    TrialRecord,
)
from bisect_npu.report import load_view, render_json, render_markdown
from tests.helpers.paths import DATA

# A 0.1.0 session read, reported and resumed end to end.
pytestmark = pytest.mark.e2e

SESSION_0_1_0 = DATA / "journals" / "demo-0.1.0"
CULPRIT = "c2c849e90b307099bec315c73809730189b0951a"


@pytest.fixture
def session(tmp_path: Path) -> Path:
    """A copy: resume appends to the journal and writes beside it."""
    return Path(shutil.copytree(SESSION_0_1_0, tmp_path / "session"))


def test_the_0_1_0_journal_loads_into_typed_records_and_renders_its_report(session: Path) -> None:
    with Journal.open(session, read_only=True) as journal:
        assert isinstance(journal.header, HeaderRecord)
        assert journal.header.schema_version == 1  # 0.1.0 wrote none
        assert journal.header.request.judge.recipe == "demo-async-penalty" and journal.header.range.kind == "commits"
        assert [type(e) for e in journal.entries] == [TrialRecord, StepRecord] * 7 + [
            EndRecord, FixRecord, FixVerifiedRecord, FixVerifyRecord]
        end = journal.records(EndRecord)[0]
        assert (end.status, end.culprit, end.index) == ("found", CULPRIT, 12)
        step = journal.records(StepRecord)[0]
        assert step.build is not None and step.build.how == "built" and step.trials[0].case_id == "repeat-story"
        verified = journal.records(FixVerifyRecord)[0].verifications[0]
        assert verified.status == "verified" and verified.verdict is not None and verified.verdict.kind == "good"

    view = load_view(session)
    markdown = render_markdown(view)
    assert f"**First bad commit: `{CULPRIT[:12]}` [v0.9.1][Perf] Back-fill async placeholders" in markdown
    # Another person's run: the repository is theirs (no path of this machine), the recipe bundled,
    # the commits bisected (the tags v0.9.0 and v0.9.1 named them).
    assert (view.range.good_ref, view.range.bad_ref) == ("v0.9.0", "v0.9.1")
    assert f"bisect-npu run --repo UPSTREAM --good {view.range.good} --bad {view.range.bad} " \
           "--recipe demo-async-penalty --mode exact --verify-fix" in markdown
    assert "- verified: `1197a0f93cb3` [BugFix] Back-fill async placeholders" in markdown
    assert "(the same change is also on other branches as `68b31e5b55cb`)" in markdown
    report = render_json(view)
    assert (report["status"], report["culprit"], report["candidates"]) == ("found", CULPRIT, 29)
    assert [s["index"] for s in report["steps"]] == [29, 0, 16, 8, 12, 10, 11]
    assert report["fix"]["proposals"][0]["pr"] == 339 and report["fix_verify"][0]["status"] == "verified"
    assert report["versions"] and report["engine_starts"]["trials"] == 7
    json.dumps(report)  # what `report --json` prints


def test_a_0_1_0_session_killed_after_its_sixth_step_resumes_without_redoing_a_step(
        session: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bisect_npu.demo.generate import ensure_upstream
    from bisect_npu.orchestration.bisection import Bisection

    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))  # a private upstream: verification adds refs
    upstream, _ = ensure_upstream(seed=0)  # the seed fixes the shas, so the header's range names its commits
    path = session / JOURNAL_FILE
    lines = path.read_text().splitlines(keepends=True)
    step_lines = [n for n, line in enumerate(lines) if json.loads(line)["type"] == "step"]
    kept = lines[:step_lines[5] + 1]  # killed right after journaling its sixth step of seven
    # The header names the clone the session ran on (0.1.0's demo cache on another machine); a user
    # who moved the clone points the header at its new place the same way.
    header = json.loads(kept[0])
    header["options"]["repo"] = str(upstream)
    kept[0] = json.dumps(header) + "\n"
    path.write_text("".join(kept))
    with Journal.open(session, read_only=True) as cut:
        done_before = [s.commit for s in cut.records(StepRecord)]
    assert len(done_before) == 6

    result = Bisection.resume(session).run()

    assert (result.status, result.culprit) == ("found", CULPRIT)
    with Journal.open(session, read_only=True) as journal:
        steps = Counter(s.commit for s in journal.records(StepRecord))
        assert all(steps[commit] == 1 for commit in done_before)  # finished steps were not run again
        assert sum(steps.values()) == 7 and max(steps.values()) == 1
        assert [e.culprit for e in journal.records(EndRecord)] == [CULPRIT]
        verifications = journal.records(FixVerifyRecord)[0].verifications
        assert verifications[0].status == "verified"
    assert render_json(load_view(session))["culprit"] == CULPRIT
