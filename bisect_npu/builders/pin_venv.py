"""One cached venv per vLLM pin for vllm-ascend's CPU unit tests (`run --unit-test`).

vllm-ascend is never installed (its setup.py builds C++ ops): its checkout goes on PYTHONPATH.
What its unit tests import around it is the same for every commit that pins the same vLLM and
the same transformers, so that pair is the venv's key: vLLM as a pure-Python wheel built once with
`VLLM_TARGET_DEVICE=empty` (from its PyPI source distribution for a release, from a local vLLM
clone for a commit no release names), and the commit's own `requirements.txt` +
`requirements-dev.txt` without what needs an NPU, a CUDA build or is only for linting. torch and
torchvision are one layer shared by every pin venv (a venv of their own, seen through a `.pth`):
the only torch 2.14.1 the index has is the CUDA build, most of a venv's size. A venv is built in
place under a lock and marked complete last (as builders/venv.py does): a killed build goes on
where it stopped.

A venv that cannot be built is told apart by the step that failed. Every step but one installs
what the key names (the lock, vLLM's build requirements, the vLLM wheel of the pin, the shared
torch layer): its failure (pip's ResolutionImpossible over a lock, a version the index lacks, a
wheel that will not build for the pin) is the environment's, the same for every commit of the
key, so it is `PinVenvUnbuildable` (exit 5) naming the key, pip's cause line, the lock and what to
do. The one step that installs the commit's own requirements files (a first build of the key,
without a lock) fails on the commit's lines: a `BuildFailed`, the commit's skip. A step that could
not reach the index is `BuildUnreachable` before either (builders/failures.py: retried).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from bisect_npu.builders.base import BuildFailed, tail
from bisect_npu.builders.dated import (
    MADE_AFRESH,
    MADE_BY_LOCK,
    MADE_DATED,
    PIP_WITH_CUTOFF,
    cutoff_args,
    cutoff_text,
    dated_indexes,
)
from bisect_npu.builders.failures import RESUME, pip_cause, raise_if_unreachable
from bisect_npu.builders.locks import (
    LOCKS_DIR,
    constraint_args,
    exact_install_args,
    lock_path,
    record_lock,
    seed_lock,
    shipped_lock,
)
from bisect_npu.builders.venv import COMPLETE_MARKER, link_host, site_packages, tree_bytes
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.paths import cache_root

# The conftests import torchvision (through vLLM and transformers). The index's torch 2.14.1 is its
# CUDA build; the one CPU torch there (2.13.0+cpu) has no torchvision that loads on it (0.28.0's
# `_C` links libtorch_cuda).
TORCH = ("torch==2.14.1", "torchvision==0.29.1")
TORCH_LAYER = "torch-2.14.1--torchvision-0.29.1"  # the cache's directory of the shared layer
LAYER_PTH = "bisect_npu_torch_layer.pth"
# What vLLM's sdist needs to build without isolation (torch is there already).
SDIST_BUILD = ("setuptools>=77,<81", "setuptools-scm>=8", "setuptools-rust>=1.9", "wheel", "packaging>=24.2", "jinja2",
               "regex")
# Requirements of vllm-ascend no CPU unit test needs, or that cannot be installed here: the NPU
# stack, CUDA-built extras (arctic-inference's isolated build pulls a CUDA torch), lint tools,
# and the evaluation libraries the unit tests do not import.
LEFT_OUT = frozenset({
    "torch", "torch-npu", "torchvision", "torchaudio", "triton-ascend", "triton", "arctic-inference", "lm-eval",
    "sentence-transformers", "librosa", "jiwer", "mindstudio-probe", "xlite", "uc-manager", "memfabric-hybrid",
    "memcache-hybrid", "cmake", "ninja", "pybind11", "pip", "setuptools", "setuptools-scm", "wheel", "coverage",
    "pytest-cov", "pandas-stubs", "types-jsonschema", "types-psutil", "mypy", "ruff", "pre-commit", "codespell",
    "yapf", "isort", "clang-format", "actionlint", "pymarkdown", "pymarkdownlnt", "types-pyyaml", "types-requests",
    "types-setuptools", "lm_eval", "modelscope-stubs",
})
RENAMED = {"zmq": "pyzmq"}
DATING_PROBE = "pip"  # what a dated build asks the indexes for first: on every index, long before any commit
REQUIREMENT_FILES = ("requirements.txt", "requirements-dev.txt")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


_FULL_SHA = re.compile(r"[0-9a-f]{40}")
_CLAUSE = re.compile(r"(===|~=|==|!=|<=|>=|<|>)([\w.+!]+)")
_OPERATOR_WORDS = {"===": "arbitrary", "~=": "compatible", "==": "eq", "!=": "ne", "<=": "le", ">=": "ge", "<": "lt",
                   ">": "gt"}


@dataclass(frozen=True)
class PinKey:
    """What a unit-test venv is made of besides the commit: the vLLM and the transformers requirement."""

    vllm: str  # a PyPI version ("0.23.0"), or the vLLM commit (40 hex digits) of a pin that names no release
    transformers: str  # the requirement line as the commit gives it ("transformers==5.5.4"), "" when none

    @property
    def vllm_commit(self) -> str | None:
        return self.vllm if _FULL_SHA.fullmatch(self.vllm) else None

    @property
    def name(self) -> str:
        vllm = f"commit-{self.vllm[:12]}" if self.vllm_commit else self.vllm
        return f"vllm-{vllm}--transformers-{requirement_slug(self.transformers)}"


def requirement_slug(line: str) -> str:
    """A requirement's specifier as a directory name that tells requirements apart: `==5.5.4` is
    `5.5.4`, `>=4.56.0,<5` is `ge4.56.0-lt5`, none is `any`; a line with anything else (extras,
    a marker, a URL) is named by a hash of it as well."""
    match = _NAME.match(line)
    spec = "".join(line[match.end():].split()) if match else "".join(line.split())
    if not spec:
        return "any"
    clauses = [_CLAUSE.fullmatch(clause) for clause in spec.split(",")]
    if all(clauses):
        if len(clauses) == 1 and clauses[0][1] == "==":  # type: ignore[index]
            return clauses[0][2]  # type: ignore[index]
        return "-".join(_OPERATOR_WORDS[c[1]] + c[2] for c in clauses)  # type: ignore[index]
    return "h" + hashlib.sha256(" ".join(line.split()).encode()).hexdigest()[:10]


def requirement_lines(texts: list[str]) -> list[str]:
    """The install lines of requirements files: comments, `-r` includes and options dropped (the
    files included are read by the caller), what no CPU unit test needs left out, aliases renamed."""
    kept: list[str] = []
    for text in texts:
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            match = _NAME.match(line)
            if match is None:
                continue
            name = normalized(match[1])
            if name in LEFT_OUT:
                continue
            line = RENAMED.get(name, line) if name in RENAMED else line
            if line not in kept:
                kept.append(line)
    return kept


def transformers_line(lines: list[str]) -> str:
    return next((line for line in lines if normalized(_NAME.match(line)[1]) == "transformers"  # type: ignore[index]
                 ), "")


class StepFailed(BuildFailed):
    """A step of a venv build that failed: what it did and pip's line that says why."""

    def __init__(self, what: str, cause: str, log_path: Path) -> None:
        super().__init__(f"{what} failed: {cause}; see {log_path}", log_path, tail(log_path))
        self.what = what
        self.cause = cause


