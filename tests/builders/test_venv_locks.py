"""A pinned environment built again from an empty cache on a later day installs what its key
resolved to the first time: real venvs, real pip, a local wheel directory (no network) where a
dependency the requirements leave unpinned gets a newer release between the two builds."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bisect_npu.builders.locks import (
    SHIPPED,
    constraint_args,
    exact_install_args,
    lock_path,
    locked_versions,
    record_lock,
    seed_lock,
    shipped_lock,
)
from bisect_npu.builders.venv import site_packages
from tests.helpers.paths import DATA


def digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def make_wheel(wheels: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure-Python wheel as a build backend writes it: the module, METADATA, WHEEL and RECORD."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={digest(text)},{len(text.encode())}\n" for path, text in files.items())
    record += f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheels / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in {**files, f"{info}/RECORD": record}.items():
            wheel.writestr(path, text)


def build(fresh_venv: Callable[[Path], Path], venv: Path, wheels: Path, lock: Path) -> dict[str, str]:
    """The key's build: a fresh venv, `app` installed from the wheel directory under the key's lock,
    the lock recorded the first time; what the venv holds, name -> version."""
    fresh_venv(venv)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheels),
                    *constraint_args(lock), "app"], check=True, timeout=300)
    record_lock([str(python), "-m", "pip"], site_packages(venv), lock)
    frozen = subprocess.run([str(python), "-m", "pip", "freeze", f"--path={site_packages(venv)[0]}"],
                            capture_output=True, text=True, check=True).stdout
    return dict(line.split("==", 1) for line in frozen.splitlines() if "==" in line)


@pytest.mark.e2e
def test_a_key_built_again_from_an_empty_cache_installs_what_it_resolved_first(
        tmp_path: Path, fresh_venv: Callable[[Path], Path]) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "tinydep", "0.18.0")
    make_wheel(wheels, "app", "5.5.4", requires=("tinydep",))  # unpinned, as transformers leaves kernels
    lock = lock_path(tmp_path / "cache", "vllm-0.20.2--transformers-5.5.4")
    assert build(fresh_venv, tmp_path / "cache" / "first", wheels, lock) == {"app": "5.5.4", "tinydep": "0.18.0"}
    first = locked_versions(lock)
    assert (first["app"], first["tinydep"]) == ("5.5.4", "0.18.0")

    make_wheel(wheels, "tinydep", "0.19.1")  # a later day: the dependency moved on
    assert build(fresh_venv, tmp_path / "fresh" / "venv", wheels, lock)["tinydep"] == "0.18.0"  # the lock holds it
    unlocked = build(fresh_venv, tmp_path / "fresh" / "unlocked", wheels, tmp_path / "elsewhere" / "none.txt")
    assert unlocked["tinydep"] == "0.19.1"  # what the same install resolves to today without it
    assert locked_versions(lock) == first  # written once, never moved on


def test_a_host_without_a_lock_of_the_key_starts_from_the_shipped_one_and_keeps_its_own(tmp_path: Path) -> None:
    shipped = tmp_path / "shipped" / "vllm-0.20.2--transformers-5.5.4.txt"
    shipped.parent.mkdir()
    shipped.write_text("# as tested\nkernels==0.12.3\ntransformers==5.5.4\n")
    lock = lock_path(tmp_path / "cache", "vllm-0.20.2--transformers-5.5.4")
    assert seed_lock(lock, shipped)
    assert locked_versions(lock) == {"kernels": "0.12.3", "transformers": "5.5.4"}
    assert constraint_args(lock) == ["--constraint", str(lock)]
    lock.write_text("kernels==0.12.1\ntransformers==5.5.4\n")  # what this host built and tested
    assert not seed_lock(lock, shipped)
    assert locked_versions(lock)["kernels"] == "0.12.1"
    other = lock_path(tmp_path / "cache", "vllm-9.9.9--transformers-any")
    assert not seed_lock(other, shipped_lock("vllm-9.9.9--transformers-any")) and not other.exists()


def test_every_key_the_unit_test_tier_bisects_ships_its_lock_of_exact_pins() -> None:
    """A fresh host builds the tier's venvs as they were tested (the pairs' pins, their
    transformers as the key names it), never vLLM itself (a wheel built here) nor the torch layer's."""
    pairs = json.loads((DATA / "vllm_ascend_ut_pairs.json").read_text())
    keys = {str(pair["pin"]) for pair in pairs}
    assert keys and {path.stem for path in SHIPPED.glob("*.txt")} >= keys
    for key in sorted(keys):
        lock = shipped_lock(key)
        assert lock is not None
        lines = [line for line in lock.read_text().splitlines() if line and not line.startswith("#")]
        assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[^\s=;@]+", line) for line in lines), key
        versions = locked_versions(lock)
        assert len(versions) == len(lines) > 50, key
        assert versions["transformers"] == key.split("--transformers-")[1], key
        assert not {"vllm", "torch", "torchvision", "triton"} & set(versions), key


def frozen(venv: Path) -> dict[str, str]:
    python = venv / "bin" / "python"
    lines = subprocess.run([str(python), "-m", "pip", "freeze", f"--path={site_packages(venv)[0]}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line)


@pytest.mark.e2e
def test_a_venv_built_in_two_steps_is_built_again_from_its_lock_though_no_resolver_accepts_it(
        tmp_path: Path, fresh_venv: Callable[[Path], Path]) -> None:
    """As a pin venv is built: the server's requirements first (its instrumentator wants web>=1),
    then the project's, which win (a framework that needs web<0.51 downgrades it). The lock of that
    venv, as constraints, cannot be resolved; installed as frozen it gives the same venv again."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, version, requires in (("web", "0.50.0", ()), ("web", "1.0.0", ()),
                                    ("instrumentator", "8.1.0", ("web>=1.0",)),
                                    ("framework", "0.123.10", ("web<0.51",))):
        make_wheel(wheels, name, version, requires)
    index = ["--no-index", "--find-links", str(wheels)]
    venv, lock = tmp_path / "first", tmp_path / "locks" / "key.txt"
    fresh_venv(venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    for step in ("instrumentator", "framework==0.123.10"):
        subprocess.run([*pip, "install", "--quiet", *index, step], check=True, timeout=300, capture_output=True)
    record_lock(pip, site_packages(venv), lock)
    tested = {"web": "0.50.0", "instrumentator": "8.1.0", "framework": "0.123.10"}
    assert {name: locked_versions(lock).get(name) for name in tested} == tested  # pip's own are in it too

    again = tmp_path / "again"
    fresh_venv(again)
    pip = [str(again / "bin" / "python"), "-m", "pip", "install", "--quiet", *index]
    resolved = subprocess.run([*pip, *constraint_args(lock), "instrumentator"], capture_output=True, text=True,
                              timeout=300, check=False)
    assert resolved.returncode != 0 and "ResolutionImpossible" in resolved.stderr
    subprocess.run([*pip, *exact_install_args(lock)], check=True, timeout=300)
    assert frozen(again) == tested
