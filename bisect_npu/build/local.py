"""LocalBuilder: a candidate as a git worktree on the host, built with the recipe's local command.

No container: this is what `--executor local` and the demo use. Worktrees live under the
session (never the user's checkout) and are removed when the candidate is done.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO

import git

from bisect_npu.build.base import BuildFailed, Environment, tail
from bisect_npu.models import UsageError


def check_workdir(workdir: Path) -> None:
    """Refuse a worktree location that is missing its parent or already holds foreign files."""
    if not workdir.parent.exists():
        raise UsageError(f"worktree location {workdir}: parent directory does not exist; "
                         "create it or pass --workdir with an existing directory")
    if workdir.exists():
        if not workdir.is_dir():
            raise UsageError(f"worktree location {workdir} is a file; pass --workdir with a directory")
        foreign = [p.name for p in workdir.iterdir() if not (p / ".git").is_file()]
        if foreign:
            raise UsageError(f"worktree location {workdir} is not empty ({', '.join(sorted(foreign)[:3])}); "
                             "pass --workdir with an empty directory or remove those files")
    elif not os.access(workdir.parent, os.W_OK):
        raise UsageError(f"worktree location {workdir}: {workdir.parent} is not writable")


class LocalBuilder:
    """Check out each candidate into its own worktree and run the recipe's build command there.

    The last `keep` built worktrees stay until `close()`: noisy bisection comes back to the same
    commits for more trials, and a second build of the same commit would only cost time. Slots
    may run trials of one commit at once: they share one worktree, built once, and it is kept
    (or evicted) only when the last of them releases it.
    """

    def __init__(self, repo: git.Repo, workdir: Path, build_command: list[str] | None = None,
                 env: dict[str, str] | None = None, timeout_s: float = 3600.0, keep: int = 4) -> None:
        self.repo = repo
        self.workdir = workdir
        self.build_command = build_command or []
        self.env = env or {}
        self.timeout_s = timeout_s
        self.keep = keep
        self._kept: OrderedDict[str, Environment] = OrderedDict()
        self._active: dict[str, tuple[Environment, int]] = {}  # commit -> (worktree, holders)
        self._commit_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._git_lock = threading.Lock()  # prefetch builds in a thread; git's worktree list is shared

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
                env = self._build(commit, log_dir)
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
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"build-{commit[:12]}.log"
        with log_path.open("w", encoding="utf-8") as log:
            log.write(f"$ {' '.join(self.build_command) or '(no build command)'}\n")
            log.flush()
            if self.build_command:
                self._run_build(commit, path, log, log_path)
        return Environment(kind="worktree", commit=commit, path=str(path), how="built",
                           seconds=round(time.monotonic() - started, 3), log_path=str(log_path))

    def _run_build(self, commit: str, path: Path, log: IO[str], log_path: Path) -> None:
        env = {**os.environ, **self.env}
        try:
            proc = subprocess.run(self.build_command, cwd=path, stdout=log, stderr=subprocess.STDOUT,
                                  env=env, timeout=self.timeout_s, check=False)
        except FileNotFoundError as exc:
            raise UsageError(f"build command not found: {self.build_command[0]}; "
                             "fix `build.local_command` in the recipe") from exc
        except subprocess.TimeoutExpired as exc:
            raise BuildFailed(f"build timed out after {self.timeout_s:.0f}s", log_path, tail(log_path)) from exc
        if proc.returncode != 0:
            log.flush()
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
        """None: every commit gets its own worktree and build command."""
        return None

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
            kept += [env for env, _ in self._active.values()]
            self._active = {}
        for env in kept:
            if env.path:
                self._remove_worktree(Path(env.path))

    def _remove_worktree(self, path: Path) -> None:
        with self._git_lock:
            if path.exists():
                try:
                    self.repo.git.worktree("remove", "--force", str(path))
                except git.GitCommandError:
                    shutil.rmtree(path, ignore_errors=True)
            self.repo.git.worktree("prune")
