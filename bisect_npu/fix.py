"""Propose the upstream commit that fixes a culprit, with reasons a reviewer can check, and verify it.

Why this shape: in vllm-ascend a fix lands weeks after the culprit, on main or a release branch or
both, often with a title that does not name the culprit. So candidates are every commit after the
culprit on every branch that holds it (or a cherry-pick of it), and each is scored on evidence:
line provenance (it edits the culprit's lines as they have moved since), explicit references,
locality (file, function, tests), a bug-fix tag and the symptom's keywords. Twins (the same fix
cherry-picked to several branches) become one proposal. Everything is read with a handful of
`git log` calls over the whole range, never one call per commit, so 5,000 commits take seconds.

`verify_fixes` cherry-picks a proposal onto the bad end in a throw-away worktree and hands the new
commit to the caller's evaluator (build, probe, oracle), so the proof uses the normal pipeline.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import git

from .build.base import BuildFailed
from .build.local import remove_worktree, sweep_worktrees, sweep_worktrees_of_any_repo
from .history import git_error_line, github_url, is_ancestor, resolve_ref
from .models import InfrastructureError, UsageError, Verdict, VerdictKind
from .paths import cache_root

# Score weights. Strong signals (each alone qualifies a commit) weigh more than all weak signals
# together (4 + 3 + 1.5 + 1.5 + 1.5 + 3 + 1 = 15.5 < 18), so a tag and keywords never outrank a commit
# that edits the culprit's lines or names it. Documented in readme-fix and checked by a test.
WEIGHTS: dict[str, float] = {
    "revert": 30.0,  # Revert "<culprit title>" / This reverts commit <culprit sha>
    "provenance": 20.0,  # changes or deletes lines the culprit added or changed
    "reference": 18.0,  # names the culprit's PR (#N), sha or title
    "proximity": 4.0,  # edits within PROXIMITY_LINES of the culprit's lines, no overlap
    "same_function": 3.0,  # hunk in a function the culprit changed
    "same_file": 1.5,  # touches a file the culprit changed
    "tests": 1.5,  # adds/changes a test that names the touched module or functions
    "tag": 1.5,  # [BugFix], fix: ... in the title
    "symptom": 1.0,  # per distinct symptom keyword, at most SYMPTOM_CAP keywords
    "twins": 1.0,  # present on more than one branch: maintainers thought it worth back-porting
    "in_bad_end": -10.0,  # already contained in the bad end, which is still bad
}
STRONG_SIGNALS = ("revert", "provenance", "reference")
WEAK_SIGNALS = ("proximity", "same_function", "same_file", "tests", "tag", "symptom", "twins")
SYMPTOM_CAP = 3
PROXIMITY_LINES = 3
MIN_TITLE_REFERENCE = 16  # shorter culprit titles are too generic to count as a reference
_GENERIC_FUNCTIONS = frozenset({"__init__", "main", "forward", "setup", "run", "test", "call", "init"})

_PR_SUFFIX = re.compile(r"\(#(\d+)\)\s*$")
_HUNK = re.compile(r"^@@@* -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@@*(.*)$")
_FUNC_NAME = re.compile(r"\b(?:def|class|fn|func|function|void|int|auto)\s+([A-Za-z_]\w*)")
_DEF_LINE = re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)")
_TAG = re.compile(r"\[\s*(?:bug\s*-?\s*fix|hot\s*-?\s*fix|fix(?:es|ed)?|bug)\s*\]|^\s*(?:bug|hot)?fix(?:\([^)]*\))?!?:",
                  re.IGNORECASE)
_LEADING_TAGS = re.compile(r"^(?:\s*\[[^\]]*\])+\s*")
_VERSION_TAG = re.compile(r"\[\s*(?:v?\d+(?:\.\d+)+\S*|main|[\w.-]*-dev|release[\w.-]*)\s*\]", re.IGNORECASE)
_REVERT_TITLE = re.compile(r'^Revert\s+"(.+)"(?:\s*\(#\d+\))?\s*$')
_REVERTS_COMMIT = re.compile(r"This reverts commit ([0-9a-f]{7,40})", re.IGNORECASE)
_CHERRY_PICKED = re.compile(r"cherry picked from commit ([0-9a-f]{7,40})", re.IGNORECASE)
_HEX_WORD = re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{7,40}(?![0-9a-zA-Z])")
_TEST_PATH = re.compile(r"(?:^|/)tests?/|(?:^|/)test_[^/]*$|_test\.\w+$")
_WORD = re.compile(r"\w+")
# Test files whose added lines can name a module or function (not the data files tests keep).
_TEST_SOURCE = re.compile(r"\.(?:py|pyi|c|cc|cpp|h|hpp|sh|ya?ml|json|toml)$")
_VLLM_TAG = re.compile(r"^\s*ARG\s+VLLM_TAG\s*=\s*(\S+)")
_REQ_PIN = re.compile(r"""^\s*["']?([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(==|~=|>=|<=|<|>)\s*([^"',;\s]+)""")
_DEPENDENCY_FILE = re.compile(r"(?:^|/)(?:Dockerfile[^/]*|requirements[^/]*\.txt|pyproject\.toml)$")
_IGNORABLE_FILE = re.compile(r"^\.github/|^docs?/|\.md$|\.rst$")


# --------------------------------------------------------------------------------------- results

@dataclass(frozen=True)
class Reason:
    """One piece of evidence for a proposal, in words a reviewer can check."""

    signal: str
    detail: str
    weight: float


@dataclass
class FixProposal:
    """One fix, possibly cherry-picked to several branches (all its shas and branches listed)."""

    shas: list[str]
    branches: list[str]
    title: str
    pr: int | None
    score: float
    reasons: list[Reason]
    pr_url: str | None = None
    date: int = 0  # commit time (epoch seconds) of the earliest sha: the tie-breaker
    missing_on: list[str] = field(default_factory=list)  # branches with the culprit but not this fix
    sha_branches: dict[str, list[str]] = field(default_factory=dict)  # each twin sha -> branches holding it


@dataclass(frozen=True)
class DependencyNote:
    """The culprit only bumps a dependency: the regression lives in that dependency's range."""

    package: str
    old: str
    new: str
    files: list[str]

    @property
    def message(self) -> str:
        return (f"the regression comes from the dependency: bisect {self.package} "
                f"between {self.old} and {self.new} next")


@dataclass(frozen=True)
class CulpritTwin:
    """A cherry-pick of the culprit on a branch that does not hold the culprit itself."""

    sha: str
    branches: list[str]
    fixed: bool  # some proposal reaches this twin's branches


@dataclass
class FixReport:
    culprit: str
    proposals: list[FixProposal]
    dependency: DependencyNote | None
    note: str
    twins: list[CulpritTwin] = field(default_factory=list)
    tips: dict[str, str] = field(default_factory=dict)  # branch -> sha searched


@dataclass(frozen=True)
class AppliedFix:
    """The fix cherry-picked onto the bad end: `sha` is a new commit the pipeline can evaluate."""

    sha: str
    bad: str
    fix_shas: list[str]


@dataclass(frozen=True)
class ApplyConflict:
    fix_shas: list[str]
    files: list[str]

    @property
    def message(self) -> str:
        return f"does not apply cleanly: conflicts in {', '.join(self.files) or 'the index'}"


@dataclass(frozen=True)
class AlreadyApplied:
    fix_shas: list[str]
    bad: str

    @property
    def message(self) -> str:
        return "already in the bad end"


FixStatus = Literal["verified", "not_verified", "conflict", "already_applied", "build_failed"]


@dataclass
class FixVerification:
    proposal: FixProposal
    status: FixStatus
    verdict: Verdict | None = None
    applied_sha: str | None = None
    conflict_files: list[str] = field(default_factory=list)
    detail: str = ""


# ---------------------------------------------------------------------------------- git parsing

@dataclass
class _Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)


