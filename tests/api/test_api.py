"""The public API alone (bisect_npu.api): a Python function as the oracle bisects a real git
repository, writes the journal and the report, and resumes after a failure through the API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu import api
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import DATA

# Bisections end to end through the library API, and a session's verdicts judged again.
pytestmark = pytest.mark.e2e


class StateOracle:
    """Good while the checkout's `state` file says so; remembers what it judged, and raises on
    its `fail_at`-th call (a bug in the user's function)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.judged: list[str] = []

    def __call__(self, checkout: Path, commit: str) -> bool:
        if len(self.judged) + 1 == self.fail_at:
            raise RuntimeError("the oracle's own bug")
        self.judged.append(commit)
        return (checkout / "state").read_text().strip() == "good"


def journal(session: Path) -> list[dict]:
    return [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]


def test_a_python_function_finds_the_culprit(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path / "repo", 40, culprit=23)
    oracle = StateOracle()
    result = api.bisect(tmp_path / "repo", shas[0], shas[39], oracle=oracle, session_dir=tmp_path / "s", quiet=True)
    assert (result.status, result.exit_code, result.culprit) == ("found", 0, shas[23])
    assert result.session_dir == (tmp_path / "s").resolve()
    steps = [e for e in journal(tmp_path / "s") if e["type"] == "step"]
    assert [s["commit"] for s in steps] == oracle.judged  # every answer journaled, one step each
    assert 2 < len(steps) <= 9  # the two ends, then a binary search over 39 candidates
    assert {s["verdict"]["kind"] for s in steps if s["commit"] == shas[23]} == {"bad"}
    header = journal(tmp_path / "s")[0]
    assert header["context"]["python_oracle"] == "tests.api.test_api:StateOracle"
    assert shas[23][:12] in result.report.read_text()
    assert json.loads(result.report_json.read_text())["culprit"] == shas[23]
    plan = api.plan_range(tmp_path / "repo", shas[0], shas[39])
    assert len(plan.range.candidates) == 39 and plan.expected.max_steps >= len(steps)
    fixes = api.propose_fixes(tmp_path / "repo", shas[23])
    assert fixes.culprit == shas[23]


def test_answers_other_than_a_bool(tmp_path: Path) -> None:
    """'skip' steps around commits; a Verdict counts by its kind."""
    shas = make_linear_repo(tmp_path / "repo", 16, culprit=12)

    def oracle(checkout: Path, commit: str) -> api.OracleAnswer:
        if commit in shas[5:11]:
            return "skip"
        good = (checkout / "state").read_text().strip() == "good"
        return api.Verdict(kind=api.VerdictKind.GOOD if good else api.VerdictKind.BAD, reason="state file")

    result = api.bisect(tmp_path / "repo", shas[0], shas[15], oracle=oracle, session_dir=tmp_path / "s",
                        propose_fix=False, quiet=True)
    assert result.culprit == shas[12]
    skipped = [e for e in journal(tmp_path / "s") if e["type"] == "step" and e["verdict"]["kind"] == "skip"]
    assert skipped and {e["commit"] for e in skipped} <= set(shas[5:11])


def test_a_failed_run_resumes_through_the_api_only(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path / "repo", 40, culprit=23)
    session = tmp_path / "s"
    failing = StateOracle(fail_at=4)
    with pytest.raises(api.InfrastructureError, match="RuntimeError: the oracle's own bug"):
        api.bisect(tmp_path / "repo", shas[0], shas[39], oracle=failing, session_dir=session, quiet=True)
    assert len([e for e in journal(session) if e["type"] == "step"]) == 3

    # The CLI has no callable to give it: it says how to resume instead.
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "resume", "--session", str(session)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "test_api:StateOracle (given through bisect_npu.api)" in done.stderr
    assert "bisect_npu.api.bisect(..., oracle=StateOracle" in done.stderr

    again = StateOracle()
    result = api.bisect(tmp_path / "repo", shas[0], shas[39], oracle=again, session_dir=session, quiet=True)
    assert result.culprit == shas[23]
    assert not set(failing.judged) & set(again.judged)  # no finished step judged twice
    with pytest.raises(api.UsageError, match=r"this request's callable tests.api.test_api:test_a_failed_run"):
        api.bisect(tmp_path / "repo", shas[0], shas[39], oracle=lambda checkout, commit: True, session_dir=session)


def test_judge_gives_a_session_s_verdicts_again() -> None:
    """Observations a 0.1.0 demo session journaled, judged again through the API alone."""
    session = DATA / "journals" / "demo-0.1.0"
    steps = [e for e in journal(session) if e["type"] == "step"]
    for step in steps:
        verdict = api.judge("demo-async-penalty", [session / t["observation"] for t in step["trials"]])
        assert verdict.kind.value == step["verdict"]["kind"]
    assert {s["verdict"]["kind"] for s in steps} == {"good", "bad"}


@pytest.mark.parametrize("fields", [{"confidence": 1.5}, {"timeout_s": 0.0}, {"slots": 0}, {"fix_top": 0},
                                    {"cache_size_gb": -1.0}])
def test_a_request_field_out_of_its_range_is_refused_before_a_journal(tmp_path: Path, fields: dict) -> None:
    shas = make_linear_repo(tmp_path / "repo", 4, culprit=2)
    (name, value), = fields.items()
    with pytest.raises(api.UsageError, match=rf"request field \w+\.{name}: "):
        api.bisect(tmp_path / "repo", shas[0], shas[3], oracle=StateOracle(), session_dir=tmp_path / "s",
                   quiet=True, **fields)
    asked = api.RunRequest.of(repo=str(tmp_path / "repo"), good=shas[0], bad=shas[3], command=["true"])
    setattr(getattr(asked, "search" if name == "confidence" else "judge" if name == "timeout_s" else
                    "fix" if name == "fix_top" else "executor"), name, value)  # set after construction
    with pytest.raises(api.UsageError, match=rf"request field \w+\.{name}: "):
        api.bisect(asked, session_dir=tmp_path / "s", quiet=True)
    assert not (tmp_path / "s").exists()
