"""apply_fix / verify_fixes with a real bad case: check.py run in a real checkout of the applied commit."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bisect_npu.fix import (
    AlreadyApplied,
    AppliedFix,
    ApplyConflict,
    FixProposal,
    FixReport,
    apply_fix,
    propose_fixes,
    verify_fixes,
)
from bisect_npu.observations import Verdict, VerdictKind
from tests.helpers.fix_history import History

CALC = '''def penalty(history, value):
    return [h * value for h in history]


def apply(logits, history):
    scaled = penalty(history, 2)
    return sum(logits) - sum(scaled)
'''
CHECK = '''import sys

from calc import apply

sys.exit(0 if apply([10, 10], [1, 2]) == 14 else 1)
'''
GOOD_LINE = "    scaled = penalty(history, 2)\n"
BAD_LINE = "    scaled = penalty([], 2)\n"


def real_evaluator(repo_path: Path, scratch: Path):
    """Check out `sha` in its own worktree and run the bad case there: exit 0 is good."""
    calls: list[str] = []

    def evaluate(sha: str) -> Verdict:
        calls.append(sha)
        tree = scratch / f"eval-{len(calls)}"
        subprocess.run(["git", "-C", str(repo_path), "worktree", "add", "--detach", "-q", str(tree), sha], check=True)
        try:
            done = subprocess.run([sys.executable, "check.py"], cwd=tree, capture_output=True, timeout=60)
        finally:
            subprocess.run(["git", "-C", str(repo_path), "worktree", "remove", "--force", str(tree)], check=True)
        kind = VerdictKind.GOOD if done.returncode == 0 else VerdictKind.BAD
        return Verdict(kind=kind, reason=f"check.py exited {done.returncode}")

    evaluate.calls = calls  # type: ignore[attr-defined]
    return evaluate


def make_upstream(path: Path) -> dict[str, str]:
    hist = History(path)
    shas = {"base": hist.commit("Add calc (#1)", {"calc.py": CALC, "check.py": CHECK})}
    shas["culprit"] = hist.edit("[Perf] Skip history in apply (#2)", "calc.py", GOOD_LINE, BAD_LINE)
    hist.branch("v1-dev", shas["culprit"])
    shas["bad"] = hist.commit("[Doc] Notes (#3)", {"notes.md": "notes\n"})
    shas["unrelated"] = hist.commit("[BugFix] Fix async crash in the other module (#4)",
                                    {"other.py": "def crash():\n    return 0\n"})
    shas["fix"] = hist.edit("Restore history in apply (#5)", "calc.py", BAD_LINE, GOOD_LINE)
    hist.checkout("v1-dev")
    hist.edit("[Misc] Return a float (#6)", "calc.py", "    return sum(logits) - sum(scaled)\n",
              "    return float(sum(logits) - sum(scaled))\n")
    shas["release_fix"] = hist.edit(
        "[BugFix] Use the history again in apply, release variant (#7)", "calc.py",
        BAD_LINE + "    return float(sum(logits) - sum(scaled))\n",
        GOOD_LINE + "    return float(sum(logits)) - float(sum(scaled))\n")
    hist.checkout("main")
    return shas


def test_verify_flips_the_real_fix_and_reports_the_conflict(tmp_path):
    shas = make_upstream(tmp_path / "up")
    repo = git.Repo(tmp_path / "up")
    head_before = repo.head.commit.hexsha
    report = propose_fixes(repo, shas["culprit"], bad=shas["bad"])
    assert {p.shas[0] for p in report.proposals} == {shas["fix"], shas["release_fix"]}
    evaluate = real_evaluator(tmp_path / "up", tmp_path)
    assert evaluate(shas["bad"]).kind is VerdictKind.BAD  # the bad case really fails at the bad end

    # The release variant, which does not apply to main's bad end, ranked first: the walk goes on past it.
    report.proposals.sort(key=lambda p: p.shas[0] != shas["release_fix"])
    results = verify_fixes(repo, shas["bad"], report, evaluate, workdir=tmp_path / "work")
    by_status = {r.status: r for r in results}
    assert results[0].status == "verified" and results[0].proposal.shas == [shas["fix"]]
    assert results[0].verdict is not None and results[0].verdict.kind is VerdictKind.GOOD
    applied = repo.commit(results[0].applied_sha)
    assert applied.parents[0].hexsha == shas["bad"]
    assert f"cherry picked from commit {shas['fix']}" in applied.message
    conflict = by_status["conflict"]
    assert conflict.proposal.shas == [shas["release_fix"]] and conflict.conflict_files == ["calc.py"]
    assert conflict.detail == "does not apply cleanly: conflicts in calc.py"
    # The user's checkout is untouched and no worktree is left behind.
    assert repo.head.commit.hexsha == head_before and not repo.is_dirty(untracked_files=True)
    assert len(repo.git.worktree("list").splitlines()) == 1


def test_the_walk_stops_at_the_first_verified_fix_even_when_a_wrong_one_ranks_above(tmp_path):
    shas = make_upstream(tmp_path / "up")
    repo = git.Repo(tmp_path / "up")
    proposed = propose_fixes(repo, shas["culprit"], bad=shas["bad"]).proposals
    right = next(p for p in proposed if p.shas[0] == shas["fix"])
    wrong = FixProposal(shas=[shas["unrelated"]], branches=["main"], title="[BugFix] Fix async crash", pr=4,
                        score=1.5, reasons=[])
    after = FixProposal(shas=[shas["release_fix"]], branches=["v1-dev"], title="release", pr=7, score=1.0, reasons=[])
    report = FixReport(shas["culprit"], [wrong, right, after], None, "")
    evaluate = real_evaluator(tmp_path / "up", tmp_path)
    tried: list[str] = []
    results = verify_fixes(repo, shas["bad"], report, evaluate, workdir=tmp_path / "work",
                           on_result=lambda v: tried.append(v.status))
    assert tried == ["not_verified", "verified"]  # the third proposal is never tried
    assert [r.status for r in results] == ["verified", "not_verified"]
    assert results[0].proposal.shas == [shas["fix"]] and results[1].proposal.shas == [shas["unrelated"]]
    # Within --verify-top 1 only the wrong one is tried; a resumed run skips what it already tried.
    assert [r.status for r in verify_fixes(repo, shas["bad"], report, evaluate, top=1,
                                           workdir=tmp_path / "work")] == ["not_verified"]
    resumed = verify_fixes(repo, shas["bad"], report, evaluate, workdir=tmp_path / "work", done={shas["unrelated"]})
    assert [r.proposal.shas[0] for r in resumed] == [shas["fix"]]


def test_unrelated_bugfix_is_not_verified(tmp_path):
    shas = make_upstream(tmp_path / "up")
    repo = git.Repo(tmp_path / "up")
    unrelated = FixProposal(shas=[shas["unrelated"]], branches=["main"], title="[BugFix] Fix async crash",
                            pr=4, score=1.5, reasons=[])
    report = FixReport(shas["culprit"], [unrelated], None, "")
    [result] = verify_fixes(repo, shas["bad"], report, real_evaluator(tmp_path / "up", tmp_path),
                            workdir=tmp_path / "work")
    assert result.status == "not_verified" and result.verdict is not None
    assert result.verdict.kind is VerdictKind.BAD and result.applied_sha


def test_apply_fix_results(tmp_path):
    shas = make_upstream(tmp_path / "up")
    repo = git.Repo(tmp_path / "up")
    applied = apply_fix(repo, shas["bad"], [shas["fix"]], tmp_path / "work")
    assert isinstance(applied, AppliedFix) and applied.bad == shas["bad"]
    assert repo.git.show(f"{applied.sha}:calc.py") == CALC.rstrip("\n")
    assert repo.git.rev_parse(f"refs/bisect-npu/fixes/{applied.sha}") == applied.sha
    # Ancestor of the bad end, or the same patch already applied (empty cherry-pick): already there.
    assert isinstance(apply_fix(repo, shas["fix"], [shas["culprit"]], tmp_path / "work"), AlreadyApplied)
    again = apply_fix(repo, applied.sha, [shas["fix"]], tmp_path / "work")
    assert isinstance(again, AlreadyApplied) and again.message == "already in the bad end"
    conflict = apply_fix(repo, shas["bad"], [shas["release_fix"]], tmp_path / "work")
    assert isinstance(conflict, ApplyConflict) and conflict.files == ["calc.py"]
    assert not list((tmp_path / "work").iterdir())


def test_a_killed_verification_s_worktrees_are_swept_by_the_next(tmp_path, monkeypatch):
    import os

    from bisect_npu.orchestration.opening.environments import verification_scratch

    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    shas = make_upstream(tmp_path / "up")
    repo = git.Repo(tmp_path / "up")
    import re
    import socket

    host = re.sub(r"[^\w.]", "_", socket.gethostname())
    dead = tmp_path / "cache" / "fix-verify" / f"{host}--999999999-deadbeef"  # no such process here
    elsewhere = tmp_path / "cache" / "fix-verify" / "other-node--999999999-deadbeef"  # maybe alive there
    elsewhere.mkdir(parents=True)
    repo.git.worktree("add", "--detach", "--lock", str(dead / "fixes" / "apply-x"), shas["bad"])
    other_shas = make_upstream(tmp_path / "other-clone")  # the killed run was verifying on another clone
    other = git.Repo(tmp_path / "other-clone")
    other.git.worktree("add", "--detach", str(dead / "session" / "worktrees" / "abc"), other_shas["bad"])
    import subprocess

    # The killed run's oracle command, still running under its mark; and a live run's on another node.
    orphan = subprocess.Popen(["sleep", "600"], env={**os.environ, "BISECT_NPU_OWNER": str(dead / "session")})
    alive = subprocess.Popen(["sleep", "600"], env={**os.environ, "BISECT_NPU_OWNER": str(elsewhere / "session")})
    with verification_scratch(repo) as scratch:
        assert orphan.wait(timeout=10) == -9 and alive.poll() is None
        alive.kill()
        assert scratch.name.startswith(f"{host}--{os.getpid()}-") and not dead.exists() and elsewhere.exists()
        assert repo.git.worktree("list", "--porcelain").count("worktree ") == 1
        assert other.git.worktree("list", "--porcelain").count("worktree ") == 1
        repo.git.worktree("add", "--detach", str(scratch / "fixes" / "apply-y"), shas["bad"])
    assert repo.git.worktree("list", "--porcelain").count("worktree ") == 1 and not scratch.exists()


@pytest.mark.container
def test_a_killed_docker_verification_s_containers_go_with_its_scratch(docker_client, demo_base_image, tmp_path,
                                                                        monkeypatch):
    """`fix --verify --executor docker` SIGKILLed mid-run leaves its container running; the next
    run on this host, whichever executor it uses, removes it by the dead run's label first."""
    import re
    import socket

    from bisect_npu.execute.docker import SESSION_LABEL
    from bisect_npu.journal import session_label
    from bisect_npu.orchestration.opening.environments import verification_scratch, verification_session

    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    make_upstream(tmp_path / "up")
    host = re.sub(r"[^\w.]", "_", socket.gethostname())
    dead = tmp_path / "cache" / "fix-verify" / f"{host}--999999999-c0ffee00"
    dead.mkdir(parents=True)
    (dead / "executor").write_text("docker\n")  # as the killed run wrote it
    label = {SESSION_LABEL: session_label(verification_session(dead))}
    left = docker_client.containers.run(demo_base_image, ["sleep", "300"], detach=True, labels=label)
    try:
        with verification_scratch(git.Repo(tmp_path / "up"), "local") as scratch:
            wanted = {"label": f"{SESSION_LABEL}={label[SESSION_LABEL]}"}
            assert docker_client.containers.list(all=True, filters=wanted) == [] and not dead.exists()
            assert (scratch / "executor").read_text() == "local\n"
    finally:
        with contextlib.suppress(Exception):
            left.remove(force=True)


def test_a_killed_docker_verification_is_kept_while_the_engine_is_out_of_reach(tmp_path, monkeypatch):
    """Its containers can only be found through its directory: with no engine to ask, it stays."""
    import re
    import socket

    from bisect_npu.orchestration.opening.environments import verification_scratch

    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    make_upstream(tmp_path / "up")
    host = re.sub(r"[^\w.]", "_", socket.gethostname())
    dead = tmp_path / "cache" / "fix-verify" / f"{host}--999999999-c0ffee01"
    dead.mkdir(parents=True)
    (dead / "executor").write_text("docker\n")
    with verification_scratch(git.Repo(tmp_path / "up")):
        assert dead.is_dir()