@dataclass
class _FileDiff:
    old_path: str | None  # None: file created
    new_path: str | None  # None: file deleted
    hunks: list[_Hunk] = field(default_factory=list)


@dataclass
class _Commit:
    sha: str
    parents: list[str]
    time: int
    message: str
    changes: list[tuple[str, str | None, str | None]] = field(default_factory=list)  # status, old, new

    @property
    def title(self) -> str:
        return self.message.split("\n", 1)[0].strip()


_META_FORMAT = "%x1e%H%x1f%P%x1f%ct%x1f%B%x1f"
_DIFF_FORMAT = "%x1e%H"
_COMMON = ("-c", "core.quotePath=false")


def _git(repo: git.Repo, *args: str) -> str:
    """Run a read-only git command; a failure is the clone's (objects a partial or shallow clone
    never fetched), said in one line with what to do, not a traceback."""
    try:
        return repo.git.execute(["git", *_COMMON, *args], strip_newline_in_stdout=False)
    except git.GitCommandError as exc:
        raise InfrastructureError(
            f"git {args[0]} failed in {repo.git_dir}: {git_error_line(exc)}; if the clone is partial "
            "(--filter) or shallow, fetch what it lacks (`git fetch --unshallow`, or clone it whole) "
            "and run again") from None


def _parse_meta(text: str) -> list[_Commit]:
    commits = []
    for record in text.split("\x1e")[1:]:
        sha, parents, ctime, message, rest = record.split("\x1f", 4)
        commit = _Commit(sha, parents.split(), int(ctime), message.strip())
        for line in rest.splitlines():
            parts = line.split("\t")
            if len(parts) < 2 or not parts[0]:
                continue
            status = parts[0][0]
            if status in "RC" and len(parts) >= 3:
                commit.changes.append((status, parts[1], parts[2]))
            elif status == "A":
                commit.changes.append((status, None, parts[1]))
            elif status == "D":
                commit.changes.append((status, parts[1], None))
            else:
                commit.changes.append((status, parts[1], parts[1]))
        commits.append(commit)
    return commits


def _parse_diffs(text: str) -> dict[str, list[_FileDiff]]:
    """`git log -U0 --format=%x1e%H` output -> {sha: [file diffs]}."""
    result: dict[str, list[_FileDiff]] = {}
    for record in text.split("\x1e")[1:]:
        lines = record.split("\n")
        files: list[_FileDiff] = []
        result[lines[0].strip()] = files
        current: _FileDiff | None = None
        hunk: _Hunk | None = None
        for line in lines[1:]:
            if line.startswith("diff --git ") or line.startswith("diff --cc "):
                current, hunk = _FileDiff(None, None), None
                files.append(current)
                current.old_path, current.new_path = _paths_from_diff_line(line)
            elif current is None:
                continue
            elif hunk is None and line.startswith("rename from "):
                current.old_path = line[len("rename from "):]
            elif hunk is None and line.startswith("rename to "):
                current.new_path = line[len("rename to "):]
            elif hunk is None and line.startswith("new file mode"):
                current.old_path = None
            elif hunk is None and line.startswith("deleted file mode"):
                current.new_path = None
            elif hunk is None and line.startswith("--- "):
                current.old_path = None if line == "--- /dev/null" else _strip_prefix(line[4:])
            elif hunk is None and line.startswith("+++ "):
                current.new_path = None if line == "+++ /dev/null" else _strip_prefix(line[4:])
            elif line.startswith("@@"):
                match = _HUNK.match(line)
                if match:
                    old_len = 1 if match[2] is None else int(match[2])
                    new_len = 1 if match[4] is None else int(match[4])
                    hunk = _Hunk(int(match[1]), old_len, int(match[3]), new_len, match[5].strip())
                    current.hunks.append(hunk)
            elif hunk is not None and line.startswith("-"):
                hunk.removed.append(line[1:])
            elif hunk is not None and line.startswith("+"):
                hunk.added.append(line[1:])
    return result


