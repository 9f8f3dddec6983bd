"""The culprit as a maintainer looks it up: its author date and the files it changed.

The journal keeps only a commit's title and pull request, so these come from the repository
when the report is first written (beside the journal, where the session's repository is) and are
kept in the session directory: a report rendered later elsewhere shows them too.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bisect_npu.report.view import SessionView

CULPRIT_FILE = "culprit.json"
FILES_SHOWN = 30


@dataclass(frozen=True)
class CulpritFacts:
    sha: str
    author_date: str | None = None  # ISO 8601, as git prints it
    files: list[str] = field(default_factory=list)


def culprit_facts(view: SessionView) -> CulpritFacts | None:
    """The culprit's date and files: kept ones, else read from its repository and kept (None: no
    commit culprit, or neither kept nor readable)."""
    end = view.end
    if end is None or end.status != "found" or not end.culprit or view.range.kind != "commits":
        return None
    kept = _kept(view.session_dir, end.culprit)
    if kept is not None:
        return kept
    repo = view.request.range.repo
    if not repo or not Path(repo).is_dir():
        return None
    facts = _from_git(Path(repo), end.culprit)
    if facts is not None:
        with contextlib.suppress(OSError):  # a read-only copy of the session: shown now, read again next time
            (view.session_dir / CULPRIT_FILE).write_text(json.dumps(asdict(facts)) + "\n")
    return facts


def _kept(session_dir: Path, sha: str) -> CulpritFacts | None:
    try:
        raw = json.loads((session_dir / CULPRIT_FILE).read_text())
        facts = CulpritFacts(str(raw["sha"]), raw.get("author_date"), [str(f) for f in raw.get("files", [])])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return facts if facts.sha == sha else None


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _from_git(repo: Path, sha: str) -> CulpritFacts | None:
    date = _git(repo, "show", "-s", "--format=%aI", sha)
    files = _git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", "-m", "--first-parent", sha)
    if date is None or files is None:
        return None
    return CulpritFacts(sha, date.strip() or None, sorted({line for line in files.splitlines() if line}))
