"""`run --devices` with the docker executor checks the NPU containers' host files before anything
is cloned or built; `doctor` checks the same list."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.api.host_checks import check_driver_mounts
from bisect_npu.errors import InfrastructureError
from bisect_npu.execute.ascend import DRIVER_MOUNTS, MANAGEMENT_DEVICES, ascend_container_spec, device_files
from bisect_npu.execute.host_devices import check_host_devices, host_cards
from bisect_npu.orchestration.opening.preflight import check_run
from tests.helpers.asked import spec_of
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo


def fake_host(root: Path, cards: list[int]) -> None:
    """The device files and driver paths of an Ascend host, as empty files and directories."""
    for path in device_files(cards):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).touch()
    for path in DRIVER_MOUNTS:
        target = root / path.lstrip("/")
        if path.endswith("/") or path == "/usr/local/dcmi":
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()


def test_the_check_covers_what_the_container_spec_mounts(tmp_path):
    spec = ascend_container_spec("img", tmp_path, devices=[0, 3])
    assert device_files([0, 3]) == spec.devices
    assert {m.source for m in spec.mounts} >= set(DRIVER_MOUNTS)


def test_fake_device_files_pass_and_each_missing_one_is_named(tmp_path):
    fake_host(tmp_path, [0, 1])
    check_host_devices([0, 1], tmp_path)
    with pytest.raises(InfrastructureError, match=r"lacks /dev/davinci2, .*`bisect-npu doctor --executor docker`"):
        check_host_devices([0, 1, 2], tmp_path)
    (tmp_path / "dev" / "hisi_hdc").unlink()
    (tmp_path / "etc" / "ascend_install.info").unlink()
    with pytest.raises(InfrastructureError) as raised:
        check_host_devices([0, 1], tmp_path)
    assert "lacks /dev/hisi_hdc, /etc/ascend_install.info," in str(raised.value)
    assert raised.value.exit_code == 5


def test_host_cards_are_the_numbered_device_files_in_order(tmp_path):
    assert host_cards(tmp_path) == []
    fake_host(tmp_path, [10, 2, 0])
    (tmp_path / "dev" / "davinci3x").touch()  # not a card: the name must be davinci and a number
    assert host_cards(tmp_path) == [0, 2, 10]


def test_doctor_checks_the_same_driver_paths(tmp_path):
    assert check_driver_mounts(tmp_path).detail == f"missing {', '.join(DRIVER_MOUNTS)}"
    fake_host(tmp_path, [0])
    assert check_driver_mounts(tmp_path).ok


def test_check_run_looks_under_the_host_root_it_is_given(tmp_path):
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 4, culprit=2)
    options = spec_of(good=shas[0], bad=shas[3], repo=str(repo), command=list(GOOD_CMD), executor="docker",
                         devices=[0, 1])
    with pytest.raises(InfrastructureError, match="lacks /dev/davinci0"):
        check_run(options, host_root=tmp_path / "empty")
    fake_host(tmp_path / "host", [0, 1])
    assert check_run(options, host_root=tmp_path / "host").candidates_range.bad == shas[3]


def test_local_devices_on_a_host_without_them_are_warned_about(tmp_path):
    """The local executor's runs get ASCEND_RT_VISIBLE_DEVICES: cards the host lacks are said before
    anything runs (a --cmd may use the numbers its own way, so it is a warning, not the containers'
    refusal); a host that has them hears nothing."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 4, culprit=2)
    options = spec_of(good=shas[0], bad=shas[3], repo=str(repo), command=list(GOOD_CMD), executor="local",
                      devices=[0, 1])
    (said,) = check_run(options, host_root=tmp_path / "empty").owed
    assert said.startswith("--devices 0,1: this host lacks /dev/davinci0, /dev/davinci1, ") and "doctor" in said
    fake_host(tmp_path / "host", [0, 1])
    assert check_run(options, host_root=tmp_path / "host").owed == ()


@pytest.mark.e2e
@pytest.mark.skipif(Path("/dev/davinci0").exists(), reason="this host has NPUs")
def test_run_on_a_host_without_npus_stops_before_any_clone_or_build(tmp_path):
    # The URL is never fetched: the device check comes first (this machine has no network either).
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo",
                           "https://github.com/vllm-project/vllm-ascend", "--good", "v0.9.0rc2", "--bad", "v0.9.1",
                           "--recipe", "qwen3-repetition-penalty-async", "--executor", "docker", "--devices", "0-1",
                           "--session", str(tmp_path / "s")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 5, done.stderr
    assert "lacks /dev/davinci0, /dev/davinci1, " in done.stderr
    assert "`bisect-npu doctor --executor docker`" in done.stderr
    assert "clon" not in done.stderr.lower() and not (tmp_path / "s").exists()
    assert set(MANAGEMENT_DEVICES) <= set(device_files([0]))


@pytest.mark.e2e
@pytest.mark.skipif(Path("/dev/davinci0").exists(), reason="this host has NPUs")
def test_fix_verify_on_npus_checks_the_host_too(tmp_path):
    shas = make_linear_repo(tmp_path / "repo", 4, culprit=2)
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "fix", "--repo", str(tmp_path / "repo"), "--culprit",
                           shas[2], "--bad", shas[3], "--verify", "--cmd", " ".join(GOOD_CMD), "--executor", "docker",
                           "--devices", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "--devices 0: this host lacks /dev/davinci0, " in done.stderr