def _paths_from_diff_line(line: str) -> tuple[str | None, str | None]:
    rest = line.split(" ", 2)[2] if line.count(" ") >= 2 else ""
    if rest.startswith("a/") and " b/" in rest:
        old, new = rest[2:].split(" b/", 1)
        return old, new
    return rest or None, rest or None


def _strip_prefix(path: str) -> str:
    path = path.rstrip("\t")
    return path[2:] if path[:2] in ("a/", "b/") else path


# -------------------------------------------------------------------------------- line tracking

@dataclass(frozen=True)
class _Tracked:
    """The culprit's lines in one file version: line numbers, and gaps where it deleted lines."""

    lines: tuple[int, ...]
    gaps: tuple[int, ...]  # gap g: between line g and g+1 (the culprit deleted lines there)

    def __bool__(self) -> bool:
        return bool(self.lines or self.gaps)


@dataclass
class _LineHit:
    changed: int = 0  # culprit lines this commit changed or deleted
    restored: int = 0  # culprit deletion gaps this commit inserted lines into
    near: int = 0  # hunks within PROXIMITY_LINES of a culprit line


def _culprit_tracked(diffs: list[_FileDiff]) -> dict[str, _Tracked]:
    tracked: dict[str, _Tracked] = {}
    for diff in diffs:
        if diff.new_path is None or _IGNORABLE_FILE.search(diff.new_path):
            continue  # a later edit of the same docs or CI line says nothing about the regression
        lines: list[int] = []
        gaps: list[int] = []
        for hunk in diff.hunks:
            if hunk.new_len:
                lines.extend(range(hunk.new_start, hunk.new_start + hunk.new_len))
            elif hunk.old_len:
                gaps.append(hunk.new_start)
        if lines or gaps:
            tracked[diff.new_path] = _Tracked(tuple(lines), tuple(gaps))
    return tracked


def _map_through(tracked: _Tracked, hunks: list[_Hunk], hit: _LineHit) -> _Tracked:
    """Move the culprit's lines through one diff (-U0 hunks), counting the ones it touches."""
    shifts = []  # (threshold, delta): lines >= threshold move by delta
    removed: list[tuple[int, int]] = []
    for h in hunks:
        if h.old_len:
            removed.append((h.old_start, h.old_start + h.old_len))
            shifts.append((h.old_start + h.old_len, h.new_len - h.old_len))
        else:
            shifts.append((h.old_start + 1, h.new_len))

    def moved(line: int) -> int:
        return line + sum(delta for threshold, delta in shifts if line >= threshold)

    lines = []
    for line in tracked.lines:
        if any(lo <= line < hi for lo, hi in removed):
            hit.changed += 1
        else:
            lines.append(moved(line))
    gaps = []
    for gap in tracked.gaps:
        if any(h.old_len == 0 and h.old_start == gap for h in hunks) or any(lo <= gap < hi - 1 for lo, hi in removed):
            hit.restored += 1
        else:
            gaps.append(moved(gap))
    if not hit.changed and not hit.restored:
        positions = list(tracked.lines) + list(tracked.gaps)
        for h in hunks:
            lo, hi = h.old_start - PROXIMITY_LINES, h.old_start + max(h.old_len, 1) + PROXIMITY_LINES
            if any(lo <= p <= hi for p in positions):
                hit.near += 1
    return _Tracked(tuple(lines), tuple(gaps))


# ------------------------------------------------------------------------------------ proposals

@dataclass
class _Anchor:
    """The culprit, or one of its cherry-picks, with what the signals compare against."""

    commit: _Commit
    diffs: list[_FileDiff]
    refs: list[str]  # refs (full names) that contain it

    @cached_property
    def plain_title(self) -> str:
        return normalize_title(self.commit.title)

    @cached_property
    def pr(self) -> int | None:
        return _pr_number(self.commit.title)

    @property
    def paths(self) -> set[str]:
        return {p for d in self.diffs for p in (d.old_path, d.new_path) if p}

    @cached_property
    def functions(self) -> set[str]:
        """Functions it changed: hunk-header context (`@@ ... @@ def foo`) and definitions it edited."""
        found: set[str] = set()
        for hunk in (h for d in self.diffs for h in d.hunks):
            found.update(_FUNC_NAME.findall(hunk.header))
            found.update(m[1] for text in hunk.added + hunk.removed if (m := _DEF_LINE.match(text)))
        return found


@dataclass
class _Candidate:
    commit: _Commit
    reasons: dict[str, Reason] = field(default_factory=dict)

    def add(self, signal: str, detail: str, weight: float | None = None) -> None:
        weight = WEIGHTS[signal] if weight is None else weight
        old = self.reasons.get(signal)
        if old is None or weight > old.weight:
            self.reasons[signal] = Reason(signal, detail, weight)

    @property
    def qualifies(self) -> bool:
        """Strong evidence, or locality backed by the symptom or a bug-fix tag."""
        signals = self.reasons.keys()
        if any(s in signals for s in STRONG_SIGNALS):
            return True
        if "proximity" in signals:
            return "symptom" in signals or "tag" in signals
        return "same_function" in signals and "symptom" in signals


