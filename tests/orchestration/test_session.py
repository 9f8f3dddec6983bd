"""End to end through the real CLI: real git repositories, real processes, the command oracle."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import GOOD_CMD, add_commit, git, make_linear_repo

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "bisect_npu"]
GOOD_CMD_STR = " ".join(GOOD_CMD)


def bisect(*args: str, cwd: Path, check_code: int | None = None) -> subprocess.CompletedProcess[str]:
    """The command line in this process (its steps' commands still run in processes of their own)."""
    done = cli_in_process(list(args), cwd=cwd)
    if check_code is not None:
        assert done.returncode == check_code, done.stdout + done.stderr
    return done


def summary(done: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def journal_lines(session: Path) -> list[dict]:
    return [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def repo1000(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("up") / "repo"
    shas = make_linear_repo(path, 1001, culprit=637, tags={0: "v1.0", 1000: "v2.0"})
    return path, shas


def test_finds_culprit_in_1000_commits_within_12_runs(repo1000: tuple[Path, list[str]], tmp_path: Path) -> None:
    repo, shas = repo1000
    done = bisect("run", "--repo", str(repo), "--good", "v1.0", "--bad", "v2.0", "--cmd", GOOD_CMD_STR,
                  "--session", str(tmp_path / "s"), "--cache-size", "512M", "--json", cwd=tmp_path, check_code=0)
    result = summary(done)
    assert result["culprit"] == shas[637]
    assert journal_lines(tmp_path / "s")[0]["request"]["executor"]["cache_size_gb"] == 0.5
    assert result["steps"] <= 12  # ceil(log2 1000) = 10, plus the two end checks
    report = Path(result["report"]).read_text()
    assert shas[637][:12] in report and "First bad commit" in report
    assert "bisect-npu run --repo" in report  # reproduce command
    steps = [e for e in journal_lines(tmp_path / "s") if e["type"] == "step"]
    assert len({e["commit"] for e in steps}) == len(steps)  # never the same commit twice
    # The user's checkout is untouched: worktrees live under the session.
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "state").read_text() == "bad\n"


@pytest.mark.heavy  # kills at many moments, each resumed: the resume tests' heaviest variant
def test_kill_at_random_moments_then_resume(tmp_path: Path) -> None:
    """SIGKILL `run`/`resume` 20 times; resume always reaches the same culprit, never redoes a step."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 1001, culprit=123, tags={0: "good", 1000: "bad"})
    session = tmp_path / "session"
    slow_cmd = f"sh -c 'sleep 1; {GOOD_CMD_STR}'"  # ~12 steps of >= 1 s: 20 kills land before the end
    rng = random.Random(7)
    first = [*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", slow_cmd,
             "--session", str(session), "--no-fix", "--quiet"]
    again = [*CLI, "resume", "--session", str(session), "--quiet"]
    kills = 0
    for attempt in range(60):
        argv = first if attempt == 0 or not (session / "journal.jsonl").exists() else again
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        if kills < 20:
            time.sleep(rng.uniform(0.1, 1.5))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        _out, err = proc.communicate(timeout=120)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL or b"being driven" in err, err.decode()
    assert kills == 20
    entries = journal_lines(session)  # every surviving line is valid JSON (a torn tail was truncated)
    end = [e for e in entries if e["type"] == "end"]
    assert len(end) == 1 and end[0]["culprit"] == shas[123]
    steps = [e["index"] for e in entries if e["type"] == "step"]
    assert len(steps) == len(set(steps)), "a finished step was redone after a kill"
    done = bisect("report", "--session", str(session), "--format", "json", cwd=tmp_path, check_code=0)
    assert json.loads(done.stdout)["culprit"] == shas[123]


def test_good_end_bad_is_a_precondition_failure(repo1000: tuple[Path, list[str]], tmp_path: Path) -> None:
    repo, shas = repo1000
    done = bisect("run", "--repo", str(repo), "--good", shas[700], "--bad", "v2.0", "--cmd", GOOD_CMD_STR,
                  "--session", str(tmp_path / "s"), "--json", cwd=tmp_path, check_code=4)
    assert "good end" in done.stdout and "judged bad" in done.stdout


def test_skips_narrow_to_a_range(tmp_path: Path) -> None:
    """Untestable commits around the culprit: the answer is the smallest range that holds it (exit 3)."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 41, culprit=20, tags={0: "good", 40: "bad"},
                            files=lambda i: {"untestable": "yes\n" if 18 <= i <= 21 else "no\n"})
    (tmp_path / "judge.sh").write_text("#!/bin/sh\ngrep -qx yes untestable && exit 125\n"
                                       "grep -qx good state\n")
    (tmp_path / "judge.sh").chmod(0o755)
    done = bisect("run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", str(tmp_path / "judge.sh"),
                  "--session", str(tmp_path / "s"), "--json", cwd=tmp_path, check_code=3)
    lo, hi = summary(done)["range"]
    assert (lo, hi) == (shas[17], shas[22])  # 22 is the first testable bad: it may be the culprit itself
    assert "Skipped commits" in (tmp_path / "s" / "report.md").read_text()


def test_merge_base_is_used_and_reported(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 5, tags={4: "v0.9.0rc1"})
    git(repo, "checkout", "-q", "-b", "v0.9.1-dev")
    for i in range(6):
        add_commit(repo, f"[BugFix] release change {i} (#{200 + i})", {"state": "bad\n" if i >= 3 else "good\n"})
    git(repo, "tag", "v0.9.1")
    git(repo, "checkout", "-q", "main")
    add_commit(repo, "main change (#300)", {"other": "x\n"})
    git(repo, "tag", "v0.9.0rc2")
    done = bisect("run", "--repo", str(repo), "--good", "v0.9.0rc2", "--bad", "v0.9.1", "--cmd", GOOD_CMD_STR,
                  "--session", str(tmp_path / "s"), "--json", cwd=tmp_path, check_code=0)
    assert "merge-base" in done.stderr
    report = (tmp_path / "s" / "report.md").read_text()
    assert "merge-base" in report and "release change 3" in report


def test_json_ends_stdout_even_on_a_usage_error(repo1000: tuple[Path, list[str]], tmp_path: Path) -> None:
    repo, _ = repo1000
    done = bisect("run", "--repo", str(repo), "--good", "v1.0", "--bad", "v2.0", "--cmd", GOOD_CMD_STR,
                  "--slots", "0", "--json", cwd=tmp_path, check_code=2)
    last = summary(done)
    assert (last["status"], last["exit_code"], last["session"]) == ("error", 2, None) and "--slots" in last["message"]


@pytest.mark.parametrize(
    ("args", "needle", "code"),
    [
        (["--good", "v1.1", "--bad", "v2.0"], "unknown ref v1.1; nearest tags:", 2),
        (["--good", "v2.0", "--bad", "v2.0"], "same commit", 2),
        (["--good", "v2.0", "--bad", "v1.0"], "newer", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--cmd", "no-such-program-xyz"], "command not found", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--cmd", "./untracked-check.sh"], "is not committed at", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--cmd", "sh ./untracked-check.sh"], "is not committed at", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--cmd", "./state"], "./state is not executable", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--cache-size", "lots"], "--cache-size 'lots': give a size", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--mode", "noisy", "--confidence", "1.5"], "--confidence", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--slots", "0"], "--slots", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--timeout", "0"], "--timeout", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--timeout", "nan"], "is not a finite number", 2),
        (["--good", "v1.0", "--bad", "v2.0", "--session", "/proc/no/such"], "cannot make session directory", 2),
    ],
)
def test_bad_input_one_line_error(repo1000: tuple[Path, list[str]], tmp_path: Path, args: list[str], needle: str,
                                  code: int) -> None:
    repo, _ = repo1000
    if "--cmd" not in args:
        args = [*args, "--cmd", GOOD_CMD_STR]
    if "--session" not in args:
        args = [*args, "--session", str(tmp_path / "s")]
    done = bisect("run", "--repo", str(repo), *args, cwd=tmp_path, check_code=code)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert not (tmp_path / "s").exists()  # nothing half-made


