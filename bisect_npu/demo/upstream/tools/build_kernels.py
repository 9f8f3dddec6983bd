"""Compile csrc/ into tinyvllm/_kernels.so (the package's only compiled part)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(str(p) for p in (ROOT / "csrc").glob("*.c"))
TARGET = ROOT / "tinyvllm" / "_kernels.so"


def main() -> int:
    compiler = os.environ.get("CC", "cc")
    argv = [compiler, "-shared", "-O2", "-fPIC", "-Wall", "-o", str(TARGET), *SOURCES]
    print(" ".join(argv), flush=True)
    result = subprocess.run(argv, check=False)
    if result.returncode != 0:
        print(f"kernel build failed with exit code {result.returncode}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