def propose_fixes(
    repo: git.Repo,
    culprit: str,
    *,
    bad: str | None = None,
    symptom: Sequence[str] = (),
    evidence_keywords: Sequence[str] = (),
    top: int = 5,
) -> FixReport:
    """Rank the later commits that fix `culprit`, strongest evidence first (see WEIGHTS)."""
    culprit_sha = resolve_ref(repo, culprit)
    bad_sha = resolve_ref(repo, bad) if bad else None
    keywords = _keywords([*symptom, *evidence_keywords])
    refs = _branch_refs(repo)
    culprit_commit, culprit_diffs = _show(repo, culprit_sha)
    dependency = _dependency_note(culprit_diffs)

    containing = _refs_containing(repo, culprit_sha, refs)
    anchors = [_Anchor(culprit_commit, culprit_diffs, containing)]
    twin_shas = _find_twins(repo, culprit_commit, culprit_diffs, [r for r in refs if r not in containing])
    for sha in twin_shas:
        commit, diffs = _show(repo, sha)
        anchors.append(_Anchor(commit, diffs, _refs_containing(repo, sha, refs)))
    excluded = {culprit_sha, *twin_shas}

    candidates: dict[str, _Candidate] = {}
    for anchor in anchors:
        tips = anchor.refs + ([bad_sha] if bad_sha and anchor is anchors[0] and not anchor.refs else [])
        if not tips:
            continue
        for cand in _score_anchor(repo, anchor, anchors, tips, keywords, excluded):
            known = candidates.setdefault(cand.commit.sha, _Candidate(cand.commit))
            for reason in cand.reasons.values():
                known.add(reason.signal, reason.detail, reason.weight)

    qualified = [c for c in candidates.values() if c.qualifies]
    in_bad = _reachable(repo, bad_sha, culprit_sha) if bad_sha else set()
    proposals = _group_twins(repo, qualified, refs, in_bad, bad)
    all_anchor_refs = sorted({r for a in anchors for r in a.refs})
    base = github_url(repo)
    for proposal in proposals:
        proposal.missing_on = [_short(r) for r in all_anchor_refs if _short(r) not in proposal.branches]
        proposal.pr_url = f"{base}/pull/{proposal.pr}" if base and proposal.pr else None
    # Ties: a fix on a branch holding the commit the user named before one only on a twin's branch
    # (each branch's revert of its own copy scores the same), then the older fix.
    own = {_short(r) for r in anchors[0].refs}
    proposals.sort(key=lambda p: (-p.score, not own & set(p.branches), p.date, p.shas[0]))
    proposals = proposals[:top] if top > 0 else proposals

    twins = [
        CulpritTwin(a.commit.sha, [_short(r) for r in a.refs],
                    fixed=any(set(map(_short, a.refs)) & set(p.branches) for p in proposals))
        for a in anchors[1:]
    ]
    branch_tips = {_short(r): refs[r] for r in all_anchor_refs}
    return FixReport(culprit_sha, proposals, dependency, _note(proposals, dependency, twins, branch_tips), twins,
                     branch_tips)


def _note(proposals: list[FixProposal], dependency: DependencyNote | None,
          twins: list[CulpritTwin], tips: dict[str, str]) -> str:
    parts = [dependency.message] if dependency else []
    if proposals:
        best = proposals[0]
        parts.append(f"{len(proposals)} proposal(s); best: {best.shas[0][:10]} {best.title} "
                     f"(score {best.score:g}, on {', '.join(best.branches) or 'no branch'})")
    else:
        as_of = ", ".join(f"{name}@{sha[:10]}" for name, sha in sorted(tips.items())) or "no branch holds it"
        parts.append(f"no later commit touches the culprit's lines or names it; "
                     f"no fix found upstream as of {as_of}")
    for twin in twins:
        if not twin.fixed:
            parts.append(f"the culprit was cherry-picked to {', '.join(twin.branches)} as {twin.sha[:10]}: "
                         f"the fix is needed there too")
    return "; ".join(parts)


def _keywords(words: Iterable[str]) -> list[tuple[str, re.Pattern[str]]]:
    seen: dict[str, re.Pattern[str]] = {}
    for word in words:
        word = word.strip().lower()
        if len(word) >= 3 and word not in seen:
            seen[word] = re.compile(rf"(?<![a-z0-9]){re.escape(word)}(?![a-z0-9])", re.IGNORECASE)
    return list(seen.items())


def _branch_refs(repo: git.Repo) -> dict[str, str]:
    """Local and remote branches (full ref name -> sha), without symbolic refs like origin/HEAD, and
    without `origin/X` when the local `X` is at the same commit (it would only repeat the name)."""
    out = _git(repo, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)",
               "refs/heads", "refs/remotes")
    refs = {}
    for line in out.splitlines():
        name, sha, symref = line.split("\0")
        if not symref:
            refs[name] = sha
    local = {name.removeprefix("refs/heads/"): sha for name, sha in refs.items() if name.startswith("refs/heads/")}
    return {name: sha for name, sha in refs.items()
            if not (name.startswith("refs/remotes/") and local.get(name.split("/", 3)[-1]) == sha)}


def _refs_containing(repo: git.Repo, sha: str, refs: dict[str, str]) -> list[str]:
    out = _git(repo, "for-each-ref", "--contains", sha, "--format=%(refname)", "refs/heads", "refs/remotes")
    return sorted(name for name in out.split() if name in refs)


def _default_branch(repo: git.Repo, refs: dict[str, str]) -> str | None:
    """Short name of the default branch: what origin/HEAD points at, else main, else master."""
    try:
        target = repo.git.symbolic_ref("--quiet", "refs/remotes/origin/HEAD").strip()
    except git.GitCommandError:
        target = ""
    for ref in (target, "refs/heads/main", "refs/remotes/origin/main", "refs/heads/master",
                "refs/remotes/origin/master"):
        if ref in refs:
            return _short(ref)
    return None


