"""A pinned environment resolves the same packages on any later day: its lock.

The first time an environment key is built, what pip resolved into it (`pip freeze` of the venv's
own site-packages) is written beside the cache as `locks/<key>.txt`; every later build of that key,
on this machine or another that is handed the locks directory, installs under that lock: a
unit-test pin venv exactly as frozen (`exact_install_args`), a release venv as pip constraints.
A dependency the key's requirements leave unpinned (`kernels`, which transformers imports
when it is there) then stays at the version the environment was tested with instead of today's release.

A host with no lock of a key yet (a fresh machine, an empty cache) starts from the lock this
package ships for it, when it ships one (`SHIPPED`: the keys of the pairs the unit-test tier
bisects, each as tested there): today's releases can be broken under a key's old pins, so a
first build must not be the one that decides.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

LOCKS_DIR = "locks"
SHIPPED = Path(__file__).resolve().parent / "pin_locks"  # `<key>.txt`, reviewed and committed
_FREEZE_TIMEOUT_S = 300.0


def lock_path(cache_dir: Path, key: str) -> Path:
    """Where the lock of environment `key` lives (beside the cache's venvs, outliving them)."""
    return cache_dir / LOCKS_DIR / f"{key}.txt"


def shipped_lock(key: str) -> Path | None:
    """The lock this package ships for environment `key`, if it ships one."""
    path = SHIPPED / f"{key}.txt"
    return path if path.is_file() else None


def seed_lock(lock: Path, shipped: Path | None) -> bool:
    """Start a key with no lock on this host from the shipped one (the host's own, once there,
    stays: it is what this host tested). True when copied."""
    if shipped is None or lock.is_file():
        return False
    lock.parent.mkdir(parents=True, exist_ok=True)
    partial = lock.with_suffix(".partial")
    shutil.copyfile(shipped, partial)
    partial.replace(lock)
    return True


def exact_install_args(lock: Path) -> list[str]:
    """pip's words that install the lock as it was frozen, nothing resolved again. A venv built in
    steps (vLLM with its requirements, then vllm-ascend's, which win where the two disagree) can
    hold a set no resolver accepts at once (starlette 0.50.0 beside a
    prometheus-fastapi-instrumentator that asks for 1.0): as constraints such a lock fails to
    resolve, so it is installed as it stands."""
    return ["--no-deps", "--requirement", str(lock)]


def constraint_args(lock: Path) -> list[str]:
    """pip's words that hold an install to the lock (none before the key's first build)."""
    return ["--constraint", str(lock)] if lock.is_file() else []


def record_lock(pip: Sequence[str], sites: Sequence[Path], lock: Path, leave_out: Sequence[str] = ()) -> bool:
    """Write the lock of a venv just built, unless the key has one. `pip`: the words that run pip
    for the venv (`[python, -m, pip]`, or the host's with `--python`); `sites`: the venv's own
    site-packages (a layer beneath it is locked on its own); `leave_out`: packages installed from
    a local file (a wheel built here), which a constraint cannot name. True when written."""
    if lock.is_file():
        return False
    argv = [*pip, "freeze", "--all", *(f"--path={site}" for site in sites),
            *(f"--exclude={name}" for name in leave_out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_FREEZE_TIMEOUT_S, check=True)
    pins = sorted(line for line in done.stdout.splitlines() if "==" in line and " @ " not in line)
    lock.parent.mkdir(parents=True, exist_ok=True)
    partial = lock.with_suffix(".partial")
    partial.write_text(f"# bisect-npu: what {lock.stem} resolved to on {time.strftime('%Y-%m-%d')}\n"
                       + "".join(f"{pin}\n" for pin in pins), encoding="utf-8")
    partial.replace(lock)
    return True


def locked_versions(lock: Path) -> dict[str, str]:
    """The lock as name -> version (empty when the key has none)."""
    if not lock.is_file():
        return {}
    pins = (line.split("==", 1) for line in lock.read_text(encoding="utf-8").splitlines()
            if "==" in line and not line.startswith("#"))
    return {name.strip().lower(): version.strip() for name, version in pins}