def test_not_a_git_repository(tmp_path: Path) -> None:
    done = bisect("run", "--repo", str(tmp_path), "--good", "a", "--bad", "b", "--cmd", "true", cwd=tmp_path,
                  check_code=2)
    assert "is not a git repository" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_sessions_named_alike_get_their_own_part_of_a_shared_workdir(tmp_path: Path) -> None:
    from bisect_npu.journal import session_label

    first, second = session_label(tmp_path / "a" / "s"), session_label(tmp_path / "b" / "s")
    assert first != second and first.startswith("s-") and second.startswith("s-")
    assert session_label(tmp_path / "a" / "s") == first  # the same session (resumed) finds its own again


@pytest.mark.parametrize("kind", ["file", "missing"])
def test_bad_worktree_location(repo1000: tuple[Path, list[str]], tmp_path: Path, kind: str) -> None:
    repo, _ = repo1000
    workdir = tmp_path / "missing-parent" / "wt"
    if kind == "file":
        workdir = tmp_path / "wt"
        workdir.write_text("mine")
    done = bisect("run", "--repo", str(repo), "--good", "v1.0", "--bad", "v2.0", "--cmd", GOOD_CMD_STR,
                  "--workdir", str(workdir), "--session", str(tmp_path / "s"), cwd=tmp_path, check_code=2)
    assert "worktree location" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_workdir_holding_other_things_is_used_and_left_as_it_was(repo1000: tuple[Path, list[str]],
                                                                   tmp_path: Path) -> None:
    repo, shas = repo1000
    workdir = tmp_path / "fast-disk"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    git(repo, "worktree", "add", "--detach", str(workdir / shas[5][:12]), shas[5])  # the user's own, sha-named
    (workdir / shas[5][:12] / "precious.py").write_text("uncommitted work\n")
    done = bisect("run", "--repo", str(repo), "--good", "v1.0", "--bad", "v2.0", "--cmd", GOOD_CMD_STR,
                  "--workdir", "fast-disk", "--session", str(tmp_path / "s"), "--json", cwd=tmp_path,
                  check_code=0)
    assert summary(done)["culprit"] == shas[637]
    header = journal_lines(tmp_path / "s")[0]
    assert header["request"]["executor"]["workdir"] == str(workdir.resolve())  # resume may run elsewhere
    assert sorted(p.name for p in workdir.iterdir()) == sorted(["notes.txt", shas[5][:12]])
    assert (workdir / shas[5][:12] / "precious.py").read_text() == "uncommitted work\n"
    git(repo, "worktree", "remove", "--force", str(workdir / shas[5][:12]))


