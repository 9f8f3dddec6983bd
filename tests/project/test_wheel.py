"""The wheel as a user gets it: built from this checkout, installed into a fresh venv outside it
(with its dependencies, nothing borrowed from this venv), and run from a directory outside it.

What the package reads at run time (recipes, the overlay helper, the demo upstream, report
templates) must travel inside the wheel; run from the checkout, a missing file would go unseen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from bisect_npu import __version__
from bisect_npu.recipe.loader import bundled_recipes
from tests.helpers.paths import REPO_ROOT

# A wheel built, a venv made and the package installed with its dependencies: minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.heavy]


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    python: Path
    scripts: Path
    env: dict[str, str]
    cwd: Path  # outside the checkout: nothing resolves against it by accident


def _git_files(*args: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [name for name in out.split("\0") if name]


def _copy_source(target: Path) -> None:
    """The files a clean clone has (tracked, plus new files git would track), links kept as links:
    the build then writes build/ and *.egg-info there, not into the checkout."""
    for name in _git_files("--cached", "--others", "--exclude-standard"):
        source = REPO_ROOT / name
        if not source.is_symlink() and not source.exists():  # deleted in the working tree, not yet staged
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name, follow_symlinks=False)


def _run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel (no build isolation: setuptools from this venv, no index needed), make a fresh
    venv and pip-install `<wheel>[demo]` into it; pip takes the dependencies from its cache/index."""
    root = tmp_path_factory.mktemp("wheel")
    source, dist, venv_dir, cwd = root / "source", root / "dist", root / "venv", root / "elsewhere"
    for folder in (source, cwd):
        folder.mkdir()
    _copy_source(source)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, "."], cwd=source)
    (wheel,) = dist.glob("bisect_npu-*.whl")
    venv.EnvBuilder(with_pip=True).create(venv_dir)
    python = venv_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env |= {"BISECT_NPU_CACHE": str(root / "cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run([python, "-m", "pip", "install", "-q", f"{wheel}[demo]"], cwd=cwd, env=env, timeout=1200)
    return Installed(wheel=wheel, venv=venv_dir, python=python, scripts=venv_dir / "bin", env=env, cwd=cwd)


def test_the_wheel_holds_every_tracked_package_file(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert sorted(set(_git_files("--cached", "--others", "--exclude-standard", "bisect_npu")) - names) == []


def test_the_wheel_and_its_metadata_carry_the_package_version(installed: Installed) -> None:
    assert installed.wheel.name.startswith(f"bisect_npu-{__version__}-")
    done = _run([installed.scripts / "bisect-npu", "--version"], installed.cwd, installed.env)
    assert done.stdout.strip() == f"bisect-npu, version {__version__}"


def test_the_installed_package_is_the_venvs_own(installed: Installed) -> None:
    done = _run([installed.python, "-c", "import bisect_npu; print(bisect_npu.__file__)"], installed.cwd,
                installed.env)
    assert Path(done.stdout.strip()).is_relative_to(installed.venv)


def test_recipes_list_shows_every_bundled_recipe(installed: Installed) -> None:
    done = _run([installed.scripts / "bisect-npu", "recipes", "list"], installed.cwd, installed.env)
    listed = {line.split()[0] for line in done.stdout.splitlines()[1:]}
    assert listed == set(bundled_recipes())
    assert "INVALID" not in done.stdout


@pytest.mark.parametrize("name", sorted(bundled_recipes()))
def test_recipes_show_each_bundled_recipe(installed: Installed, name: str) -> None:
    done = _run([installed.scripts / "bisect-npu", "recipes", "show", name], installed.cwd, installed.env)
    assert done.stdout.startswith(f"recipe   {name}  ({installed.venv}/")  # read from the installed wheel


def test_demo_bisects_to_the_manifest_culprit(installed: Installed) -> None:
    done = _run([installed.scripts / "bisect-npu", "demo", "--quiet"], installed.cwd, installed.env, timeout=1200)
    assert "-> MATCH" in done.stdout


def test_the_overlay_helper_reads_as_the_docker_builder_reads_it(installed: Installed) -> None:
    script = ("import sys; from bisect_npu.builders.docker import overlay_helper; "
              "sys.stdout.buffer.write(overlay_helper())")
    done = subprocess.run([installed.python, "-c", script], cwd=installed.cwd, env=installed.env, capture_output=True,
                          timeout=120, check=True)
    assert done.stdout == (REPO_ROOT / "bisect_npu" / "builders" / "overlay_apply.py").read_bytes()
