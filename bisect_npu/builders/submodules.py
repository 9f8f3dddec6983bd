"""A commit's tree with its submodules at the commits it pins, for builds that have no checkout.

`git archive` leaves a submodule's directory empty, and a worktree made by `git worktree add`
does not check submodules out; vllm-ascend's kernel build needs csrc/third_party/catlass (a
submodule since #3532). Both builders take the submodules' content from the clone's own
`modules/` store; a clone bisect-npu made of a --repo URL fetches a missing pin itself.
"""

from __future__ import annotations

import io
import posixpath
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import git

from bisect_npu.builders.base import BuildFailed
from bisect_npu.errors import InfrastructureError
from bisect_npu.upstream.history import default_cache_dir


def commit_archive(repo: git.Repo, commit: str) -> IO[bytes]:
    """The commit's tree as a tar, submodules included, without touching any checkout."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        _Assembly(archive, commit).tree(_git_dirs(repo), commit, prefix="")
    out.seek(0)
    return out


def check_out_submodules(repo: git.Repo, commit: str, worktree: Path) -> int:
    """Write each submodule's files, at the commit's pins, into a worktree of `commit`; how many
    submodules (nested ones included) were written. One the clone lacks is an error even when no
    build needs it: an oracle that reads it would judge an empty directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        assembly = _Assembly(archive, commit)
        assembly.submodules(_git_dirs(repo), commit, prefix="")
    if assembly.count:
        out.seek(0)
        with tarfile.open(fileobj=out, mode="r:") as tar:
            # Names come from git trees (no absolute paths, no `..`); the filter refuses them anyway.
            safe = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}  # Python >= 3.11.4
            tar.extractall(worktree, **safe)  # type: ignore[arg-type]
    return assembly.count


def _git_dirs(repo: git.Repo) -> tuple[Path, ...]:
    """Where a clone keeps its submodules (`modules/`): a linked worktree's own git dir first (a
    submodule initialised there lives in it), then the repository's common one."""
    own, common = Path(repo.git_dir), Path(repo.common_dir)
    return (own, common) if own.resolve() != common.resolve() else (common,)


@dataclass
class _Assembly:
    """One tar being assembled for the commit `top`, and how many submodules went into it."""

    archive: tarfile.TarFile
    top: str
    count: int = 0

    def tree(self, git_dirs: tuple[Path, ...], commit: str, prefix: str) -> None:
        done = subprocess.run(["git", "--git-dir", str(git_dirs[0]), "archive", "--format=tar", f"--prefix={prefix}",
                               commit], capture_output=True, check=False)
        if done.returncode != 0:
            raise BuildFailed(f"git archive {commit[:12]} failed: {done.stderr.decode(errors='replace').strip()}")
        with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r:") as source:
            for member in source:
                if member.type != tarfile.XGLTYPE:
                    self.archive.addfile(member, source.extractfile(member) if member.isfile() else None)
        self.submodules(git_dirs, commit, prefix)

    def submodules(self, git_dirs: tuple[Path, ...], commit: str, prefix: str) -> None:
        for sub_prefix, module, pinned in _pinned_modules(git_dirs, commit, prefix, self.top):
            self.count += 1
            self.tree((module,), pinned, sub_prefix)


def check_submodule_pins(repo: git.Repo, commit: str) -> None:
    """Every submodule `commit` pins (nested ones too) is in this clone, or an InfrastructureError
    that says how to get it: checked at a run's ends before its session exists."""
    pending = [(_git_dirs(repo), commit, "")]
    while pending:
        git_dirs, sha, prefix = pending.pop()
        for sub_prefix, module, pinned in _pinned_modules(git_dirs, sha, prefix, commit):
            pending.append(((module,), pinned, sub_prefix))


def _pinned_modules(git_dirs: tuple[Path, ...], commit: str, prefix: str, top: str) -> Iterator[tuple[str, Path, str]]:
    """(its prefix in the tree, its git dir, the pinned commit) of each submodule `commit` pins."""
    for path, pinned in _gitlinks(git_dirs[0], commit):
        name = submodule_name(git_dirs[0], commit, path)
        if name is None:  # a gitlink .gitmodules does not map: git does not check it out either
            continue
        module = _module_store(git_dirs, commit, name, pinned)
        if module is None:
            raise InfrastructureError(
                f"{top[:12]} pins submodule {prefix}{path} at {pinned[:12]}, which this clone does not have; run "
                "`git submodule update --init --recursive` in the repository (for a submodule the checked-out "
                "commit no longer has, from a commit that has it), or pass --repo as a URL: bisect-npu then "
                "fetches submodules into its cached clone itself; then run again")
        yield f"{prefix}{path}/", module, pinned