class PinVenvUnbuildable(InfrastructureError):
    """A pin venv that cannot be built on its own packages: the environment's failure, not the
    commit's, so the run stops (exit 5) instead of skipping every commit of the key."""


def unbuildable(key: PinKey, failed: StepFailed, lock: Path, locked: bool, index: str) -> PinVenvUnbuildable:
    """The one-line error of a pin venv whose build failed on the key's own packages."""
    transformers = key.transformers or "transformers unpinned"
    if locked:
        next_step = (f"it installs the lock {lock}: correct the line pip names there, or delete the file so "
                     "that the next build resolves the key again and records a new lock")
    else:
        next_step = (f"the key has no lock yet ({lock} is written by its first build): check that {index} "
                     "has the versions the key needs, or put a lock of exact pins that install there at that path")
    return PinVenvUnbuildable(f"the unit-test venv of vLLM {key.vllm} with {transformers} cannot be built: "
                              f"{failed.what} failed: {failed.cause} (build log: {failed.log_path}); "
                              f"an environment failure, not the commit's; {next_step}, {RESUME}")


@dataclass(frozen=True)
class PinVenv:
    path: Path
    key: PinKey
    made: str = ""  # builders/dated.py: MADE_BY_LOCK, MADE_DATED or MADE_AFRESH; "" when not recorded
    cutoff: str | None = None  # a dated venv's cut-off

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


