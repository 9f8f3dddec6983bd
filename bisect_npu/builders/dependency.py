"""A declared dependency (recipe `dependencies`, e.g. vLLM under vllm-ascend) laid into the
upstream's candidates: its pin read at an upstream commit, its clone, its Python tree at one of
its commits, and `DependencyBuilder`, which makes a candidate of the upstream build with that
tree in place of the one the build installed.

Nothing is compiled: the dependency is Python-only in the image (vllm-ascend installs vLLM with
`VLLM_TARGET_DEVICE=empty`), so its tree at another commit is a file copy: first on PYTHONPATH
for a worktree (`--executor local`), one committed layer at `image_path` for an image.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import git
from packaging.requirements import InvalidRequirement, Requirement

from bisect_npu.builders.base import Builder, BuildFailed, Environment
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.paths import cache_root
from bisect_npu.recipe.schema import DependencySpec
from bisect_npu.upstream import history
from bisect_npu.upstream.dockerfile import parse_dockerfile

# Files of the installed tree a replacement keeps: generated at install time (`_version.py`,
# which git does not hold) or compiled (none in a Python-only tree, kept should one be there).
KEPT_IN_IMAGE = ("_version.py", "*.so")
_URL_REF = re.compile(r"@([^@/#]+)(?:#.*)?$")


def read_pin(repo: git.Repo, commit: str, spec: DependencySpec, dockerfile: str = "Dockerfile",
             build_args: Mapping[str, str] | None = None) -> str | None:
    """The dependency's version as the upstream pins it at `commit` (a tag, version or sha as
    written); None when the commit has no such pin. Build args override the Dockerfile's ARG
    defaults, as docker does for ARGs the Dockerfile declares."""
    path = spec.pin.where(dockerfile)
    try:
        blob = repo.commit(commit).tree / path
    except KeyError:
        return None
    text = blob.data_stream.read().decode("utf-8", errors="replace")
    if spec.pin.arg:
        declared = parse_dockerfile(text).args
        args = {**declared, **{k: v for k, v in (build_args or {}).items() if k in declared}}
        return next((args[name] for name in spec.pin.arg if args.get(name)), None)
    assert spec.pin.requirement is not None
    wanted = spec.pin.requirement.lower().replace("_", "-")
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name.lower().replace("_", "-") != wanted:
            continue
        if requirement.url:
            found = _URL_REF.search(requirement.url)
            return found.group(1) if found else None
        exact = [s.version for s in requirement.specifier if s.operator in ("==", "===")]
        return exact[0] if exact else None
    return None


def clone_cache(spec: DependencySpec, url: str) -> Path:
    """Where the cached clone of a dependency's `url` lives."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:12]
    return cache_root() / "dependencies" / f"{spec.name}-{digest}"


