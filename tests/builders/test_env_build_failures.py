"""A pinned environment that cannot be built on its own packages is the environment's failure
(exit 5 naming the key, pip's cause line and the lock), never a skip that turns an end "wrong";
a commit whose own requirements do not install stays a skip. Real venvs, real pip against a local
wheel directory (no network)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bisect_npu.builders import pin_venv
from bisect_npu.builders.base import BuildFailed
from bisect_npu.builders.locks import lock_path, shipped_lock
from bisect_npu.builders.venv import COMPLETE_MARKER, VenvBuilder
from bisect_npu.errors import InfrastructureError
from bisect_npu.recipe.schema import InstallPlan
from tests.builders.test_venv_locks import make_wheel
from tests.orchestration.test_unit_test_oracle import pinned_history

KEY = pin_venv.PinKey("0.23.0", "transformers==5.5.4")  # what pinned_history's commits pin
ABSENT = "bisect-npu-absent-package==9.9.9"


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip's only index: a wheel directory of this test."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def torch_layer_built(cache: Path) -> None:
    """The shared torch layer marked built (empty): the venv under test does not read it, and the
    real one is 4.4 GB."""
    (cache / pin_venv.TORCH_LAYER).mkdir(parents=True)
    (cache / pin_venv.TORCH_LAYER / COMPLETE_MARKER).write_text("done\n")


@pytest.mark.e2e
def test_an_end_whose_pin_venv_cannot_be_built_under_its_lock_stops_with_exit_5_naming_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        local_index: Path) -> None:
    from bisect_npu.cli import main

    shas = pinned_history(tmp_path / "up", 5, 3)
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    cache = pin_venv.default_pin_venv_cache()
    torch_layer_built(cache)
    lock = lock_path(cache, KEY.name)
    lock.parent.mkdir(parents=True)
    lock.write_text(f"{ABSENT}\n")
    with pytest.raises(SystemExit) as exited:
        main(["run", "--repo", str(tmp_path / "up"), "--good", shas[0], "--bad", shas[-1], "--unit-test",
              "tests/ut/quant/test_q.py::test_scale", "--session", str(tmp_path / "session"), "--no-fix",
              "--quiet"])
    err = capsys.readouterr().err
    assert exited.value.code == 5, err
    assert "the unit-test venv of vLLM 0.23.0 with transformers==5.5.4 cannot be built" in err
    assert f"installing the lock {lock} failed" in err and ABSENT in err  # pip's cause line
    assert f"it installs the lock {lock}: correct the line pip names there, or delete the file" in err
    assert "could not be tested" not in err


@pytest.mark.e2e
def test_a_pin_venv_fails_on_the_commit_s_own_requirements_as_a_skip_and_on_the_key_s_as_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_index: Path) -> None:
    """vLLM's build requirements are one local wheel here (the real set needs the index), the vLLM
    wheel of the pin a tiny one already in the cache: what varies is the requirement that fails."""
    key = pin_venv.PinKey("0.23.0", "")  # a key this package ships no lock of: its first build resolves
    assert shipped_lock(key.name) is None
    make_wheel(local_index, "buildreq", "1.0")
    monkeypatch.setattr(pin_venv, "SDIST_BUILD", ("buildreq",))
    cache = tmp_path / "venvs"
    torch_layer_built(cache)
    (cache / "wheels").mkdir()
    make_wheel(cache / "wheels", "vllm", "0.23.0")
    venvs = pin_venv.PinVenvs(cache, python=sys.executable)
    with pytest.raises(BuildFailed) as skipped:
        venvs.acquire(key, [ABSENT], tmp_path / "logs")
    assert not isinstance(skipped.value, InfrastructureError)
    assert str(skipped.value).startswith("the commit's requirements files do not install beside vLLM 0.23.0: ")
    assert ABSENT in str(skipped.value)
    assert not lock_path(cache, key.name).exists()  # nothing was decided for the key

    monkeypatch.setattr(pin_venv, "SDIST_BUILD", ("buildreq==2.0",))  # the key's own step: not the commit's
    with pytest.raises(pin_venv.PinVenvUnbuildable) as stopped:
        venvs.acquire(key, ["buildreq"], tmp_path / "logs")
    message = str(stopped.value)
    assert "installing vLLM's build requirements failed: exit 1, " in message and "buildreq==2.0" in message
    assert "the unit-test venv of vLLM 0.23.0 with transformers unpinned cannot be built" in message
    assert f"the key has no lock yet ({lock_path(cache, key.name)} is written by its first build)" in message
    assert stopped.value.exit_code == 5 and "\n" not in message


@pytest.mark.e2e
def test_a_release_venv_fails_as_the_version_s_skip_first_and_under_its_lock_as_the_environment(
        tmp_path: Path, local_index: Path) -> None:
    builder = VenvBuilder("app", InstallPlan(), tmp_path / "venvs", max_bytes=10**10)
    with pytest.raises(BuildFailed) as skipped:
        builder.acquire("1.0", tmp_path / "logs")  # no app 1.0 anywhere: the version's own failure
    assert "app==1.0" in str(skipped.value)
    make_wheel(local_index, "app", "1.0")
    lock = lock_path(builder.cache_dir, builder.venv_dir("1.0").name)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("app==1.0\nhelper==3.0\n")  # a lock the index no longer satisfies
    make_wheel(local_index, "helper", "2.0")
    (local_index / "app-1.0-py3-none-any.whl").unlink()
    make_wheel(local_index, "app", "1.0", requires=("helper",))
    with pytest.raises(InfrastructureError) as stopped:
        builder.acquire("1.0", tmp_path / "logs")
    message = str(stopped.value)
    assert f"the venv of app==1.0 cannot be built under its lock {lock}" in message
    assert "helper" in message and "delete the file" in message