@dataclass(frozen=True)
class CachedVenv:
    """A venv of the cache as `doctor` lists it."""

    name: str
    path: Path
    bytes: int
    last_used: float
    complete: bool


class PinVenvs:
    """The cache of unit-test venvs, `cache_dir/<key name>/`, the torch layer they share,
    `cache_dir/TORCH_LAYER/`, and the vLLM wheels they install, `cache_dir/wheels/` (one per release
    or commit, shared by the transformers pins of one vLLM). `vllm_repo`: a local vLLM clone, where
    the wheels of commit pins are built from."""

    def __init__(self, cache_dir: Path, python: str | None = None, pip_timeout_s: float = 3600.0,
                 vllm_repo: Path | None = None) -> None:
        self.cache_dir = cache_dir
        self.python = python or _base_python()
        self.pip_timeout_s = pip_timeout_s
        self.vllm_repo = vllm_repo

    def acquire(self, key: PinKey, requirements: list[str], log_dir: Path,
                committed: datetime.datetime | None = None) -> PinVenv:
        """The venv of `key`, built now when the cache has none (under a lock: two sessions, or
        two slots, wait for one build). `committed`: the date of the commit it serves, the cut-off
        of a build that resolves (a key without a lock)."""
        venv = self.cache_dir / key.name
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        try:
            layer = self._torch_layer(log_dir / f"venv-{TORCH_LAYER}.log")
        except StepFailed as failed:
            raise PinVenvUnbuildable(f"the torch layer {TORCH_LAYER} of the unit-test venvs cannot be built: "
                                     f"{failed.what} failed: {failed.cause} (build log: {failed.log_path}); "
                                     f"check that {index_description(self.python)} has {' and '.join(TORCH)}, "
                                     f"{RESUME}") from failed
        with _locked(self.cache_dir / f".{key.name}.lock"):
            if not (venv / COMPLETE_MARKER).is_file():
                lock = lock_path(self.cache_dir, key.name)
                seed_lock(lock, shipped_lock(key.name))
                locked = lock.is_file()
                try:
                    self._build(key, requirements, venv, layer, log_dir / f"venv-{key.name}.log", committed)
                except StepFailed as failed:
                    raise unbuildable(key, failed, lock, locked, index_description(self.python)) from failed
        (venv / COMPLETE_MARKER).touch()  # its age is its last use: what pruning reads
        (layer / COMPLETE_MARKER).touch()  # so the layer is never older than a venv on it
        link_host(venv)
        made = _made_of(venv)
        return PinVenv(venv, key, str(made.get("made") or ""), made.get("cutoff"))

    def _torch_layer(self, log_path: Path) -> Path:
        """The venv holding torch and torchvision for every pin venv (built once, under a lock).
        Without triton, as vllm-ascend's CI removes it: the unit tests' conftest mocks
        `triton.runtime`."""
        layer = self.cache_dir / TORCH_LAYER
        with _locked(self.cache_dir / f".{TORCH_LAYER}.lock"):
            if (layer / COMPLETE_MARKER).is_file():
                return layer
            with log_path.open("a", encoding="utf-8") as log:
                python = self._fresh_venv(layer, log, log_path)
                self._step([python, "-m", "pip", "install", "--quiet", *TORCH], log, log_path, "installing torch")
                self._step([python, "-m", "pip", "uninstall", "--quiet", "--yes", "triton"], log, log_path,
                           "removing triton")
            (layer / COMPLETE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n")
        return layer

    def _fresh_venv(self, venv: Path, log: TextIO, log_path: Path) -> str:
        """`venv`'s interpreter, the venv made first where it is missing or broken (a half-built one
        whose interpreter works is kept: every later step is a `pip install` a second run makes good)."""
        python = venv / "bin" / "python"
        if venv.exists() and subprocess.run([str(python), "-c", "import pip"], capture_output=True,
                                            check=False).returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
        if not venv.exists():
            self._step([self.python, "-m", "venv", str(venv)], log, log_path, "creating the venv")
        return str(python)

    def _build(self, key: PinKey, requirements: list[str], venv: Path, layer: Path, log_path: Path,
               committed: datetime.datetime | None) -> None:
        with log_path.open("a", encoding="utf-8") as log:
            python = self._fresh_venv(venv, log, log_path)
            # The layer's packages come after the venv's own: pip sees its torch as installed.
            for site in site_packages(venv):
                (site / LAYER_PTH).write_text("".join(f"{path}\n" for path in site_packages(layer)),
                                              encoding="utf-8")
            # A key built before, here or where its shipped lock was made, installs exactly what it
            # resolved to then, and vLLM without its dependencies (builders/locks.py); a first
            # build resolves, and its lock is recorded below.
            lock = lock_path(self.cache_dir, key.name)  # seeded by `acquire`
            locked = lock.is_file()
            pip = [python, "-m", "pip", "install", "--quiet", *constraint_args(lock)]
            made, cutoff, env = MADE_BY_LOCK, None, None
            if not locked:
                made, cutoff, env = self._dating(committed)
            if env is not None and cutoff is not None:
                self._step([python, "-m", "pip", "install", "--quiet", PIP_WITH_CUTOFF], log, log_path,
                           "installing a pip that takes a cut-off date")
                if self._dates(python, cutoff, env, log):
                    pip += cutoff_args(cutoff)
                else:
                    made, cutoff, env = MADE_AFRESH, None, None
            if locked:
                self._step([python, "-m", "pip", "install", "--quiet", *exact_install_args(lock)], log, log_path,
                           f"installing the lock {lock}")
            self._step([*pip, *SDIST_BUILD], log, log_path, "installing vLLM's build requirements", env=env)
            wheel = (self._vllm_wheel_at(key.vllm, python, log, log_path) if key.vllm_commit
                     else self.vllm_wheel(key.vllm, python, log, log_path))
            # In the order of vllm-ascend's Dockerfile: vLLM with its own requirements, then
            # vllm-ascend's, which win where the two disagree (opencv-python-headless at vLLM 0.19).
            self._step([*pip, *(["--no-deps"] if locked else []), str(wheel)], log, log_path,
                       f"installing vLLM {key.vllm}", env=env)
            if requirements and not locked:
                try:
                    self._step([*pip, *requirements], log, log_path, "installing vllm-ascend's requirements",
                               env=env)
                except StepFailed as failed:  # the commit's own lines: its skip, not the key's failure
                    raise BuildFailed(f"the commit's requirements files do not install beside vLLM {key.vllm}: "
                                      f"{failed.cause}; see {log_path}", log_path, failed.log_tail) from failed
            # A torch or triton that vLLM's requirements put in the venv itself goes (pip leaves
            # the layer's alone): the layer's CPU-usable torch is the one the tests see.
            self._step([python, "-m", "pip", "uninstall", "--quiet", "--yes", "torch", "torchvision", "triton"],
                       log, log_path, "removing a torch of the venv's own")
            record_lock([python, "-m", "pip"], site_packages(venv), lock, leave_out=["vllm"])
        (venv / "bisect-npu-venv.json").write_text(json.dumps(
            {"vllm": key.vllm, "transformers": key.transformers, "torch_layer": str(layer),
             "requirements": requirements, "made": made, "cutoff": cutoff}, indent=1) + "\n")
        (venv / COMPLETE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n")

    def _dating(self, committed: datetime.datetime | None) -> tuple[str, str | None, dict[str, str] | None]:
        """How a key without a lock resolves: (made, cut-off, pip's environment) dated by the
        commit's date where pip is configured with a remote index, else afresh."""
        indexes = dated_indexes(pip_settings(self.python), self.cache_dir / "no-links") if committed else None
        if committed is None or indexes is None:
            return MADE_AFRESH, None, None
        (self.cache_dir / "no-links").mkdir(parents=True, exist_ok=True)
        return MADE_DATED, cutoff_text(committed), {**os.environ, **indexes}

    def _dates(self, python: str, cutoff: str, env: dict[str, str], log: TextIO) -> bool:
        """Whether pip finds anything with the cut-off on these indexes: one that publishes no upload
        times (a mirror without PEP 700) offers nothing under it, and the build goes on afresh."""
        with tempfile.TemporaryDirectory(dir=self.cache_dir) as into:
            argv = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", into, *cutoff_args(cutoff),
                    DATING_PROBE]
            log.write("$ " + " ".join(argv) + "\n")
            log.flush()
            try:
                done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=False,
                                      timeout=self.pip_timeout_s)
            except subprocess.TimeoutExpired:
                return False
        if done.returncode != 0:
            log.write("# the indexes give no upload times to date by: resolving afresh\n")
        return done.returncode == 0

    def vllm_wheel(self, version: str, python: str, log: TextIO, log_path: Path) -> Path:
        """vLLM `version` as a pure-Python wheel, built from its sdist once per release."""
        wheels = self.cache_dir / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
        if found:
            return found[0]
        sdists = self.cache_dir / "sdists"
        sdists.mkdir(exist_ok=True)
        # Without build isolation: the sdist's metadata is prepared here, with this venv's torch
        # (an isolated build would ask for the CUDA torch vLLM's pyproject names).
        download = [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                    "--dest", str(sdists), f"vllm=={version}"]
        # The version as published: without the override the metadata says "0.23.0+empty", and pip
        # refuses a download whose metadata disagrees with its file name.
        empty = {**os.environ, "VLLM_TARGET_DEVICE": "empty", "VLLM_VERSION_OVERRIDE": version}
        start = log.tell()
        try:
            self._step(download, log, log_path, f"downloading vLLM {version}'s source distribution", env=empty)
        except BuildFailed as exc:
            log.flush()
            said = log_path.read_text(encoding="utf-8", errors="replace")[start:]
            if "No matching distribution" in said or "Could not find a version" in said:
                raise UsageError(f"vLLM pin {version}: no source distribution of vllm=={version} on "
                                 f"{index_description(python)}; pass a range whose commits pin a published vLLM "
                                 "release, or point pip at an index that has it (PIP_INDEX_URL)") from exc
            raise
        sdist = next(iter(sorted(sdists.glob(f"vllm-{version}.tar.gz"))), None)
        if sdist is None:
            raise UsageError(f"vLLM pin {version}: no source distribution of vllm=={version} on "
                             f"{index_description(python)} (pip found only a wheel)")
        return self._wheel_of(sdist, wheels, f"vllm-{version}-*.whl", python, empty, log, log_path,
                              f"building vLLM {version} from its sdist")

    def _vllm_wheel_at(self, commit: str, python: str, log: TextIO, log_path: Path) -> Path:
        """vLLM at `commit` as a pure-Python wheel, built once from a checkout of the local vLLM
        clone (with its git history: setuptools-scm names the version, as in vllm-ascend's image)."""
        wheels = self.cache_dir / "wheels" / f"commit-{commit}"
        found = sorted(wheels.glob("vllm-*.whl"))
        if found:
            return found[0]
        if self.vllm_repo is None:
            raise UsageError(commit_pin_refusal(commit))
        missing = missing_commits(self.vllm_repo, [commit])
        if missing:
            raise UsageError(f"vLLM pin {commit[:12]}: the vLLM clone {self.vllm_repo} does not have that commit; "
                             f"fetch it there (git -C {self.vllm_repo} fetch origin {commit})")
        wheels.mkdir(parents=True, exist_ok=True)
        (self.cache_dir / "sdists").mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="vllm-", dir=self.cache_dir / "sdists") as stage:
            source = Path(stage) / "vllm"
            self._step(["git", "clone", "--quiet", "--shared", "--no-checkout", str(self.vllm_repo), str(source)],
                       log, log_path, f"cloning vLLM from {self.vllm_repo}")
            self._step(["git", "-C", str(source), "checkout", "--quiet", "--detach", commit], log, log_path,
                       f"checking out vLLM {commit[:12]}")
            empty = {**os.environ, "VLLM_TARGET_DEVICE": "empty"}
            return self._wheel_of(source, wheels, "vllm-*.whl", python, empty, log, log_path,
                                  f"building vLLM {commit[:12]} from {self.vllm_repo}")

    def _wheel_of(self, source: Path, wheels: Path, pattern: str, python: str, env: dict[str, str], log: TextIO,
                  log_path: Path, what: str) -> Path:
        build = [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
                 str(wheels), str(source)]
        self._step(build, log, log_path, what, env=env)
        found = sorted(wheels.glob(pattern))
        if not found:
            raise StepFailed(what, f"it left no wheel in {wheels}", log_path)
        return found[0]

    def _step(self, argv: list[str], log: TextIO, log_path: Path, what: str,
              env: dict[str, str] | None = None) -> None:
        """Run one build step into the log; a failure is BuildUnreachable (the network) or StepFailed
        with pip's cause line."""
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        start = log.tell()
        try:
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=self.pip_timeout_s,
                                  check=False, env=env)
        except subprocess.TimeoutExpired as exc:
            log.flush()
            raise_if_unreachable(log_path)  # an index that stopped answering: the host's, not the commit's
            raise StepFailed(what, f"timed out after {self.pip_timeout_s:.0f}s", log_path) from exc
        if proc.returncode != 0:
            log.flush()
            raise_if_unreachable(log_path)
            with log_path.open("rb") as written:
                written.seek(start)
                output = written.read().decode("utf-8", errors="replace")
            raise StepFailed(what, f"exit {proc.returncode}, {pip_cause(output)}", log_path)

    def listing(self) -> list[CachedVenv]:
        """The venvs in the cache, newest use first (a venv without its marker is an unfinished build)."""
        if not self.cache_dir.is_dir():
            return []
        found = []
        for path in self.cache_dir.iterdir():
            if not path.is_dir() or path.name in ("wheels", "sdists", "no-links", LOCKS_DIR):
                continue
            marker = path / COMPLETE_MARKER
            used = marker.stat().st_mtime if marker.is_file() else path.stat().st_mtime
            found.append(CachedVenv(path.name, path, tree_bytes(path), used, marker.is_file()))
        return sorted(found, key=lambda v: -v.last_used)

    def prune(self, older_than_s: float, now: float | None = None) -> list[CachedVenv]:
        """Remove the venvs last used more than `older_than_s` ago (and unfinished builds that
        old); returns what went."""
        now = time.time() if now is None else now
        gone = []
        for venv in self.listing():
            if now - venv.last_used > older_than_s:
                with _locked(self.cache_dir / f".{venv.name}.lock"):
                    shutil.rmtree(venv.path, ignore_errors=True)
                gone.append(venv)
        return gone


