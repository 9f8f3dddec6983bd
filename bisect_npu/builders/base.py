"""The builder interface: a commit in, a runnable environment out."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, Field

from bisect_npu.errors import BisectError, InfrastructureError

LOG_TAIL_LINES = 30
# Labels on every image our builders make; the cache prunes by them and the executor checks by them
# that an image name still holds the candidate it runs.
LABEL_COMMIT = "org.bisect-npu.commit"
LABEL_KEY = "org.bisect-npu.key"
LABEL_KIND = "org.bisect-npu.kind"  # full | overlay | dependency
LABEL_PARENT = "org.bisect-npu.parent"  # the image it was built on, for the cache's size accounting
# The kind of a dependency's layer image (an upstream image with a dependency's tree laid in): its
# commit label is the upstream commit, its identity the layer key.
DEPENDENCY_KIND = "dependency"


def layer_tag(key: str) -> str:
    """The tag of the layer image of `key` (an upstream commit with a dependency's tree at one of its
    commits): only a layer of that key is ever given it."""
    return "dep-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", key)[:120]


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, for skip reasons and the report."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


class BuildFailed(BisectError):
    """The candidate cannot be built; the session records a `skip` with the log's tail."""

    def __init__(self, message: str, log_path: Path | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = log_tail


class ImageGone(InfrastructureError):
    """The candidate's image left the container engine between its acquire and its run: removed
    (another session's prune, a user's `rmi`) or its name moved to another image. Not the engine
    failing: acquiring the commit again finds the miss and builds it (or names its image again),
    so the evaluator does that before it stops the session (exit 5)."""


class Environment(BaseModel):
    """Where a candidate runs: a checked-out worktree, a container image, or a virtual environment
    holding one published version of a package (release-level bisection)."""

    kind: Literal["worktree", "image", "venv"]
    commit: str
    build_key: str = ""
    path: str | None = None  # worktree directory (kind == worktree)
    image: str | None = None  # image tag (kind == image)
    python: str | None = None  # interpreter to run the probe with (kind == venv); default: the host's
    # How it was obtained: "built" (full build), "overlay" (python tree on a same-key image), "reused".
    how: Literal["built", "overlay", "reused"] = "built"
    seconds: float = 0.0
    log_path: str | None = None
    # Variables the candidate's own source offers and its runs get (builders/switches.py), under
    # the recipe's environment: VLLM_BATCH_INVARIANT where the candidate has batch-invariant mode.
    run_env: dict[str, str] = Field(default_factory=dict)
    # An overlay on a release's compiled part (builders/release_overlay.py): the compiled inputs
    # (csrc/, CMakeLists.txt, ...) the commit changed since that release, so its verdict may not hold.
    compiled_changes: list[str] = Field(default_factory=list)
    # Directories put before the worktree's on PYTHONPATH (kind == worktree): a dependency's tree
    # at another commit (builders/dependency.py) shadows the one installed.
    python_paths_first: list[str] = Field(default_factory=list)
    # How the venv its runs use got its packages (builders/dated.py's words), for the report's host section.
    venv_made: str = ""


class Builder(Protocol):
    def acquire(self, commit: str, log_dir: Path) -> Environment:
        """Return a runnable environment for `commit`, or raise BuildFailed."""

    def release(self, env: Environment) -> None:
        """Free what `acquire` took that is not cached for later candidates."""

    def close(self) -> None:
        """Free everything still held (cached worktrees, background builds) at the end of a run."""

    def build_key(self, commit: str) -> str | None:
        """The key of the compiled image `commit` shares with other commits (the first of them
        pays a full build, the rest an overlay); None when every commit is its own build."""

    def built_keys(self) -> frozenset[str]:
        """The keys whose compiled image exists already (an earlier session built it): the first
        commit of such a key here costs an overlay, not a full build. Empty when nothing outlives
        a session."""
