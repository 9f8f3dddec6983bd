"""Fresh venvs with pip, made once and copied: `python -m venv` runs ensurepip (seconds of CPU per
venv), and a copy of one fresh venv is that venv, its links kept and its scripts pointed at the copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def make_seed(path: Path) -> Path:
    """A fresh venv with pip at `path`, as `python -m venv` makes it; the one the copies are made of."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    return path


def copy_venv(seed: Path, dest: Path) -> Path:
    """A copy of the venv `seed` at `dest` (which must not exist): symlinks kept (bin/python stays
    the base interpreter's), and the seed's own path in its scripts (pip's shebang, activate)
    replaced by `dest`, so nothing in the copy runs or installs into the seed."""
    shutil.copytree(seed, dest, symlinks=True)
    old, new = str(seed).encode(), str(dest).encode()
    for script in (dest / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        text = script.read_bytes()
        if old in text:
            script.write_bytes(text.replace(old, new))
    return dest
