"""`bisect-npu doctor`: one line per check, a fix for each missing piece, exit 0 or 5."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from bisect_npu.api.host_checks import check_disk, check_driver_version, check_npu_devices, check_npu_smi
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.paths import REPO_ROOT


def doctor(*args: str, docker_host: str | None = None) -> subprocess.CompletedProcess[str]:
    """`bisect-npu doctor` in this process: what it prints and its exit code."""
    with pytest.MonkeyPatch.context() as patch:
        # A cache of its own: the host's `run --unit-test` venvs would be listed too.
        patch.setenv("BISECT_NPU_CACHE", tempfile.mkdtemp(prefix="doctor-cache-"))
        if docker_host is not None:
            patch.setenv("DOCKER_HOST", docker_host)
        return cli_in_process(["doctor", *args], cwd=REPO_ROOT)


def test_local_executor_needs_only_git():
    done = doctor("--executor", "local", docker_host="unix:///nonexistent/engine.sock")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("OK")
    assert "ready for --executor local" in done.stdout


def test_doctor_checks_what_run_s_default_executor_needs_and_nothing_else():
    """`run` defaults to local: a plain `doctor` must not ask for Docker or NPUs it will not use."""
    done = doctor(docker_host="unix:///nonexistent/engine.sock")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0].split()[-1] for line in done.stdout.splitlines()[:-1]] == ["git"]
    assert "container engine" not in done.stdout and "NPU" not in done.stdout and "disk" not in done.stdout
    assert done.stdout.splitlines()[-1] == "ready for --executor local"
    if Path("/dev/davinci_manager").exists():
        pytest.skip("this host has NPUs")
    npus = doctor("--npu", docker_host="unix:///nonexistent/engine.sock")  # run --executor local --devices
    assert npus.returncode == 5 and "MISSING               NPU devices: no /dev/davinciN" in npus.stdout
    assert "container engine" not in npus.stdout and "driver mounts" not in npus.stdout


def test_unreachable_engine_is_missing_with_a_fix_and_exit_5():
    done = doctor("--executor", "docker", "--no-npu", docker_host="unix:///nonexistent/engine.sock")
    assert done.returncode == 5
    assert "MISSING               container engine: not reachable at unix:///nonexistent/engine.sock" in done.stdout
    assert "fix: start Docker, or run containers/setup-podman.sh" in done.stdout
    assert "not ready for --executor docker: container engine" in done.stdout


def test_npus_are_required_for_docker_unless_no_npu():
    done = doctor("--executor", "docker", docker_host="unix:///nonexistent/engine.sock")
    if Path("/dev/davinci_manager").exists():
        pytest.skip("this host has NPUs")
    assert done.returncode == 5
    assert "MISSING               NPU devices: no /dev/davinciN" in done.stdout
    assert "fix: install the Ascend driver (HDK)" in done.stdout


@pytest.mark.container
def test_reachable_engine_reports_its_version(docker_client):
    done = doctor("--executor", "docker", "--no-npu")
    assert "OK                    container engine: " in done.stdout
    version = docker_client.version()["Version"]
    assert version in done.stdout


def test_npu_device_files(tmp_path):
    assert not check_npu_devices(tmp_path).ok
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("davinci0", "davinci1", "davinci_manager", "devmm_svm"):
        (dev / name).touch()
    missing = check_npu_devices(tmp_path)
    assert not missing.ok and "/dev/hisi_hdc" in missing.detail
    (dev / "hisi_hdc").touch()
    present = check_npu_devices(tmp_path)
    assert present.ok and present.detail == "2 card(s): davinci0, davinci1"


def test_driver_version_and_npu_smi(tmp_path):
    info = tmp_path / "version.info"
    assert not check_driver_version(info).ok
    info.write_text("Version=24.1.rc2\nascendhal_version=7.35.23\n")
    assert check_driver_version(info).detail == "version 24.1.rc2"
    smi = tmp_path / "npu-smi"
    assert not check_npu_smi(str(smi)).ok
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    assert check_npu_smi(str(smi)).ok


def test_disk_below_the_minimum_is_missing(tmp_path):
    assert check_disk(tmp_path, minimum=1).ok
    low = check_disk(tmp_path / "not" / "yet", minimum=1 << 60)
    assert not low.ok and "free at least" in low.fix and str(tmp_path) in low.detail


def test_ray_nodes_bisect_npu_versions_are_listed_and_another_one_is_missing_with_the_runs_next_step():
    from bisect_npu.api.host_checks import version_checks
    from bisect_npu.errors import InfrastructureError
    from bisect_npu.execute.ray import check_versions

    odd, same, silent = "a1" * 20, "b2" * 20, "c3" * 20
    versions = {same: "0.2.0", odd: "0.1.3", silent: "unknown (the node did not answer: GetTimeoutError)"}
    rows = {row.name: row for row in version_checks(versions, driver="0.2.0")}
    assert list(rows) == [f"node {n[:12]} bisect-npu" for n in (odd, same, silent)]
    assert rows[f"node {same[:12]} bisect-npu"].ok and rows[f"node {same[:12]} bisect-npu"].detail == "0.2.0"
    mismatch = rows[f"node {odd[:12]} bisect-npu"]
    assert not mismatch.ok and mismatch.needed
    assert mismatch.detail == "0.1.3, this driver 0.2.0: a node with another version can run a probe differently"
    with pytest.raises(InfrastructureError) as refused:  # the run's exit-5 refusal gives the same next step
        check_versions(versions, {}, driver="0.2.0")
    assert f"{mismatch.detail.split(', ', 1)[1]}; {mismatch.fix}, then run again" in str(refused.value)
    assert "pip install 'bisect-npu[ray]==0.2.0'" in mismatch.fix
    assert not rows[f"node {silent[:12]} bisect-npu"].ok and not rows[f"node {silent[:12]} bisect-npu"].needed