def open_dependency_clone(spec: DependencySpec, given: str | None) -> git.Repo:
    """The dependency's repository: `given` (--dep-repo: a clone, or a URL cloned into the
    cache), else a clone of the declared `url` made once into the cache and never fetched again
    (a pin it lacks is an error naming the fetch)."""
    if given and not history.is_url(given):
        return history.open_repo(given, remedy=f"--dep-repo {spec.name}=PATH must name a clone of {spec.name}")
    url = given or spec.url
    if not url:
        raise UsageError(f"dependency {spec.name}: no clone to bisect it in; pass --dep-repo {spec.name}=PATH_OR_URL "
                         "or give the dependency a `url` in the recipe")
    path = clone_cache(spec, url)
    if not (path / "HEAD").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        done = subprocess.run(["git", "clone", "--bare", "--quiet", "--", url, str(staging)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            reason = (done.stderr.strip().splitlines() or ["git clone failed"])[-1]
            raise InfrastructureError(f"dependency {spec.name}: cannot clone {url} ({reason}); clone it yourself "
                                      f"and pass --dep-repo {spec.name}=PATH")
        with contextlib.suppress(OSError):
            staging.rename(path)  # a concurrent run may have made it first: theirs is as good
        shutil.rmtree(staging, ignore_errors=True)
    return git.Repo(path)


def resolve_pin(repo: git.Repo, spec: DependencySpec, pin: str, where: str) -> str:
    """The commit a pin names in the dependency's clone (`v` prefixed too: requirements spell
    0.11.0 where the tag is v0.11.0); a pin the clone lacks is an error with the fetch to run."""
    for ref in dict.fromkeys((pin, f"v{pin}", f"refs/tags/{pin}", f"refs/tags/v{pin}")):
        with contextlib.suppress(ValueError, git.BadName, git.GitCommandError):
            return repo.commit(ref).hexsha
    clone = repo.working_tree_dir or repo.git_dir
    what = "tag " + pin if not re.fullmatch(r"[0-9a-f]{7,40}", pin) else pin
    raise UsageError(f"dependency {spec.name}: the clone {clone} has no {pin} (pinned by {where}); fetch it: "
                     f"git -C {clone} fetch origin {what}")


def materialize(repo: git.Repo, sha: str, package_dir: str, trees: Path) -> Path:
    """The dependency's `package_dir` at `sha`, extracted once into `trees/<sha>` (a directory to
    put first on PYTHONPATH); its file count is checked against git's."""
    target = trees / sha
    if target.is_dir():
        return target
    expected = [line for line in repo.git.ls_tree("-r", sha, "--", package_dir).splitlines()
                if line.split(None, 2)[1:2] == ["blob"]]
    if not expected:
        raise BuildFailed(f"dependency commit {sha[:12]} has no {package_dir}/: nothing to lay in")
    data = repo.git.archive("--format=tar", sha, "--", package_dir, stdout_as_string=False)
    staging = trees / f".{sha}-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            archive.extractall(staging, filter="data")
        found = sum(1 for p in (staging / package_dir).rglob("*") if p.is_file() or p.is_symlink())
        if found != len(expected):
            raise BuildFailed(f"dependency tree {package_dir}/ at {sha[:12]}: {found} file(s) extracted, "
                              f"git lists {len(expected)}")
        try:
            staging.rename(target)
        except OSError:  # another thread made it first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def tree_tar(tree: Path, package_dir: str, image_path: str) -> bytes:
    """The extracted tree as a tar rooted at `/`, placing `package_dir` under `image_path`."""
    out = io.BytesIO()
    prefix = image_path.strip("/")
    with tarfile.open(fileobj=out, mode="w") as archive:
        archive.add(tree / package_dir, arcname=f"{prefix}/{package_dir}" if prefix else package_dir)
    return out.getvalue()


def layer_plan(spec: DependencySpec) -> dict[str, object]:
    """What the overlay helper does in the image before the tree is copied in: clear the
    installed `package_dir` (its generated and compiled files kept), leave the version alone; for
    a dependency the image does not install, make `image_path` and put it on the import path."""
    assert spec.image_path is not None
    return {"source_dir": spec.image_path, "delete": [], "version": "",
            "clear": [{"dir": spec.package_dir, "keep": list(KEPT_IN_IMAGE)}],
            "import_path": not spec.installed_by_image}


@runtime_checkable
class Layers(Protocol):
    """What lays a tree into an image as one more layer, and lets that image go when its candidate
    is done (DockerBuilder)."""

    def lay_over(self, env: Environment, tree: bytes, plan: dict[str, object], key: str,
                 log_path: Path) -> Environment: ...

    def unpin_layer(self, env: Environment) -> None: ...


class PinnedCommit:
    """The dependency commit an upstream commit pins (for a dependency the upstream's build does
    not install: every candidate gets it laid in)."""

    def __init__(self, upstream: git.Repo, clone: git.Repo, spec: DependencySpec, dockerfile: str,
                 build_args: Mapping[str, str]) -> None:
        self.upstream = upstream
        self.clone = clone
        self.spec = spec
        self.dockerfile = dockerfile
        self.build_args = dict(build_args)
        self._lock = threading.Lock()

    def __call__(self, commit: str) -> str:
        where = self.spec.pin.describe(self.dockerfile)
        with self._lock:
            pin = read_pin(self.upstream, commit, self.spec, self.dockerfile, self.build_args)
            if pin is None:
                raise BuildFailed(f"{commit[:12]} pins no {self.spec.name} ({where} not found)")
            return resolve_pin(self.clone, self.spec, pin, f"{where} at {commit[:12]}")


class DependencyBuilder:
    """Candidates that are an upstream commit's build with the dependency's tree at a given
    commit: `upstream(candidate)` and `dependency(candidate)` say which. At the dependency level
    the upstream is held fixed and the candidates are dependency commits; for a dependency the
    image does not install, every upstream commit gets the tree at its pin (PinnedCommit).

    The build key is the upstream's (what is compiled; the dependency tree compiles nothing);
    the environment's key names the dependency commit too."""

    def __init__(self, inner: Builder, spec: DependencySpec, repo: git.Repo,
                 upstream: Callable[[str], str], dependency: Callable[[str], str], trees: Path,
                 layers: Layers | None = None) -> None:
        self.inner = inner
        self.spec = spec
        self.repo = repo
        self.upstream = upstream
        self.dependency = dependency
        self.trees = trees
        self.layers = layers  # images: the tree as a layer (DockerBuilder)
        self._held: dict[str, list[Environment]] = {}  # candidate -> the upstream environments it holds
        self._lock = threading.Lock()
        self._git_lock = threading.Lock()

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        upstream, dep_sha = self.upstream(commit), self.dependency(commit)
        env = self.inner.acquire(upstream, log_dir)
        started = time.monotonic()
        try:
            with self._git_lock:
                tree = materialize(self.repo, dep_sha, self.spec.package_dir, self.trees)
            key = f"{env.build_key or upstream[:12]}+{self.spec.name}@{dep_sha[:12]}"
            note = f"# {self.spec.name} {self.spec.package_dir}/ at {dep_sha} laid over {upstream[:12]}"
            if env.kind == "image":
                if self.layers is None or self.spec.image_path is None:
                    raise UsageError(f"dependency {self.spec.name}: give it an image_path (where its repository "
                                     "sits in the image) to lay its tree into an image")
                # The layer's identity: this upstream commit (not its build key: commits of one key differ
                # in their Python files) with this dependency commit.
                made = self.layers.lay_over(env, tree_tar(tree, self.spec.package_dir, self.spec.image_path),
                                     layer_plan(self.spec), f"{upstream[:16]}-{self.spec.name}-{dep_sha[:16]}",
                                     log_dir / f"build-{commit[:12]}-{self.spec.name}.log")
            elif env.kind == "worktree":
                made = env.model_copy(update={"python_paths_first": [str(tree), *env.python_paths_first]})
                if env.log_path:
                    with open(env.log_path, "a", encoding="utf-8") as log:
                        log.write(f"{note}: {tree} first on PYTHONPATH\n")
            else:
                raise UsageError(f"dependency {self.spec.name}: a {env.kind} cannot take its tree")
        except BaseException:
            self.inner.release(env)
            raise
        # "built" when the upstream's build ran for it; "reused" when its layer image was made before.
        how = "built" if env.how == "built" else ("reused" if made.how == "reused" else "overlay")
        made = made.model_copy(update={"commit": commit, "build_key": key, "how": how,
                                       "seconds": round(env.seconds + time.monotonic() - started, 3)})
        with self._lock:
            self._held.setdefault(commit, []).append(env)
        return made

    def release(self, env: Environment) -> None:
        with self._lock:
            held = self._held.get(env.commit)
            inner = held.pop() if held else None
        if inner is not None:
            self.inner.release(inner)
        if env.kind == "image" and self.layers is not None:
            self.layers.unpin_layer(env)

    def close(self) -> None:
        self.inner.close()

    def build_key(self, commit: str) -> str | None:
        return self.inner.build_key(self.upstream(commit))

    def built_keys(self) -> frozenset[str]:
        return self.inner.built_keys()

