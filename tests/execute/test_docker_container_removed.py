"""A single-host session (`--executor docker`) whose candidate's container another process removes
mid-run (`podman rm -f`, as another session's sweep or prune does): the run stops as the host's
failure (exit 5) with no verdict on that commit, and `resume` then judges it for real."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.builders.base import LABEL_COMMIT
from bisect_npu.demo.manifest import Manifest
from bisect_npu.execute.docker import SESSION_LABEL
from bisect_npu.journal import session_label

pytestmark = [pytest.mark.container, pytest.mark.e2e, pytest.mark.heavy]  # two sessions of the demo in containers

CLI = [sys.executable, "-m", "bisect_npu"]
CASE = "rope-longseq"


def test_a_container_removed_mid_run_stops_the_session_without_a_verdict(
        demo_upstream: tuple[Path, Manifest], docker_client: Any, demo_base_image: str, tmp_path: Path) -> None:
    repo, manifest = demo_upstream
    truth = manifest.case(CASE)
    culprit = truth.culprit.sha
    parent = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{culprit}^"], capture_output=True, text=True,
                            check=True).stdout.strip()
    session = tmp_path / "session"
    label = f"{SESSION_LABEL}={session_label(session)}"
    argv = [*CLI, "run", "--repo", str(repo), "--good", parent, "--bad", culprit, "--recipe", truth.recipe,
            "--session", str(session), "--executor", "docker", "--no-fix", "--json"]
    with subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 480
        while not (running := docker_client.containers.list(filters={"label": [label, f"{LABEL_COMMIT}={culprit}"]})):
            assert proc.poll() is None and time.monotonic() < deadline, "the bad end's container never started"
            time.sleep(0.1)
        running[0].remove(force=True)
        stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 5, stdout + stderr[-3000:]
    assert "went away during the run" in stderr and "Traceback" not in stderr
    entries = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    assert not [e for e in entries if e["type"] in ("step", "trial") and e["commit"] == culprit]

    done = subprocess.run([*CLI, "resume", "--session", str(session), "--json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == culprit
    assert docker_client.containers.list(all=True, filters={"label": label}) == []
