"""Small things a new user meets first: each message says what to do in this situation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import git as gitpython
import pytest

from bisect_npu.errors import UsageError
from bisect_npu.upstream import history
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import GOOD_CMD, git, make_linear_repo

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e


def bisect(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command line in this process (its sessions' commands still run in processes of their own)."""
    return cli_in_process(list(args), cwd=cwd)


def test_sessions_in_the_users_checkout_stay_out_of_git_status_and_resume_names_no_option(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 9, culprit=5, tags={0: "good", 8: "bad"})
    done = bisect("run", "--good", "good", "--bad", "bad", "--cmd", " ".join(GOOD_CMD), "--no-fix", "--json", cwd=repo)
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1])["culprit"] == shas[5], done.stderr
    assert (repo / ".bisect-npu" / "sessions" / ".gitignore").is_file()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    # The session's repository moved away: resume has no --repo, so its message must not suggest one.
    session = Path(json.loads(done.stdout.splitlines()[-1])["session"])
    moved = tmp_path / "moved"
    repo.rename(moved)
    again = bisect("resume", "--session", str(moved / session.relative_to(repo)), cwd=tmp_path)
    assert again.returncode == 2, again.stderr
    assert "is not a git repository; the session's repository was moved or removed" in again.stderr
    assert "--repo" not in again.stderr


def test_a_variable_before_the_command_suggests_env(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 3, tags={0: "good", 2: "bad"})
    done = bisect("run", "--good", "good", "--bad", "bad", "--cmd", "LANG=C grep -qx good state", cwd=repo)
    assert done.returncode == 2 and "put `env` first: --cmd 'env LANG=C grep -qx good state'" in done.stderr
    assert "command not found" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_good_newer_than_bad_mentions_find_fix(tmp_path: Path) -> None:
    repo_path = tmp_path / "repo"
    make_linear_repo(repo_path, 4, tags={0: "old", 3: "new"})
    with pytest.raises(UsageError, match=r"swap --good and --bad, or, if the newer end is the one that works .*"
                                         r"add --find-fix"):
        history.resolve_range(gitpython.Repo(repo_path), "new", "old")


def test_a_shallow_clone_says_it_is_shallow(tmp_path: Path) -> None:
    """The good end fetched on its own into a shallow clone: the history that joins the ends is
    missing, which is not the same as two unrelated histories."""
    upstream = tmp_path / "upstream"
    make_linear_repo(upstream, 12, tags={0: "v1.0", 11: "v2.0"})
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "2", f"file://{upstream}", str(clone)], check=True)
    git(clone, "fetch", "-q", "--depth", "1", "origin", "tag", "v1.0")
    with pytest.raises(UsageError, match=r"shallow clone .*run `git fetch --unshallow`"):
        history.resolve_range(gitpython.Repo(clone), "v1.0", "v2.0")


def test_ends_judged_wrong_show_the_run_s_output_and_its_log(tmp_path: Path) -> None:
    """"good end judged bad" alone sent users digging: the answer is usually in the command's output."""
    repo = tmp_path / "repo"
    make_linear_repo(repo, 9, culprit=5, tags={0: "good", 8: "bad"})
    command = "python3 -c \"import sys; print('check.py: no such file'); sys.exit(2)\""
    done = bisect("run", "--good", "good", "--bad", "bad", "--cmd", command, "--no-fix", "--session",
                  str(tmp_path / "s"), cwd=repo)
    assert done.returncode == 4, done.stderr
    lines = done.stdout.splitlines()
    assert "precondition failed: the good end good was judged bad" in lines[0]
    log = Path(lines[0].rsplit("(its run's log: ", 1)[1].rstrip(")"))
    assert log.is_file() and "check.py: no such file" in log.read_text()
    assert lines[1:3] == ["its last lines of output:", "    check.py: no such file"]
    again = bisect("resume", "--session", str(tmp_path / "s"), cwd=repo)  # an ended session answers the same
    assert again.returncode == 4 and again.stdout.splitlines()[:3] == lines[:3]


def test_sessions_go_to_one_root_at_the_checkout_s_top_from_any_subdirectory(tmp_path: Path) -> None:
    """Run from `docs/`, resumed from `tests/`: one `.bisect-npu/` at the top, none in the
    subdirectories, nothing in `git status`."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 9, culprit=5, tags={0: "good", 8: "bad"},
                            files=lambda i: {"docs/index.md": "docs\n", "tests/t.txt": "t\n"} if i == 0 else {})
    done = bisect("run", "--good", "good", "--bad", "bad", "--cmd", "grep -qx good state", "--no-fix", "--json",
                  cwd=repo / "docs")
    assert done.returncode == 0, done.stderr
    session = Path(json.loads(done.stdout.splitlines()[-1])["session"])
    assert session.parent == (repo / ".bisect-npu" / "sessions").resolve()
    assert not (repo / "docs" / ".bisect-npu").exists()
    again = bisect("resume", "--json", cwd=repo / "tests")  # the latest session, found from elsewhere in the checkout
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[-1])["culprit"] == shas[5]
    assert not (repo / "tests" / ".bisect-npu").exists()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