def _short(ref: str) -> str:
    return ref.removeprefix("refs/heads/").removeprefix("refs/remotes/")


def _show(repo: git.Repo, sha: str) -> tuple[_Commit, list[_FileDiff]]:
    meta = _parse_meta(_git(repo, "log", "-1", "-M", "--name-status", f"--format={_META_FORMAT}", sha))[0]
    diffs = _parse_diffs(_git(repo, "log", "-1", "-M", "-U0", f"--format={_DIFF_FORMAT}", sha))
    return meta, diffs.get(sha, [])


def _reachable(repo: git.Repo, tip: str, exclude: str) -> set[str]:
    return set(_git(repo, "rev-list", tip, "--not", exclude).split())


def normalize_title(title: str) -> str:
    """Title without branch tags, a leading tag block and `(#N)`: equal across cherry-picks."""
    title = _PR_SUFFIX.sub("", _VERSION_TAG.sub("", title))
    title = _LEADING_TAGS.sub("", title)
    return re.sub(r"\s+", " ", title).strip().lower()


def patch_ids(repo: git.Repo, shas: Iterable[str]) -> dict[str, str]:
    """`git patch-id --stable` of many commits in two processes: equal for the same change on another base."""
    wanted = "".join(f"{sha}\n" for sha in shas)
    if not wanted:
        return {}
    base = ["git", "--git-dir", repo.git_dir]
    diffs = subprocess.run([*base, "diff-tree", "--stdin", "-p", "--no-color"], input=wanted.encode(),
                           capture_output=True, check=False).stdout
    out = subprocess.run([*base, "patch-id", "--stable"], input=diffs, capture_output=True, check=False).stdout
    return {commit: pid for pid, commit in (line.split() for line in out.decode().splitlines() if line.strip())}


def _find_twins(repo: git.Repo, culprit: _Commit, diffs: list[_FileDiff], other_refs: list[str]) -> list[str]:
    """Cherry-picks of the culprit on branches that do not contain it: same title, patch-id or -x line."""
    if not other_refs:
        return []
    # No date filter: a back-port is often a new PR, so the original on main can be the older commit.
    meta = _parse_meta(_git(repo, "log", "--name-status", "-M", f"--format={_META_FORMAT}",
                            *other_refs, "--not", culprit.sha))
    wanted_title = normalize_title(culprit.title)
    culprit_paths = {d.new_path or d.old_path for d in diffs}
    twins = []
    same_paths = []
    for commit in meta:
        picked = [m for m in _CHERRY_PICKED.findall(commit.message) if culprit.sha.startswith(m)]
        if picked or (wanted_title and normalize_title(commit.title) == wanted_title):
            twins.append(commit.sha)
        elif {new or old for _, old, new in commit.changes} == culprit_paths:
            same_paths.append(commit.sha)
    if same_paths:
        ids = patch_ids(repo, [culprit.sha, *same_paths])
        twins += [sha for sha in same_paths if ids.get(culprit.sha) and ids.get(sha) == ids[culprit.sha]]
    return twins


def _score_anchor(repo: git.Repo, anchor: _Anchor, anchors: list[_Anchor], tips: list[str],
                  keywords: list[tuple[str, re.Pattern[str]]], excluded: set[str]) -> list[_Candidate]:
    """Score every commit after `anchor` on `tips` against it (and name references to any anchor)."""
    meta = _parse_meta(_git(repo, "log", "--reverse", "--topo-order", "-M", "--name-status",
                            f"--format={_META_FORMAT}", *tips, "--not", anchor.commit.sha))
    meta = [c for c in meta if c.sha not in excluded]
    paths = _follow_renames(anchor.paths, meta)
    diffs = _parse_diffs(_git(repo, "log", "--reverse", "--topo-order", "-M", "--full-history",
                              "--diff-merges=first-parent", "-U0", f"--format={_DIFF_FORMAT}",
                              *tips, "--not", anchor.commit.sha, "--", *sorted(paths))) if paths else {}
    test_diffs = _test_diffs(repo, meta, paths)
    hits = _line_hits(anchor, meta, diffs)
    all_functions = anchor.functions
    modules = {_module_name(p) for p in anchor.paths if p.endswith(".py")}

    candidates = []
    for commit in meta:
        cand = _Candidate(commit)
        _reference_signals(cand, anchors)
        hit = hits.get(commit.sha)
        if hit and (hit.changed or hit.restored):
            what = []
            if hit.changed:
                what.append(f"changes {hit.changed} line(s) the culprit wrote")
            if hit.restored:
                what.append(f"re-adds lines where the culprit deleted {hit.restored} block(s)")
            cand.add("provenance", "; ".join(what) + f" (blamed forward from {anchor.commit.sha[:10]})")
        elif hit and hit.near:
            cand.add("proximity", f"edits within {PROXIMITY_LINES} lines of the culprit's lines "
                                  f"({hit.near} hunk(s))")
        touched = sorted({p for _, old, new in commit.changes for p in (old, new) if p and p in paths})
        if touched:
            cand.add("same_file", f"touches {', '.join(touched[:3])}")
        same_funcs = sorted({name for fd in diffs.get(commit.sha, []) for h in fd.hunks
                             for name in _FUNC_NAME.findall(h.header) if name in all_functions})
        if same_funcs:
            cand.add("same_function", f"changes {', '.join(same_funcs[:3])}, which the culprit changed")
        mentioned = _test_mentions(test_diffs.get(commit.sha, []), modules, all_functions)
        if mentioned:
            cand.add("tests", f"adds tests naming {', '.join(mentioned[:3])}")
        if _TAG.search(commit.title):
            cand.add("tag", f"bug-fix tag in the title: {commit.title[:60]!r}")
        found = _symptom_hits(commit, diffs.get(commit.sha, []) + test_diffs.get(commit.sha, []), keywords)
        if found:
            cand.add("symptom", f"mentions {', '.join(found)}",
                     WEIGHTS["symptom"] * min(len(found), SYMPTOM_CAP))
        if cand.reasons:
            candidates.append(cand)
    return candidates


