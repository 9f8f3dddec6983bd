"""Spot a culprit that only bumps version pins (Dockerfile, requirements, pyproject): the regression then
lives in that dependency's range, and the report says to bisect it next."""

from __future__ import annotations

import re

from bisect_npu.fix.gitlog import IGNORABLE_FILE, FileDiff
from bisect_npu.fix_proposals import DependencyNote

# A Dockerfile build argument that pins a dependency by its name: VLLM_TAG, VLLM_COMMIT, MINIVLLM_TAG ...
_PIN_ARG = re.compile(r"^\s*ARG\s+([A-Za-z][A-Za-z0-9_]*?)_(?:TAG|COMMIT|VERSION|REF)\s*=\s*(\S+)")
_REQ_PIN = re.compile(r"""^\s*["']?([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(==|~=|>=|<=|<|>)\s*([^"',;\s]+)""")
_DEPENDENCY_FILE = re.compile(r"(?:^|/)(?:Dockerfile[^/]*|requirements[^/]*\.txt|pyproject\.toml)$")


def dependency_note(diffs: list[FileDiff]) -> DependencyNote | None:
    """A DependencyNote when the culprit changes nothing but version pins (docs and CI aside)."""
    changes: list[tuple[str, str, str]] = []
    files = []
    for fd in diffs:
        path = fd.new_path or fd.old_path or ""
        if IGNORABLE_FILE.search(path):
            continue
        if not _DEPENDENCY_FILE.search(path) or fd.old_path is None or fd.new_path is None:
            return None
        old_pins = _pins([line for h in fd.hunks for line in h.removed])
        new_pins = _pins([line for h in fd.hunks for line in h.added])
        if old_pins is None or new_pins is None or set(old_pins) != set(new_pins):
            return None
        changes.extend((pkg, old_pins[pkg], new_pins[pkg]) for pkg in sorted(old_pins)
                       if old_pins[pkg] != new_pins[pkg])
        files.append(path)
    if not changes:
        return None
    package, old, new = next((c for c in changes if c[0] == "vllm"), changes[0])
    return DependencyNote(package, old, new, files)


def _pins(lines: list[str]) -> dict[str, str] | None:
    """Package -> version of every changed line, or None when a line is not a version pin."""
    pins: dict[str, str] = {}
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        arg = _PIN_ARG.match(line)
        if arg:
            pins[arg[1].lower().replace("_", "-")] = arg[2].strip("\"'")
            continue
        pin = _REQ_PIN.match(line)
        if not pin:
            return None
        pins[pin[1].lower()] = pin[3]
    return pins
