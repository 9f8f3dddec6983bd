"""Release-level bisection through `bisect-npu run --package`: real venvs of a small package from
PyPI (python-dateutil), then the switch to commits between the two adjacent releases' tags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.gitrepo import make_linear_repo

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "bisect_npu"]

# The bad case: dateutil >= 2.9 at release level (cwd is the version's venv, `python` its
# interpreter); in a source checkout (commit level) the `state` file says good or bad.
CHECK = """\
import os, sys
if os.path.exists("state"):
    sys.exit(0 if open("state").read().strip() == "good" else 1)
import dateutil
major, minor = (int(x) for x in dateutil.__version__.split(".")[:2])
sys.exit(1 if (major, minor) >= (2, 9) else 0)
"""


@pytest.fixture(scope="module")
def release_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's private cache (the versions' venvs, the index listing): a venv of a published
    version is the same in every test, so each is built once here, not once a test."""
    return tmp_path_factory.mktemp("release-cache")


@pytest.fixture()
def env(tmp_path: Path, release_cache: Path) -> dict[str, str]:
    """The private cache and a `python` on PATH for the commit level."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    return {**os.environ, "BISECT_NPU_CACHE": str(release_cache),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_release_level_then_commit_level(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "check.py").write_text(CHECK)
    repo = tmp_path / "upstream"
    shas = make_linear_repo(repo, 31, culprit=24, tags={0: "v2.8.0", 10: "v2.8.1", 20: "v2.8.2", 30: "v2.9.0"})
    session = tmp_path / "s"
    done = subprocess.run([*CLI, "run", "--package", "python-dateutil", "--good", "2.8.0", "--bad", "2.9.0.post0",
                           "--index-url", "https://pypi.org/simple", "--repo", str(repo), "--cmd",
                           f"python {tmp_path / 'check.py'}", "--session", str(session), "--json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["culprit"] == shas[24]  # the commit level's answer
    # The package's options end at the release level: the commit level's reproduce line has none.
    commit_level = json.loads((Path(result["session"]) / "journal.jsonl").read_text().splitlines()[0])
    commits = commit_level["request"]["range"]
    assert commits["package"] is None and commits["index_url"] is None
    # The clone holds no `dateutil` package: commits as usual.
    assert commits["overlay_on_release"] is None and commit_level["level"] == {"kind": "commits",
                                                                               "overlay_on_release": None}
    releases = json.loads((session / "report.json").read_text())
    assert releases["level"] == "versions" and releases["level_culprit"] == "2.9.0.post0"  # 2.9.0 grouped with it
    assert releases["culprit"] == shas[24]  # the session's one answer: the commit `run` printed
    assert releases["next_level"]["good"] == "v2.8.2" and releases["next_level"]["bad"] == "v2.9.0"
    assert "Commit level" in (session / "report.md").read_text()
    tested = {s["commit"] for s in releases["steps"]}
    assert "2.9.0" not in tested  # a rebuild group is one candidate

    # Killed during the commit level (its last steps and the release level's `next_level` line
    # not journaled yet): resume continues that commit-level session, then notes its answer.
    child = Path(result["session"])
    _cut(session, lambda entries: next(i for i, e in enumerate(entries) if e["type"] == "next_level"))
    child_steps = sum(1 for e in _entries(child) if e["type"] == "step")
    _cut(child, lambda entries: [i for i, e in enumerate(entries) if e["type"] == "step"][-2])
    done = subprocess.run([*CLI, "resume", "--session", str(session), "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[24]
    assert "release level done: 2.8.2 -> 2.9.0.post0; bisecting commits v2.8.2..v2.9.0" in done.stderr
    assert sum(1 for e in _entries(child) if e["type"] == "step") == child_steps  # only the two lost ones again
    assert [e["type"] for e in _entries(session)].count("next_level") == 1
    assert not (child / "commit-level").exists()


def _entries(session: Path) -> list[dict]:
    return [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]


def _cut(session: Path, keep: Callable[[list[dict]], int]) -> None:
    """Drop the journal's lines from index keep(entries) on, as a kill at that moment would have."""
    lines = (session / "journal.jsonl").read_text().splitlines(keepends=True)
    (session / "journal.jsonl").write_text("".join(lines[:keep([json.loads(line) for line in lines])]))


def test_commit_level_keeps_the_mode_and_earlier_runs(tmp_path: Path, env: dict[str, str]) -> None:
    """--mode noisy and --earlier-runs given for the release level hold for the commit level too."""
    (tmp_path / "check.py").write_text(CHECK)
    repo = tmp_path / "upstream"
    shas = make_linear_repo(repo, 11, culprit=7, tags={0: "v2.8.2", 10: "v2.9.0"})
    session = tmp_path / "s"
    done = subprocess.run([*CLI, "run", "--package", "python-dateutil", "--good", "2.8.2", "--bad", "2.9.0",
                           "--repo", str(repo), "--cmd", f"python {tmp_path / 'check.py'}", "--mode", "noisy",
                           "--earlier-runs", "10/10", "0/10", "--session", str(session), "--no-fix", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[7]
    child = json.loads((session / "report.json").read_text())["next_level"]["session"]
    header = json.loads(Path(child, "journal.jsonl").read_text().splitlines()[0])
    assert header["request"]["search"]["mode"] == "noisy"
    assert header["earlier_runs"] == {"bad_end": "10/10", "good_end": "0/10"}


def test_find_fix_over_releases_and_unknown_version(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "check.py").write_text(CHECK.replace(">= (2, 9)", "< (2, 8)"))  # broken before 2.8
    done = subprocess.run([*CLI, "run", "--package", "python-dateutil", "--old", "2.7.3", "--new", "2.8.1",
                           "--find-fix", "--cmd", f"python {tmp_path / 'check.py'}", "--session",
                           str(tmp_path / "s"), "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == "2.8.0"
    assert "First fixed release" in (tmp_path / "s" / "report.md").read_text()
    done = subprocess.run([*CLI, "run", "--package", "python-dateutil", "--good", "2.8.5", "--bad", "2.9.0",
                           "--cmd", "true", "--session", str(tmp_path / "s2")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "unknown version 2.8.5 of python-dateutil; nearest published:" in done.stderr