def _follow_renames(paths: set[str], meta: list[_Commit]) -> set[str]:
    followed = set(paths)
    for commit in meta:
        for status, old, new in commit.changes:
            if status in "RC" and old in followed and new:
                followed.add(new)
    return followed


def _line_hits(anchor: _Anchor, meta: list[_Commit], diffs: dict[str, list[_FileDiff]]) -> dict[str, _LineHit]:
    """Blame forward: carry the culprit's lines through every later commit (parents first)."""
    start = _culprit_tracked(anchor.diffs)
    states: dict[str, dict[str, _Tracked]] = {anchor.commit.sha: start}
    hits: dict[str, _LineHit] = {}
    for commit in meta:
        parent = next((p for p in commit.parents if p in states), None)
        base = states[parent] if parent else {}
        file_diffs = diffs.get(commit.sha) if parent == (commit.parents[0] if commit.parents else None) else None
        if not file_diffs or not base:
            states[commit.sha] = base
            continue
        state = dict(base)
        hit = _LineHit()
        for fd in file_diffs:
            tracked = state.get(fd.old_path) if fd.old_path else None
            if tracked is None:
                continue
            assert fd.old_path is not None  # tracked is only found under an old path
            del state[fd.old_path]
            if fd.new_path is None:
                hit.changed += len(tracked.lines)
                continue
            moved = _map_through(tracked, fd.hunks, hit)
            if moved:
                state[fd.new_path] = moved
        states[commit.sha] = state
        if hit.changed or hit.restored or hit.near:
            hits[commit.sha] = hit
    return hits


def _test_diffs(repo: git.Repo, meta: list[_Commit], paths: set[str]) -> dict[str, list[_FileDiff]]:
    """Diffs of the test files later commits add or change (only those commits, in a few calls)."""
    wanted: dict[str, set[str]] = {}
    for commit in meta:
        tests = {new for status, _, new in commit.changes
                 if new and status != "D" and _TEST_PATH.search(new) and _TEST_SOURCE.search(new)}
        tests -= paths
        if tests:
            wanted[commit.sha] = tests
    result: dict[str, list[_FileDiff]] = {}
    shas = list(wanted)
    for start in range(0, len(shas), 500):
        batch = shas[start:start + 500]
        test_paths = sorted({p for sha in batch for p in wanted[sha]})
        out = _git(repo, "show", "-U0", "--diff-merges=first-parent", f"--format={_DIFF_FORMAT}",
                   *batch, "--", *test_paths)
        for sha, files in _parse_diffs(out).items():
            result[sha] = [f for f in files if (f.new_path or "") in wanted.get(sha, ())]
    return result


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _test_mentions(files: list[_FileDiff], modules: set[str], functions: set[str]) -> list[str]:
    text = "\n".join(line for f in files for h in f.hunks for line in h.added)
    if not text:
        return []
    names = [m for m in sorted(modules) if m and m in text]
    words = set(_WORD.findall(text))  # one pass over the text, not one regex per name (big culprits)
    names += [f for f in sorted(functions) if f not in _GENERIC_FUNCTIONS and len(f) >= 4
              and (f in words if _WORD.fullmatch(f) else re.search(rf"\b{re.escape(f)}\b", text))]
    return names


def _symptom_hits(commit: _Commit, diffs: list[_FileDiff],
                  keywords: list[tuple[str, re.Pattern[str]]]) -> list[str]:
    if not keywords:
        return []
    diff_text = "\n".join(line for f in diffs for h in f.hunks for line in (h.header, *h.added, *h.removed))
    text = commit.message + "\n" + diff_text
    return [word for word, pattern in keywords if pattern.search(text)]


def _reference_signals(cand: _Candidate, anchors: list[_Anchor]) -> None:
    """Revert and reference signals; cheap substring checks first, since this runs for every commit."""
    message = cand.commit.message
    lowered = message.lower()
    revert = _REVERT_TITLE.match(cand.commit.title)
    reverted = normalize_title(revert[1]) if revert else None
    reverts_shas = _REVERTS_COMMIT.findall(message) if "reverts commit" in lowered else []
    hex_words = _HEX_WORD.findall(lowered)
    own_title = normalize_title(cand.commit.title)
    for anchor in anchors:
        target, short, plain = anchor.commit, anchor.commit.sha[:10], anchor.plain_title
        if reverted is not None and reverted == plain:
            cand.add("revert", f'reverts "{target.title}" ({short})')
        for sha in reverts_shas:
            if target.sha.startswith(sha.lower()):
                cand.add("revert", f"says 'This reverts commit {sha}' ({short})")
        pr = anchor.pr
        if pr is not None and str(pr) in message:
            fixes = re.search(rf"(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?)\s*:?\s*#{pr}\b", message, re.IGNORECASE)
            if fixes:
                cand.add("reference", f"says {fixes[0]!r} (the culprit's PR)")
            elif re.search(rf"(?<![\w/])#{pr}\b|/pull/{pr}\b", message):
                cand.add("reference", f"names the culprit's PR #{pr}")
        if any(target.sha.startswith(word) for word in hex_words):
            cand.add("reference", f"names the culprit's sha {short}")
        if (len(plain) >= MIN_TITLE_REFERENCE and revert is None and own_title != plain
                and plain[:MIN_TITLE_REFERENCE] in lowered and plain in re.sub(r"\s+", " ", lowered)):
            cand.add("reference", f'quotes the culprit\'s title "{target.title}"')


