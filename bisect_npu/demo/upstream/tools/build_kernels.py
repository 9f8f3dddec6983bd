"""Compile csrc/ into tinyvllm/_kernels.so (the package's only compiled part).

`python tools/build_kernels.py` builds in place; `pip install -e .` runs the same compile from
setup.py's build_ext.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(str(p) for p in (ROOT / "csrc").glob("*.c"))
TARGET = ROOT / "tinyvllm" / "_kernels.so"


def compile_kernels(target: Path = TARGET) -> int:
    """Link csrc/*.c into the shared library `target`; the compiler's exit code."""
    compiler = os.environ.get("CC", "cc")
    argv = [compiler, "-shared", "-O2", "-fPIC", "-Wall", "-o", str(target), *SOURCES]
    print(" ".join(argv), flush=True)
    result = subprocess.run(argv, check=False)
    if result.returncode != 0:
        print(f"kernel build failed with exit code {result.returncode}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(compile_kernels())
