"""Where bisect-npu keeps what outlives a session: one cache root, `$BISECT_NPU_CACHE` or
`~/.cache/bisect-npu` (repository clones, the package index listing, version venvs, the demo)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("BISECT_NPU_CACHE") or Path.home() / ".cache" / "bisect-npu")
