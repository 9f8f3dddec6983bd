"""Where bisect-npu keeps what outlives a session: one cache root, `$BISECT_NPU_CACHE` or
`~/.cache/bisect-npu` (repository clones, the package index listing, version venvs, the demo,
the verdict store, the report templates' compiled code)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("BISECT_NPU_CACHE") or Path.home() / ".cache" / "bisect-npu")


def default_verdict_store() -> Path:
    """The verdict store `run` uses unless told otherwise: `$BISECT_NPU_VERDICT_STORE`, else
    `verdicts.sqlite` in the cache root (a file on the host's own disk, shared by its sessions)."""
    named = os.environ.get("BISECT_NPU_VERDICT_STORE")
    return Path(named).resolve() if named else (cache_root() / "verdicts.sqlite").resolve()
