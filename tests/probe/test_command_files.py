"""A `--cmd` that names a host file, run in containers: the file comes in read-only at a fixed
path and the argument is rewritten (still an argument list), or the run is refused before
anything runs, with the reason. Until then the script was missing in the container, every run
exited 2 and the user read "good end judged bad"."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.errors import UsageError
from bisect_npu.execute.docker import COMMAND_FILES, Mount, check_command_mounts, command_in_container
from bisect_npu.orchestration.opening.preflight import check_command
from bisect_npu.upstream.history import open_repo
from tests.helpers.gitrepo import make_linear_repo

CLI = [sys.executable, "-m", "bisect_npu"]
CHECK = "import sys\nsys.exit(0 if open('state').read().strip() == 'good' else 1)\n"
DOCKERFILE = "FROM localhost/bisect-npu-demo-base:py311\nWORKDIR /src\nCOPY . /src/\n"


def test_host_files_are_mounted_read_only_and_the_arguments_rewritten(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "check.py", tmp_path / "b" / "check.py"
    first.write_text(CHECK)
    second.write_text(CHECK)
    argv = ["python3", str(first), "--data", str(tmp_path / "b"), str(second), "/usr/bin/env", "/workspace/x.sh",
            "state", f"--out={tmp_path}"]
    command, mounts = command_in_container(argv)
    assert command == ["python3", f"{COMMAND_FILES}/1/check.py", "--data", f"{COMMAND_FILES}/3/b",
                       f"{COMMAND_FILES}/4/check.py", "/usr/bin/env", "/workspace/x.sh", "state", f"--out={tmp_path}"]
    assert mounts == [Mount(source=str(first), target=f"{COMMAND_FILES}/1/check.py", read_only=True),
                      Mount(source=str(tmp_path / "b"), target=f"{COMMAND_FILES}/3/b", read_only=True),
                      Mount(source=str(second), target=f"{COMMAND_FILES}/4/check.py", read_only=True)]


def test_what_a_container_cannot_be_given_is_refused_with_the_reason(tmp_path: Path) -> None:
    script = tmp_path / "check.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(UsageError, match=r"not executable; run it through its interpreter .*or chmod \+x"):
        check_command_mounts([str(script)])
    script.chmod(0o755)
    check_command_mounts([str(script)])  # an executable script is fine: it runs under the image's interpreter
    with pytest.raises(UsageError, match=r"a program of this host .* the candidate.s image does not have"):
        check_command_mounts([sys.executable, str(script)])
    colon = tmp_path / "a:b.py"
    colon.write_text(CHECK)
    with pytest.raises(UsageError, match="has a ':' that a container mount cannot take"):
        check_command_mounts(["python3", str(colon)])
    with pytest.raises(UsageError, match="is a directory; give the program to run"):
        check_command_mounts([str(tmp_path), "x"])


def test_a_relative_host_file_no_end_commits_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo_path = tmp_path / "repo"
    shas = make_linear_repo(repo_path, 3, files=lambda i: {"tests/check.py": CHECK})
    (repo_path / "mine.py").write_text(CHECK)  # beside the clone, never committed
    monkeypatch.chdir(repo_path)
    repo = open_repo(str(repo_path))
    ends = [shas[0], shas[-1]]
    assert check_command(["python3", "mine.py", "tests/check.py", "state"], repo, ends, in_container=True) == \
        ["python3", str(repo_path / "mine.py"), "tests/check.py", "state"]  # committed files stay the candidate's
    assert check_command(["pytest", "-x", "/somewhere/in/the/image"], repo, ends, in_container=True) == \
        ["pytest", "-x", "/somewhere/in/the/image"]  # neither PATH nor files of this host are asked for


@pytest.mark.e2e
def test_a_refused_host_file_stops_run_before_anything_runs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 3, tags={0: "good", 2: "bad"})
    script = tmp_path / "check.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    session = tmp_path / "session"
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--executor", "docker",
                           "--cmd", str(script), "--session", str(session)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert done.returncode == 2, done.stderr
    assert f"--cmd runs {script}, which is not executable" in done.stderr
    assert not session.exists()


@pytest.fixture(scope="module")
def host_cmd_repo(docker_client, demo_base_image, tmp_path_factory: pytest.TempPathFactory):
    """A repository whose Dockerfile copies it into the image; its images (named after it:
    bisect-npu/host-cmd-files) are built once for both tests and removed at the end."""
    import docker.errors

    repo = tmp_path_factory.mktemp("cmd-files") / "host-cmd-files"
    shas = make_linear_repo(repo, 9, culprit=5, tags={0: "good", 8: "bad"},
                            files=lambda i: {"Dockerfile": DOCKERFILE} if i == 0 else {})
    yield repo, shas
    for image in docker_client.images.list(name="bisect-npu/host-cmd-files"):
        with contextlib.suppress(docker.errors.APIError):  # gone already
            docker_client.images.remove(image.id, force=True)


@pytest.mark.container
@pytest.mark.parametrize("where", ["absolute", pytest.param("relative", marks=pytest.mark.heavy)])
def test_a_host_script_judges_every_container(host_cmd_repo, tmp_path: Path, where: str) -> None:
    """`--executor docker --cmd "python3 /abs/check.py"` (or `check.py` beside the clone, run from
    there): the same culprit as `--executor local`, the host's script seen by every container."""
    repo, shas = host_cmd_repo
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    session = tmp_path / "session"
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--executor", "docker",
                           "--cmd", f"python3 {script if where == 'absolute' else 'check.py'}", "--no-fix",
                           "--session", str(session), "--json", "--quiet"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["culprit"] == shas[5]
    header = json.loads((session / "journal.jsonl").read_text().splitlines()[0])
    assert header["request"]["judge"]["command"] == ["python3", str(script)]  # resume mounts the same file
    logs = list(session.rglob("*.log"))
    assert any(f"# host {script} at {COMMAND_FILES}/1/check.py (read-only)" in log.read_text() for log in logs)