def commit_pin_refusal(commit: str, where: str = "") -> str:
    """Why a commit pin cannot be built without a vLLM clone, and what to pass (one line)."""
    return (f"vLLM pin {commit[:12]}{where}: a vLLM commit, not a release, so the package index has no source "
            "distribution of it; pass --vllm-repo CLONE (a local vLLM clone that has the commit) to build it from "
            "there, or a range whose commits pin a vLLM release")


def missing_commits(clone: Path, commits: list[str]) -> list[str]:
    """The commits of `commits` that the git repository `clone` does not have."""
    missing = []
    for commit in commits:
        proc = subprocess.run(["git", "-C", str(clone), "cat-file", "-e", f"{commit}^{{commit}}"],
                              capture_output=True, check=False)
        if proc.returncode != 0:
            missing.append(commit)
    return missing


def index_description(python: str) -> str:
    """The indexes pip asks, as its environment and configuration name them (for an error line)."""
    settings = pip_settings(python)
    where = [] if settings.get("no-index", "").lower() in ("1", "true", "yes") else \
        [settings.get("index-url", "https://pypi.org/simple"), *settings.get("extra-index-url", "").split()]
    where += [f"links {link}" for link in settings.get("find-links", "").split()]
    return ", ".join(where) or "no index"


def pip_settings(python: str) -> dict[str, str]:
    """pip's index settings as its configuration files and environment give them (name -> value)."""
    settings: dict[str, str] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60,
                                check=False).stdout
        for line in listed.splitlines():
            name, _, value = line.partition("=")
            settings[name.rpartition(".")[2]] = value.strip().strip("'\"")
    for name in ("index-url", "extra-index-url", "find-links", "no-index"):
        env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if env:
            settings[name] = env
    return settings


def _made_of(venv: Path) -> dict[str, str | None]:
    """How a cached venv was made, as its record says (empty for a venv built before it said)."""
    try:
        record = json.loads((venv / "bisect-npu-venv.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {"made": record.get("made"), "cutoff": record.get("cutoff")} if isinstance(record, dict) else {}


def default_pin_venv_cache() -> Path:
    return cache_root() / "unit-test-venvs"


def _base_python() -> str:
    """The interpreter the venvs are made from: the host's, outside any venv it runs in."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(base) if base.exists() else sys.executable


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
