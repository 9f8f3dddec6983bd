"""A demo case's answer against its manifest: the culprit, and for a case whose culprit moves a
dependency's pin the whole chain the journals hold (the pin move, the dependency's culprit, its fix
and the first tag holding it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_npu.demo.manifest import CaseTruth
from bisect_npu.journal import Journal
from bisect_npu.records import DependencyMoveRecord, EndRecord, FixRecord, NextLevelRecord


@dataclass
class CaseCheck:
    """Each link of the answer: (what, found, expected); the case matches when every link does."""

    links: list[tuple[str, str | None, str]] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return all(found == expected for _, found, expected in self.links)

    def lines(self) -> list[str]:
        return [f"manifest {what}: {_short(expected)} -> "
                f"{'MATCH' if found == expected else f'MISMATCH (got {_short(found)})'}"
                for what, found, expected in self.links]

    def summary(self) -> dict[str, Any]:
        return {what.replace(" ", "_"): {"found": found, "expected": expected} for what, found, expected in self.links}


def _short(value: str | None) -> str | None:
    """A sha as the reports print it; a pin or a tag as written."""
    return value[:12] if value and re.fullmatch(r"[0-9a-f]{40}", value) else value


def _records(session_dir: Path) -> list[Any]:
    journal = Journal.open(session_dir, read_only=True)
    try:
        return list(journal.entries)
    finally:
        journal.close()


def check_case(truth: CaseTruth, session_dir: Path) -> CaseCheck:
    """What the session at `session_dir` (the case's top level) answered, link by link."""
    records = _records(session_dir)
    end = next((r for r in records if isinstance(r, EndRecord)), None)
    check = CaseCheck([("culprit", end.culprit if end else None, truth.culprit.sha)])
    dep = truth.dependency
    if dep is None:
        return check
    move = next((r for r in records if isinstance(r, DependencyMoveRecord) and r.name == dep.name), None)
    check.links.append(("pin move", f"{move.old} -> {move.new}" if move else None, f"{dep.old_pin} -> {dep.new_pin}"))
    below = next((r for r in records if isinstance(r, NextLevelRecord) and r.dependency == dep.name), None)
    check.links.append((f"{dep.name} culprit", below.culprit if below else None, dep.culprit.sha))
    fix = None
    if below is not None:
        fix = next((r for r in _records(Path(below.session)) if isinstance(r, FixRecord)), None)
    best = fix.report.proposals[0].shas[0] if fix and fix.report.proposals else None
    check.links.append((f"{dep.name} fix", best, dep.fix.sha))
    check.links.append((f"{dep.name} fix tag", fix.first_tags.get(best) if fix and best else None, dep.fix_tag))
    return check