def _module_store(git_dirs: tuple[Path, ...], commit: str, name: str, pinned: str) -> Path | None:
    """The git dir of submodule `name` that holds `pinned`; a cached clone fetches it first."""
    for git_dir in git_dirs:
        if _has_commit(git_dir / "modules" / name, pinned):
            return git_dir / "modules" / name
    common = git_dirs[-1]
    if _is_cached_clone(common):
        _fetch_submodule(common, commit, name, common / "modules" / name, pinned)
        if _has_commit(common / "modules" / name, pinned):
            return common / "modules" / name
    return None


def _has_commit(git_dir: Path, sha: str) -> bool:
    return git_dir.is_dir() and subprocess.run(
        ["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True,
        check=False).returncode == 0


def _is_cached_clone(git_dir: Path) -> bool:
    """A clone bisect-npu made of a --repo URL (or a submodule inside one): ours to fetch into."""
    return default_cache_dir().resolve() in git_dir.resolve().parents


def _fetch_submodule(git_dir: Path, commit: str, name: str, module: Path, pinned: str) -> None:
    """Fetch the pinned commit of submodule `name` into `module` (bare), from the URL the commit's
    .gitmodules gives (a relative URL is relative to the superproject's origin)."""
    url = _git_text(git_dir, "config", "--blob", f"{commit}:.gitmodules", f"submodule.{name}.url")
    if not url:
        return
    if url.startswith(("./", "../")):
        origin = _git_text(git_dir, "config", "remote.origin.url").rstrip("/")
        url = posixpath.normpath(posixpath.join(origin.split("://", 1)[-1], url))
        url = f"{origin.split('://', 1)[0]}://{url}" if "://" in origin else url
    if not module.is_dir():
        subprocess.run(["git", "init", "--quiet", "--bare", str(module)], capture_output=True, check=False)
        # Its own submodules' relative URLs are relative to this one's origin, as in a clone.
        subprocess.run(["git", "--git-dir", str(module), "config", "remote.origin.url", url], capture_output=True,
                       check=False)
    for refspec in ([pinned], ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]):
        # The URL comes from upstream's .gitmodules: never a transport that runs commands.
        subprocess.run(["git", "-c", "protocol.ext.allow=never", "--git-dir", str(module), "fetch", "--quiet",
                        "--", url, *refspec], capture_output=True, check=False)
        if _has_commit(module, pinned):
            return


def _git_text(git_dir: Path, *args: str) -> str:
    done = subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, check=False)
    return done.stdout.decode(errors="replace").strip() if done.returncode == 0 else ""


def _gitlinks(git_dir: Path, commit: str) -> list[tuple[str, str]]:
    """(path, pinned commit) of each submodule in the commit's tree."""
    listing = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "-r", "-z", commit],
                             capture_output=True, check=True).stdout.decode()
    links = []
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        _mode, kind, sha = meta.split()
        if kind == "commit":
            links.append((path, sha))
    return links


def submodule_name(git_dir: Path, commit: str, path: str) -> str | None:
    """The submodule's name for `path` in the commit's .gitmodules (git keeps it under modules/<name>),
    None when .gitmodules does not map the path. A name git itself would refuse (`..`, an absolute
    path) is not used as a directory: the path stands in for it."""
    done = subprocess.run(["git", "--git-dir", str(git_dir), "config", "-z", "--blob", f"{commit}:.gitmodules",
                           "--get-regexp", r"^submodule\..*\.path$"], capture_output=True, check=False)
    for record in filter(None, done.stdout.decode(errors="replace").split("\0")):
        key, _, value = record.partition("\n")
        name = key[len("submodule."):-len(".path")]
        if value == path:
            return name if name and ".." not in Path(name).parts and not name.startswith("/") else path
    return None