def _pr_number(title: str) -> int | None:
    match = _PR_SUFFIX.search(title)
    return int(match[1]) if match else None


def _group_twins(repo: git.Repo, qualified: list[_Candidate], refs: dict[str, str],
                 in_bad: set[str], bad: str | None) -> list[FixProposal]:
    """One proposal per change: candidates with the same normalized title or patch-id merge."""
    parent = {c.commit.sha: c.commit.sha for c in qualified}

    def root(sha: str) -> str:
        while parent[sha] != sha:
            sha = parent[sha]
        return sha

    by_key: dict[tuple[str, str], str] = {}
    ids = patch_ids(repo, [c.commit.sha for c in qualified]) if len(qualified) > 1 else {}
    for cand in qualified:
        keys = [("title", normalize_title(cand.commit.title))]
        pid = ids.get(cand.commit.sha)
        if pid:
            keys.append(("patch", pid))
        for key in keys:
            if not key[1]:
                continue
            if key in by_key:
                parent[root(cand.commit.sha)] = root(by_key[key])
            else:
                by_key[key] = cand.commit.sha
    groups: dict[str, list[_Candidate]] = {}
    for cand in qualified:
        groups.setdefault(root(cand.commit.sha), []).append(cand)

    default = _default_branch(repo, refs)
    proposals = []
    for members in groups.values():
        members.sort(key=lambda c: (c.commit.time, c.commit.sha))
        best: dict[str, Reason] = {}
        for member in members:
            for signal, reason in member.reasons.items():
                if signal not in best or reason.weight > best[signal].weight:
                    best[signal] = reason
        where = {m.commit.sha: sorted(_short(r) for r in _refs_containing(repo, m.commit.sha, refs)) for m in members}
        branches = sorted({b for names in where.values() for b in names})
        if len(branches) > 1 and len(members) > 1:
            best["twins"] = Reason("twins", f"the same change is on {len(branches)} branches: "
                                            f"{', '.join(branches)}", WEIGHTS["twins"])
        if in_bad and all(m.commit.sha in in_bad for m in members):
            best["in_bad_end"] = Reason("in_bad_end", f"already contained in the bad end {bad}, "
                                                      f"which is still bad: at most a partial fix",
                                        WEIGHTS["in_bad_end"])
        reasons = sorted(best.values(), key=lambda r: (-r.weight, r.signal))
        # Name the change by its upstream PR (the member on the default branch) when it has one.
        named = next((m.commit for m in members if default in where[m.commit.sha]), members[0].commit)
        proposals.append(FixProposal(
            shas=[named.sha] + [m.commit.sha for m in members if m.commit is not named],
            branches=branches, title=named.title,
            pr=_pr_number(named.title), score=round(sum(r.weight for r in reasons), 3),
            reasons=reasons, date=members[0].commit.time, sha_branches=where))
    return proposals


# ----------------------------------------------------------------------------------- dependency

def _dependency_note(diffs: list[_FileDiff]) -> DependencyNote | None:
    """A DependencyNote when the culprit changes nothing but version pins (docs and CI aside)."""
    changes: list[tuple[str, str, str]] = []
    files = []
    for fd in diffs:
        path = fd.new_path or fd.old_path or ""
        if _IGNORABLE_FILE.search(path):
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
        tag = _VLLM_TAG.match(line)
        if tag:
            pins["vllm"] = tag[1].strip("\"'")
            continue
        pin = _REQ_PIN.match(line)
        if not pin:
            return None
        pins[pin[1].lower()] = pin[3]
    return pins


# ------------------------------------------------------------------------------ apply and verify

ApplyResult = AppliedFix | ApplyConflict | AlreadyApplied