def test_resume_refuses_a_session_driven_by_another_process(repo1000: tuple[Path, list[str]],
                                                            tmp_path: Path) -> None:
    repo, _ = repo1000
    session = tmp_path / "s"
    slow = f"sh -c 'sleep 1; {GOOD_CMD_STR}'"
    proc = subprocess.Popen([*CLI, "run", "--repo", str(repo), "--good", "v1.0", "--bad", "v2.0", "--cmd", slow,
                             "--session", str(session), "--quiet"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not (session / "journal.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        before = (session / "journal.jsonl").read_bytes()
        done = bisect("resume", "--session", str(session), cwd=tmp_path, check_code=2)
        assert "another bisect-npu process" in done.stderr
        assert (session / "journal.jsonl").read_bytes().startswith(before)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_abort_exit_code_above_127(repo1000: tuple[Path, list[str]], tmp_path: Path) -> None:
    repo, _ = repo1000
    aborting = "sh -c 'echo the oracle cannot judge here > \"$BISECT_NPU_REASON_FILE\"; exit 200'"
    done = bisect("run", "--repo", str(repo), "--good", "v1.0", "--bad", "v2.0", "--cmd", aborting,
                  "--session", str(tmp_path / "s"), "--json", cwd=tmp_path, check_code=5)
    assert "above 127" in done.stderr
    assert "aborting as `git bisect run` does (the oracle cannot judge here); see " in done.stderr
    last = summary(done)  # CI still gets its JSON line
    assert (last["status"], last["exit_code"], last["session"]) == ("error", 5, str(tmp_path / "s"))
    assert "above 127" in last["message"]


def test_an_end_without_the_recipes_dockerfile_is_refused_before_anything_runs(tmp_path: Path) -> None:
    # Dockerfile.a3 arrives with commit 4: a good end before it could never be built for A3.
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 9, culprit=6, files=lambda i: {"Dockerfile.a3": "FROM base\n"} if i == 4 else {})
    recipe = tmp_path / "a3.yaml"
    recipe.write_text("name: t\nmodel:\n  path: /models/m\ncases:\n  - id: a\n    prompt: hi\n"
                      "build:\n  dockerfile: Dockerfile.a3\n")
    done = bisect("run", "--repo", str(repo), "--good", shas[0], "--bad", shas[8], "--recipe", str(recipe),
                  "--executor", "docker", "--session", str(tmp_path / "s"), cwd=tmp_path, check_code=2)
    assert (f"the good end {shas[0]} ({shas[0][:12]}) has no Dockerfile.a3, so it cannot be built for that "
            f"target (it first appears at {shas[4][:12]} in this range)") in done.stderr
    assert not (tmp_path / "s").exists()


def test_a_commit_that_does_not_build_is_skipped_and_stepped_around(tmp_path: Path) -> None:
    import git as gitpython

    from bisect_npu.builders.local import LocalBuilder
    from bisect_npu.execute.local import LocalExecutor
    from bisect_npu.orchestration.session import Session
    from tests.helpers.asked import spec_of

    # Commit 8 of 16 (the first midpoint) breaks the build; commit 9 repairs it; the culprit is 11.
    shas = make_linear_repo(tmp_path / "repo", 17, culprit=11,
                            files=lambda i: {"BROKEN": "x\n"} if i == 8 else {"BROKEN": None} if i == 9 else {})
    repo = gitpython.Repo(tmp_path / "repo")
    options = spec_of(good=shas[0], bad=shas[16], repo=str(tmp_path / "repo"), command=GOOD_CMD,
                         propose_fix=False)
    builder = LocalBuilder(repo, tmp_path / "work", ["sh", "-c", "test ! -e BROKEN"])
    result = Session.start(options, session_dir=tmp_path / "s", builder=builder,
                           executor=LocalExecutor({}, ["."])).run()
    assert result.culprit == shas[11]
    steps = [json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    broken = [s for s in steps if s["type"] == "step" and s["index"] == 8]
    assert [(s["build"]["how"], s["verdict"]["kind"]) for s in broken] == [("failed", "skip")]
    assert "build failed with exit code 1" in broken[0]["verdict"]["reason"]


def _cut_journal(session: Path, keep: Callable[[list[dict]], int]) -> list[dict]:
    """Drop the journal's lines from index keep(entries) on, as a kill at that moment would have."""
    lines = (session / "journal.jsonl").read_text().splitlines(keepends=True)
    cut = keep([json.loads(line) for line in lines])
    (session / "journal.jsonl").write_text("".join(lines[:cut]))
    return [json.loads(line) for line in lines[cut:]]


def test_a_run_killed_during_fix_verification_resumes_only_the_rest(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    titles = {20: "[Feature] state handling (#20)"}
    shas = make_linear_repo(repo, 41, culprit=20, tags={0: "good", 40: "bad"},
                            titles=lambda i: titles.get(i, f"Change {i} (#{1000 + i})"))
    add_commit(repo, "[BugFix] state back to good (#2000)", {"state": "good\n"})
    add_commit(repo, "[Misc] state wording (#2001)", {"state": "good\n\n"})
    add_commit(repo, "[BugFix] state handling, again (#2002)", {"state": "good\n"})
    session = tmp_path / "s"
    bisect("run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", GOOD_CMD_STR, "--verify-fix",
           "--session", str(session), "--quiet", cwd=tmp_path, check_code=0)
    whole = journal_lines(session)
    verified = [e["verification"] for e in whole if e["type"] == "fix_verified"]
    final = next(e["verifications"] for e in whole if e["type"] == "fix_verify")
    assert len(verified) == len(final) and final[0]["status"] == "verified"
    assert final[0]["proposal"]["title"] == "[BugFix] state back to good (#2000)"
    # The walk stops at the first proposal that works: the ones ranked below it are never tried.
    assert all(v["status"] != "verified" for v in final[1:])

    # Killed after the first verification was journaled: resume verifies only what was not tried, and
    # nothing when the fix was already found.
    lost = _cut_journal(session, lambda entries: 1 + next(i for i, e in enumerate(entries)
                                                          if e["type"] == "fix_verified"))
    done = bisect("resume", "--session", str(session), "--json", cwd=tmp_path, check_code=0)
    assert summary(done)["culprit"] == shas[20]
    again = journal_lines(session)
    redone = [e["verification"]["proposal"]["shas"] for e in again if e["type"] == "fix_verified"]
    assert len(redone) == len(verified) and len({s[0] for s in redone}) == len(redone)  # none verified twice
    assert [e["type"] for e in again].count("fix") == 1
    assert [(v["proposal"]["shas"], v["status"]) for v in next(e["verifications"] for e in again
                                                               if e["type"] == "fix_verify")] == \
        [(v["proposal"]["shas"], v["status"]) for v in final]
    assert len(lost) == len(verified)  # the later verifications and the summary line were gone

    # Killed after the culprit was journaled, before the fixes were ranked: resume ranks and verifies.
    _cut_journal(session, lambda entries: next(i for i, e in enumerate(entries) if e["type"] == "fix"))
    bisect("resume", "--session", str(session), cwd=tmp_path, check_code=0)
    kinds = [e["type"] for e in journal_lines(session)]
    assert kinds.count("fix") == 1 and kinds.count("fix_verify") == 1 and kinds.count("fix_verified") == len(verified)
    report = (session / "report.md").read_text()
    assert "state back to good" in report
    assert f"found after trying {len(final)} proposal(s) in ranking order" in report


@pytest.mark.heavy  # the Ctrl-C test's variant for SIGTERM
def test_sigterm_unwinds_like_ctrl_c_and_leaves_no_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 200, culprit=77, tags={0: "good", 199: "bad"})
    session = tmp_path / "s"
    proc = subprocess.Popen([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd",
                             f"sh -c 'sleep 2; {GOOD_CMD_STR}'", "--session", str(session), "--quiet"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any((session / "worktrees").glob("*/.git")):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and f"bisect-npu resume --session {session}" in err
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    done = bisect("resume", "--session", str(session), "--json", cwd=tmp_path, check_code=0)
    assert summary(done)["steps"] >= 2


def test_trials_of_an_interrupted_noisy_step_are_reported_and_counted(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 33, culprit=20, tags={0: "good", 32: "bad"})
    session = tmp_path / "s"
    bisect("run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", GOOD_CMD_STR, "--mode", "noisy",
           "--no-fix", "--session", str(session), "--quiet", cwd=tmp_path, check_code=0)
    # Killed after a trial was journaled and before its step line: cut the journal there.
    lines = (session / "journal.jsonl").read_text().splitlines(keepends=True)
    cut = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "step"][4]
    (session / "journal.jsonl").write_text("".join(lines[:cut]))
    lost = json.loads(lines[cut - 1])
    assert lost["type"] == "trial"
    kept = [json.loads(line) for line in lines[:cut]]
    last_step = max((i for i, e in enumerate(kept) if e["type"] == "step" and e["index"] == lost["index"]), default=-1)
    cut_trials = [e for e in kept[last_step + 1:] if e["type"] == "trial" and e["index"] == lost["index"]]
    done = bisect("resume", "--session", str(session), "--json", cwd=tmp_path, check_code=0)
    assert summary(done)["culprit"] == shas[20]
    report = json.loads(bisect("report", "--session", str(session), "--format", "json", cwd=tmp_path,
                               check_code=0).stdout)
    rows = report["steps"]
    cut_short = [r for r in rows if r["verdict"] == "unfinished"]
    assert len(cut_short) == 1 and cut_short[0]["index"] == lost["index"]
    assert cut_short[0]["trials"] == len(cut_trials) >= 1
    assert rows.index(cut_short[0]) == 4  # where it happened: after the four steps journaled before it
    trial_lines = [e for e in journal_lines(session) if e["type"] == "trial"]
    assert sum(r["trials"] for r in rows) == len(trial_lines)  # every trial counted is in a row
    assert "counted as evidence" in (session / "report.md").read_text()


def test_a_step_whose_trials_were_all_journaled_is_judged_without_building_again(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 65, culprit=40, tags={0: "good", 64: "bad"})
    session = tmp_path / "s"
    marker = tmp_path / "runs.log"
    cmd = f"sh -c 'echo $BISECT_NPU_COMMIT >> {marker}; {GOOD_CMD_STR}'"
    bisect("run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", cmd, "--no-fix",
           "--session", str(session), "--quiet", cwd=tmp_path, check_code=0)
    lines = (session / "journal.jsonl").read_text().splitlines(keepends=True)
    cut = [i for i, line in enumerate(lines) if json.loads(line)["type"] == "step"][3]
    killed_at = json.loads(lines[cut])
    (session / "journal.jsonl").write_text("".join(lines[:cut]))  # its trial is in, its step line is not
    runs_before = marker.read_text().splitlines()
    bisect("resume", "--session", str(session), cwd=tmp_path, check_code=0)
    again = next(e for e in journal_lines(session) if e["type"] == "step" and e["index"] == killed_at["index"])
    assert again["build"]["how"] == "journaled" and again["verdict"]["kind"] == killed_at["verdict"]["kind"]
    assert [t["trial"] for t in again["trials"]] == [t["trial"] for t in killed_at["trials"]]
    rerun = marker.read_text().splitlines()[len(runs_before):]
    assert killed_at["commit"] not in rerun  # the command did not run again for that commit


def test_command_paths_are_checked_against_both_ends_and_nothing_else(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import git as gitpython

    from bisect_npu.errors import UsageError
    from bisect_npu.orchestration.opening.preflight import check_command

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 2)
    (repo / "check.sh").write_text("#!/bin/sh\nexit 0\n")
    (repo / "check.sh").chmod(0o755)
    (repo / "run-check").symlink_to("check.sh")
    git(repo, "add", "check.sh", "run-check")
    git(repo, "commit", "-qm", "checks")
    ends = [shas[0], git(repo, "rev-parse", "HEAD")]
    r = gitpython.Repo(repo)
    with pytest.raises(UsageError, match=r"\./check\.sh is not committed at"):
        check_command(["./check.sh"], r, ends)  # the good end predates it
    ends[0] = ends[1]
    check_command(["./check.sh"], r, ends)
    check_command(["./run-check"], r, ends)  # a committed symlink to an executable
    check_command(["sh", "-c", "./untracked.sh && test -f x"], r, ends)  # a shell snippet, not a path
    check_command(["./check.sh", "./"], r, ends)
    with pytest.raises(UsageError, match="is a directory"):
        check_command(["./"], r, ends)
    (repo / "tools").mkdir()
    (repo / "tools" / "x.py").write_text("print(1)\n")
    (repo / "linked").symlink_to("tools")
    git(repo, "add", "tools", "linked")
    git(repo, "commit", "-qm", "a linked directory")
    ends = [git(repo, "rev-parse", "HEAD")] * 2
    check_command(["python3", "./linked/x.py"], r, ends)  # through a committed directory symlink
    (tmp_path / "1").write_text("")
    monkeypatch.chdir(tmp_path)
    check_command(["test", "1", "=", "1"], r, ends)  # a file of that name here, outside the repository
    with pytest.raises(UsageError, match=r"\./missing\.sh is not committed"):
        check_command(["sh", "./missing.sh"], r, ends)


def test_a_finished_session_with_nothing_to_verify_is_not_redone_on_resume(repo1000: tuple[Path, list[str]],
                                                                            tmp_path: Path) -> None:
    repo, _ = repo1000
    session = tmp_path / "s"
    bisect("run", "--repo", str(repo), "--good", "v1.0", "--bad", "v2.0", "--cmd", GOOD_CMD_STR, "--verify-fix",
           "--session", str(session), "--quiet", cwd=tmp_path, check_code=0)
    done = bisect("resume", "--session", str(session), cwd=tmp_path, check_code=0)
    assert "re-rendering the report only" in done.stdout + done.stderr
    kinds = [e["type"] for e in journal_lines(session)]
    assert kinds.count("fix") == 1 and kinds.count("fix_verify") == 1


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its (adopted) parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def test_resume_stops_what_a_sigkilled_run_left_running(tmp_path: Path) -> None:
    """A SIGKILLed run cannot stop its oracle command (its own process group, on an NPU host it
    holds the cards): the resumed session finds it by its mark and kills it, descendants too,
    before running anything; another session's processes are left alone."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 9, culprit=5, tags={0: "good", 8: "bad"})
    hold, pids = tmp_path / "hold", tmp_path / "pids"
    hold.touch()
    command = (f"sh -c 'if [ -f {hold} ]; then sleep 600 & echo $$ $! >> {pids}; wait; fi; {GOOD_CMD_STR}'")
    session = tmp_path / "s"
    proc = subprocess.Popen([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", command,
                             "--session", str(session), "--no-fix", "--quiet"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bystander = subprocess.Popen(["sleep", "600"], env={**os.environ, "BISECT_NPU_OWNER": str(tmp_path / "other")})
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and pids.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None, "the command never started"
            time.sleep(0.1)
        proc.kill()  # the driving process only, as the kernel's OOM killer or `kill -9 PID` would
        proc.wait(timeout=30)
        left = [int(pid) for pid in pids.read_text().split()]
        assert all(_running(pid) for pid in left), "nothing was left running: the test shows nothing"
        hold.unlink()
        done = bisect("resume", "--session", str(session), "--json", cwd=tmp_path, check_code=0)
        assert summary(done)["culprit"] == shas[5]
        assert not any(_running(pid) for pid in left)
        assert "stopped 2 leftover container(s) or process(es) of a killed earlier run" in done.stdout + done.stderr
        # The report gives the oracle command as it would be typed again, quotes and all.
        assert f"oracle command: `{shlex.join(shlex.split(command))}`" in (session / "report.md").read_text()
        assert _running(bystander.pid)
    finally:
        bystander.kill()
        if proc.poll() is None:
            proc.kill()
        for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("command", ["grep -qx good state || exit 1", "make check && ./run.sh", "cat state > out",
                                     "test -f x; grep -qx good state", "echo $(date)", "pytest x|tee log",
                                     "make&&pytest", "pytest 1>/dev/null", "test -s state # must not be empty",
                                     "grep -qx good state # don't", 'test "$(cat state)" = good', "echo `date`",
                                     "python ~/check.py", "python check.py --model $MODEL", "a\nb",
                                     "find . -exec true {} \\; ; false"])
def test_shell_syntax_in_cmd_is_refused_before_anything_runs(command: str, tmp_path: Path) -> None:
    """--cmd has no shell: `a || b` would hand `||` to `a`, whose failure then reads as "bad"."""
    done = bisect("run", "--repo", str(tmp_path), "--good", "a", "--bad", "b", "--cmd", command, cwd=tmp_path,
                  check_code=2)
    assert "--cmd" in done.stderr and ("sh -c" in done.stderr or "check its quotes" in done.stderr)
    assert not (tmp_path / ".bisect-npu").exists()


@pytest.mark.parametrize(("command", "words"), [
    ("sh -c 'make || exit 1;'", ["sh", "-c", "make || exit 1;"]),
    ("bash -c 'set -e; make; pytest;'", ["bash", "-c", "set -e; make; pytest;"]),
    ("python -c \"print(1 > 0)\"", ["python", "-c", "print(1 > 0)"]),
    ("pytest -k 'a or b'", ["pytest", "-k", "a or b"]),
    ("test ! -e build/broken", ["test", "!", "-e", "build/broken"]),
    ("grep -q done log.txt", ["grep", "-q", "done", "log.txt"]),
    ("find . -name '*.so' -exec false {} \\;", ["find", ".", "-name", "*.so", "-exec", "false", "{}", ";"]),
    ("python check.py '<none>'", ["python", "check.py", "<none>"]),
    ("env A=1 make -j4", ["env", "A=1", "make", "-j4"]),
    ("grep -q '|' state", ["grep", "-q", "|", "state"]),
    ("cut -d ';' -f1 state", ["cut", "-d", ";", "-f1", "state"]),
    ("expr 3 '>' 2", ["expr", "3", ">", "2"]),
    ("echo \\;", ["echo", ";"]),
    ("pytest 'tests/t.py::x[a|b]'", ["pytest", "tests/t.py::x[a|b]"]),
    ("sh -c 'a\nb'", ["sh", "-c", "a\nb"]),
])
def test_shell_syntax_inside_quotes_is_the_program_s_own(command: str, words: list[str]) -> None:
    from bisect_npu.orchestration.opening.preflight import command_words

    assert command_words(command) == words
