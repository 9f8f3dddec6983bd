"""LocalBuilder: a candidate as a git worktree on the host, built with the recipe's local command.

No container: this is what `--executor local` and the demo use. Worktrees live under the
session (never the user's checkout) and are removed when the candidate is done; each has its
submodules' files at the commit's pins (`git worktree add` alone leaves them empty).

Build avoidance, as DockerBuilder's overlays: commits with the same build key (the compiled
inputs, bisect_npu/builders/key.py, plus the tracked files the build command names, such as
`tools/build_kernels.py`) compile the same artifacts. The first of a key runs the build command
and its outputs (every file the build left untracked in the worktree) are kept in
``artifacts_dir``; the others get their own checkout plus a copy of those outputs ("overlay").
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO, Literal

import git

from bisect_npu.builders.base import BuildFailed, Environment, tail
from bisect_npu.builders.failures import raise_if_unreachable
from bisect_npu.builders.key import BuildKeyReader
from bisect_npu.builders.submodules import check_out_submodules
from bisect_npu.defaults import TRIAL_TIMEOUT_S
from bisect_npu.errors import UsageError

DONOR_FILE = "donor"  # in a key's artifacts: the commit whose build made them
WORKTREE_NAME = re.compile(r"[0-9a-f]{12}")  # a candidate's worktree: its commit's short sha


def _copy_tree(source: Path, destination: Path) -> int:
    """Copy every file under `source` to the same relative place under `destination`."""
    count = 0
    for item in sorted(source.rglob("*")):
        if item.is_dir() and not item.is_symlink():
            continue
        target = destination / item.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(item, target, follow_symlinks=False)
        count += 1
    return count


def check_workdir(workdir: Path) -> None:
    """Refuse a --workdir that cannot hold worktrees. Each session works in a subdirectory of its
    own (named after the session), so whatever else the directory holds is never touched."""
    if not workdir.parent.exists():
        raise UsageError(f"worktree location {workdir}: parent directory does not exist; "
                         "create it or pass --workdir with an existing directory")
    if workdir.exists() and not workdir.is_dir():
        raise UsageError(f"worktree location {workdir} is a file; pass --workdir with a directory")
    try:  # a directory made and removed: permissions alone say nothing of /proc, /sys or a read-only mount
        Path(tempfile.mkdtemp(prefix=".bisect-npu-", dir=workdir if workdir.exists() else workdir.parent)).rmdir()
    except OSError as exc:
        raise UsageError(f"worktree location {workdir} is not writable ({exc.strerror}); pass --workdir with a "
                         "directory you can write to") from None


def sweep_worktrees(repo: git.Repo, directory: Path, names: re.Pattern[str] | None = None) -> None:
    """Remove the worktrees of `repo` registered under `directory`, however they were left: a killed
    process's (still locked by an unfinished `git worktree add`, or half-made) included. With
    `names`, only its direct entries whose name matches (the directory may hold other things);
    without, everything below it (a directory that is wholly ours)."""
    try:
        listing = repo.git.worktree("list", "--porcelain")
    except git.GitCommandError:
        return
    root = directory.resolve()
    paths = [Path(line.split(" ", 1)[1]) for line in listing.splitlines() if line.startswith("worktree ")]
    for path in paths:
        where = path.resolve()
        if names is not None and (where.parent != root or not names.fullmatch(path.name)):
            continue
        if names is None and root not in where.parents:
            continue
        remove_worktree(repo, path)


def remove_worktree(repo: git.Repo, path: Path) -> None:
    """Remove one worktree of `repo` however it was left: whole, locked (a killed `git worktree
    add`), or half-made or already deleted (then only its registration is pruned)."""
    if path.exists():
        try:
            repo.git.worktree("remove", "--force", "--force", str(path))  # twice: locked ones too
            return
        except git.GitCommandError:
            pass
    with contextlib.suppress(git.GitCommandError):
        repo.git.worktree("unlock", str(path))
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(git.GitCommandError):
        repo.git.worktree("prune")


def sweep_worktrees_of_any_repo(directory: Path) -> None:
    """`sweep_worktrees` for every repository that has a worktree below `directory` (each worktree's
    `.git` file names it): a directory left by a run on another clone."""
    owners: set[Path] = set()
    for marker in directory.rglob(".git"):
        if marker.is_file() and (text := marker.read_text(errors="replace").strip()).startswith("gitdir:"):
            owners.add(Path(text.split(":", 1)[1].strip()).parent.parent)  # <repo>/.git/worktrees/<name>
    for owner in owners:
        with contextlib.suppress(git.GitError, OSError):
            sweep_worktrees(git.Repo(owner), directory)


class RepositoryLock:
    """Turns at a clone's worktree list for this process's threads and for other processes on
    this host (another session, the builders of several Ray nodes on one machine): two
    `git worktree add` at once in one clone can fail. An flock on a file in the temporary
    directory named after the clone, so the clone itself gets no file of ours."""

    def __init__(self, repo: git.Repo) -> None:
        digest = hashlib.sha256(str(Path(repo.common_dir).resolve()).encode()).hexdigest()[:16]
        self.path = Path(tempfile.gettempdir()) / f"bisect-npu-worktrees-{digest}.lock"
        self._threads = threading.Lock()
        self._file: IO[str] | None = None

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            self._file = self.path.open("a")
            fcntl.flock(self._file, fcntl.LOCK_EX)
        except BaseException:
            if self._file is not None:
                self._file.close()
            self._threads.release()
            raise

    def __exit__(self, *exc_info: object) -> None:
        assert self._file is not None
        try:
            self._file.close()  # closing releases the flock
        finally:
            self._file = None
            self._threads.release()


class LocalBuilder:
    """Check out each candidate into its own worktree and run the recipe's build command there.

    The last `keep` built worktrees stay until `close()`: noisy bisection comes back to the same
    commits for more trials, and a second build of the same commit would only cost time. Slots
    may run trials of one commit at once: they share one worktree, built once, and it is kept
    (or evicted) only when the last of them releases it.
    """

    def __init__(self, repo: git.Repo, workdir: Path, build_command: list[str] | None = None,
                 env: dict[str, str] | None = None, timeout_s: float = TRIAL_TIMEOUT_S, keep: int = 4,
                 artifacts_dir: Path | None = None, submodules: bool = True) -> None:
        self.repo = repo
        self.submodules = submodules  # False: the candidate runs no build that needs them (`--unit-test`)
        self.workdir = workdir
        self.build_command = build_command or []
        self.artifacts_dir = artifacts_dir if self.build_command else None
        self._keys = BuildKeyReader(repo)
        self.env = env or {}
        self.timeout_s = timeout_s
        self.keep = keep
        self._kept: OrderedDict[str, Environment] = OrderedDict()
        self._active: dict[str, tuple[Environment, int]] = {}  # commit -> (worktree, holders)
        self._commit_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._git_lock = RepositoryLock(repo)  # prefetch builds in a thread; git's worktree list is shared
        self._outputs_lock = threading.Lock()  # two builds of one key (prefetch) replace its outputs in turn

    def _worktree_path(self, commit: str) -> Path:
        return self.workdir / commit[:12]

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        with self._lock:
            commit_lock = self._commit_locks.setdefault(commit, threading.Lock())
        with commit_lock:  # a second slot on this commit waits for the first one's build
            with self._lock:
                active = self._active.get(commit)
                if active is not None:
                    self._active[commit] = (active[0], active[1] + 1)
                    return active[0].model_copy(update={"how": "reused", "seconds": 0.0})
                kept = self._kept.pop(commit, None)
            if kept is not None and kept.path and Path(kept.path).is_dir():
                env = kept.model_copy(update={"how": "reused", "seconds": 0.0})
            else:
                try:
                    env = self._build(commit, log_dir)
                except BaseException:
                    self._remove_worktree(self._worktree_path(commit))  # a failed build keeps nothing
                    raise
            with self._lock:
                self._active[commit] = (env, 1)
            return env

    def _build(self, commit: str, log_dir: Path) -> Environment:
        started = time.monotonic()
        path = self._worktree_path(commit)
        self._remove_worktree(path)  # a worktree left by a killed run is never trusted
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self._git_lock:
            # Twice --force: a worktree registration left locked by a killed `git worktree add` is overridden.
            self.repo.git.worktree("add", "--detach", "--force", "--force", str(path), commit)
            submodules = check_out_submodules(self.repo, commit, path) if self.submodules else 0
        key = self.build_key(commit)
        outputs = self.artifacts_dir / key if self.artifacts_dir is not None and key else None
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"build-{commit[:12]}.log"
        how: Literal["built", "overlay"] = "built"
        with log_path.open("w", encoding="utf-8") as log:
            if submodules:
                log.write(f"# {submodules} submodule(s) checked out at the commit's pins\n")
            if outputs is not None and (outputs / DONOR_FILE).is_file():
                donor = (outputs / DONOR_FILE).read_text().strip()
                copied = _copy_tree(outputs / "files", path)
                log.write(f"# overlay: {copied} build output file(s) of {donor[:12]} (key {key}) copied in; "
                          "no build command run\n")
                how = "overlay"
            else:
                log.write(f"$ {' '.join(self.build_command) or '(no build command)'}\n")
                log.flush()
                if self.build_command:
                    self._run_build(path, log, log_path)
                if outputs is not None:
                    self._keep_outputs(commit, path, outputs)
        return Environment(kind="worktree", commit=commit, build_key=key or "", path=str(path), how=how,
                           seconds=round(time.monotonic() - started, 3), log_path=str(log_path))

    def _keep_outputs(self, commit: str, path: Path, outputs: Path) -> None:
        """What the build left untracked in the worktree, kept for the other commits of its key
        (staged, then renamed: a half-copied set is never taken for a whole one)."""
        with self._git_lock:
            made = [p for p in git.Repo(path).git.ls_files("--others", "-z").split("\0")
                    if p and "__pycache__" not in p.split("/") and not p.endswith(".pyc")]  # bytecode: per commit
        staging = outputs.with_name(f".{outputs.name}-{os.getpid()}-{threading.get_ident()}")
        shutil.rmtree(staging, ignore_errors=True)
        for relative in made:
            target = staging / "files" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path / relative, target, follow_symlinks=False)
        (staging / "files").mkdir(parents=True, exist_ok=True)
        (staging / DONOR_FILE).write_text(commit + "\n")
        with self._outputs_lock:
            shutil.rmtree(outputs, ignore_errors=True)
            staging.rename(outputs)

    def _run_build(self, path: Path, log: IO[str], log_path: Path) -> None:
        env = {**os.environ, **self.env}
        try:
            proc = subprocess.run(self.build_command, cwd=path, stdout=log, stderr=subprocess.STDOUT,
                                  env=env, timeout=self.timeout_s, check=False)
        except FileNotFoundError as exc:
            raise UsageError(f"build command not found: {self.build_command[0]}; "
                             "fix `build.local_command` in the recipe") from exc
        except subprocess.TimeoutExpired as exc:
            log.flush()
            raise_if_unreachable(log_path)  # an index that stopped answering: the host's, not the commit's
            raise BuildFailed(f"build timed out after {self.timeout_s:.0f}s", log_path, tail(log_path)) from exc
        if proc.returncode != 0:
            log.flush()
            raise_if_unreachable(log_path)
            raise BuildFailed(f"build failed with exit code {proc.returncode}", log_path, tail(log_path))

    def release(self, env: Environment) -> None:
        """Keep the worktree for a later trial of the same commit; drop the oldest beyond `keep`."""
        with self._lock:
            held, holders = self._active.pop(env.commit, (env, 1))
            if holders > 1:
                self._active[env.commit] = (held, holders - 1)
                return
            self._kept[env.commit] = held
            evicted = []
            while len(self._kept) > self.keep:
                evicted.append(self._kept.popitem(last=False)[1])
        for old in evicted:
            if old.path:
                self._remove_worktree(Path(old.path))

    def build_key(self, commit: str) -> str | None:
        """The compiled inputs' key plus the tracked files the build command names; None without
        a build command or an artifacts directory (every commit is then its own build)."""
        if self.artifacts_dir is None:
            return None
        with self._git_lock:
            tree = self.repo.commit(commit).tree
            named = []
            for arg in self.build_command:
                try:
                    named.append(f"{arg}={(tree / arg).hexsha}")
                except KeyError:
                    continue
            digest = self._keys.key(commit).digest
        return hashlib.sha256("\n".join([digest, *named]).encode()).hexdigest()[:16]

    def built_keys(self) -> frozenset[str]:
        """Empty: a key's outputs live in the session's artifacts directory and go with it."""
        return frozenset()

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
            kept += [env for env, _ in self._active.values()]
            self._active = {}
        interrupted: KeyboardInterrupt | None = None
        for env in kept:
            try:
                if env.path:
                    self._remove_worktree(Path(env.path))
            except KeyboardInterrupt as again:  # a second Ctrl-C must not leave the rest behind
                interrupted = again
        # And what an earlier, killed process of this session left: only our worktrees live here.
        with self._git_lock:
            sweep_worktrees(self.repo, self.workdir, WORKTREE_NAME)
        with contextlib.suppress(OSError):
            self.workdir.rmdir()  # only when empty: nothing of anyone else's goes
        if self.artifacts_dir is not None:
            shutil.rmtree(self.artifacts_dir, ignore_errors=True)
        if interrupted is not None:
            raise interrupted

    def _remove_worktree(self, path: Path) -> None:
        with self._git_lock:
            remove_worktree(self.repo, path)