@contextlib.contextmanager
def verification_scratch(repo: git.Repo) -> Iterator[Path]:
    """A directory for one `fix --verify` run's worktrees and session, under the cache: each run
    first sweeps what runs killed before it left (their process is gone), then its own at the end."""
    base = cache_root() / "fix-verify"
    base.mkdir(parents=True, exist_ok=True)
    # This host's runs only: a cache shared over NFS also holds other machines' live runs.
    host = re.sub(r"[^\w.]", "_", socket.gethostname()) + "--"
    for stale in base.iterdir():
        if stale.name.startswith(host) and not _process_alive(stale.name[len(host):].split("-", 1)[0]):
            sweep_worktrees_of_any_repo(stale)  # the killed run may have verified on another clone
            sweep_worktrees(repo, stale)
            shutil.rmtree(stale, ignore_errors=True)
    scratch = base / f"{host}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        yield scratch
    finally:
        sweep_worktrees(repo, scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def _process_alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


APPLY_NAME = re.compile(r"apply-[0-9a-f]{10}-[0-9a-f]{8}")  # apply_fix's worktrees


def apply_fix(repo: git.Repo, bad: str, fix_shas: list[str], workdir: Path) -> ApplyResult:
    """Cherry-pick `fix_shas` onto `bad` in a fresh detached worktree under `workdir`.

    The user's checkout is never touched. The new commit stays in the object database (kept alive
    by `refs/bisect-npu/fixes/<sha>`) so the build and execute rooms can treat it like any candidate.
    """
    bad_sha = resolve_ref(repo, bad)
    shas = [resolve_ref(repo, s) for s in fix_shas]
    if not shas:
        raise UsageError("no fix commit to apply; pass at least one sha")
    pending = [s for s in shas if not is_ancestor(repo, s, bad_sha)]
    if not pending:
        return AlreadyApplied(shas, bad_sha)
    workdir.mkdir(parents=True, exist_ok=True)
    tree = workdir / f"apply-{bad_sha[:10]}-{uuid.uuid4().hex[:8]}"
    try:
        repo.git.worktree("add", "--detach", "--quiet", str(tree), bad_sha)
    except git.GitCommandError as exc:
        raise InfrastructureError(f"cannot create a worktree under {workdir}: {git_error_line(exc)}; "
                                  f"check free disk and permissions") from None
    wt = git.Repo(tree)
    identity = _identity_args(repo)
    try:
        for sha in pending:
            conflict = _cherry_pick(wt, sha, identity)
            if conflict is not None:
                return ApplyConflict(shas, conflict)
        head = wt.git.rev_parse("HEAD")
    finally:
        wt.close()
        remove_worktree(repo, tree)
    if head == bad_sha:
        return AlreadyApplied(shas, bad_sha)
    repo.git.update_ref(f"refs/bisect-npu/fixes/{head}", head)
    return AppliedFix(head, bad_sha, shas)


def _cherry_pick(wt: git.Repo, sha: str, identity: list[str]) -> list[str] | None:
    """Apply one commit; None when applied (or already present), else the conflicted files."""
    parents = wt.git.log("-1", "--format=%P", sha).split()
    mainline = ["-m", "1"] if len(parents) > 1 else []
    try:
        wt.git.execute(["git", *identity, "cherry-pick", "-x", "--no-edit", *mainline, sha])
        return None
    except git.GitCommandError:
        conflicted = wt.git.diff("--name-only", "--diff-filter=U").split("\n")
        conflicted = [c for c in conflicted if c]
        if not conflicted and not wt.git.status("--porcelain", "--untracked-files=no").strip():
            wt.git.cherry_pick("--skip")  # empty: the change is already in the bad end
            return None
        wt.git.cherry_pick("--abort")
        return conflicted or ["(cherry-pick failed without conflicting files)"]


def _identity_args(repo: git.Repo) -> list[str]:
    """Committer identity for the cherry-pick: the user's, or a fixed one when git has none."""
    reader = repo.config_reader()
    has = reader.has_option("user", "name") and reader.has_option("user", "email")
    return [] if has else ["-c", "user.name=bisect-npu", "-c", "user.email=bisect-npu@localhost"]


def _pick_shas(repo: git.Repo, proposal: FixProposal, bad_sha: str) -> list[str]:
    """The twin that applies best to the bad end: one made right on top of it, else one on the bad end's
    branch (the back-port, adapted to that branch), else the upstream commit."""
    for sha in proposal.shas:
        parents = repo.git.log("-1", "--format=%P", sha).split()
        if parents and is_ancestor(repo, parents[0], bad_sha):
            return [sha]
    on_branch = [sha for sha in proposal.shas if is_ancestor(repo, bad_sha, sha)]
    return on_branch[:1] or proposal.shas[:1]


def _status_of(verdict: Verdict) -> FixStatus:
    if verdict.kind is VerdictKind.GOOD:
        return "verified"
    # The session's evaluator turns a build failure into a skip whose reason says so.
    if verdict.kind is VerdictKind.SKIP and verdict.reason.startswith("build failed"):
        return "build_failed"
    return "not_verified"


def _detail_of(verdict: Verdict) -> str:
    if verdict.kind is VerdictKind.GOOD:
        return "the bad case passes with the fix applied"
    return f"{verdict.kind.value} with the fix applied: {verdict.reason}"


def verify_fixes(repo: git.Repo, bad: str, report: FixReport, evaluate: Callable[[str], Verdict], *,
                 top: int = 3, workdir: Path, done: Collection[str] = (),
                 on_result: Callable[[FixVerification], None] | None = None) -> list[FixVerification]:
    """Apply each of the top proposals to `bad`, evaluate the new commit; verified ones first.

    Proposals whose first sha is in ``done`` (verified by an interrupted run) are left out;
    ``on_result`` hears of each verification the moment it is made, so a caller can keep it.
    """
    bad_sha = resolve_ref(repo, bad)
    holders = [report.culprit, *(twin.sha for twin in report.twins)]
    if not any(is_ancestor(repo, sha, bad_sha) for sha in holders):
        raise UsageError(f"{bad} does not contain the culprit {report.culprit[:12]} (nor a cherry-pick of it): "
                         "a fix applied there proves nothing; give as --bad a commit that shows the symptom")
    results: list[FixVerification] = []
    for proposal in report.proposals[:top]:
        if proposal.shas[0] in done:
            continue
        results.append(_verify_one(repo, bad_sha, proposal, evaluate, workdir))
        if on_result is not None:
            on_result(results[-1])
    order = {"verified": 0}
    results.sort(key=lambda v: order.get(v.status, 1))
    return results


def _verify_one(repo: git.Repo, bad_sha: str, proposal: FixProposal, evaluate: Callable[[str], Verdict],
                workdir: Path) -> FixVerification:
    applied = apply_fix(repo, bad_sha, _pick_shas(repo, proposal, bad_sha), workdir)
    if isinstance(applied, ApplyConflict):
        return FixVerification(proposal, "conflict", conflict_files=applied.files, detail=applied.message)
    if isinstance(applied, AlreadyApplied):
        return FixVerification(proposal, "already_applied", detail=applied.message)
    try:
        verdict = evaluate(applied.sha)
    except BuildFailed as exc:
        return FixVerification(proposal, "build_failed", applied_sha=applied.sha, detail=str(exc))
    return FixVerification(proposal, _status_of(verdict), verdict, applied.sha, detail=_detail_of(verdict))
