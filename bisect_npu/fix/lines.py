"""Blame forward: carry the culprit's lines through each later commit's -U0 diff and count the commits
that change them, re-add what it deleted or edit near them (the provenance and proximity signals)."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from bisect_npu.fix.gitlog import IGNORABLE_FILE, FileDiff, Hunk
from bisect_npu.upstream.history import LoggedCommit

PROXIMITY_LINES = 3  # a hunk this close to a culprit line is near it (the proximity signal)


@dataclass(frozen=True)
class TrackedLines:
    """The culprit's lines in one file version: line numbers, and gaps where it deleted lines."""

    lines: tuple[int, ...]
    gaps: tuple[int, ...]  # gap g: between line g and g+1 (the culprit deleted lines there)
    # Lines that later commits wrote in place of the culprit's: a fix that lands after a rewrite (a
    # typo fix, a reformat, a move) still edits what the culprit wrote, in its new words.
    rewritten: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.lines or self.gaps or self.rewritten)


@dataclass
class LineHit:
    """What one later commit did to the culprit's lines in one file (the provenance evidence)."""

    changed: int = 0  # culprit lines this commit changed or deleted
    rewritten: int = 0  # lines it changed that an earlier commit wrote in place of culprit lines
    restored: int = 0  # culprit deletion gaps this commit inserted lines into
    near: int = 0  # hunks within PROXIMITY_LINES of a culprit line


def _culprit_tracked(diffs: list[FileDiff]) -> dict[str, TrackedLines]:
    tracked: dict[str, TrackedLines] = {}
    for diff in diffs:
        if diff.new_path is None or IGNORABLE_FILE.search(diff.new_path):
            continue  # a later edit of the same docs or CI line says nothing about the regression
        lines: list[int] = []
        gaps: list[int] = []
        for hunk in diff.hunks:
            if hunk.new_len:
                lines.extend(range(hunk.new_start, hunk.new_start + hunk.new_len))
            elif hunk.old_len:
                gaps.append(hunk.new_start)
        if lines or gaps:
            tracked[diff.new_path] = TrackedLines(tuple(lines), tuple(gaps))
    return tracked


def map_through(tracked: TrackedLines, hunks: list[Hunk], hit: LineHit) -> TrackedLines:
    """Move the culprit's lines through one diff (-U0 hunks), counting the ones it touches."""
    shifts = []  # (threshold, delta): lines >= threshold move by delta
    removed: list[tuple[int, int]] = []
    for h in hunks:
        if h.old_len:
            removed.append((h.old_start, h.old_start + h.old_len))
            shifts.append((h.old_start + h.old_len, h.new_len - h.old_len))
        else:
            shifts.append((h.old_start + 1, h.new_len))

    # Sorted thresholds with running sums, and sorted removed ranges: a bisect per line, not a scan of
    # every hunk (a 5,000-line culprit through a 200-hunk rewrite).
    shifts.sort()
    thresholds = [threshold for threshold, _ in shifts]
    running = list(accumulate((delta for _, delta in shifts), initial=0))
    removed.sort()
    starts = [lo for lo, _ in removed]

    def moved(line: int) -> int:
        return line + running[bisect_right(thresholds, line)]

    def removed_here(line: int) -> bool:
        at = bisect_right(starts, line) - 1
        return at >= 0 and line < removed[at][1]

    lines = []
    carried: set[int] = set()
    for line in tracked.lines:
        if removed_here(line):
            hit.changed += 1
            carried.update(_replacement(hunks, line))
        else:
            lines.append(moved(line))
    for line in tracked.rewritten:
        if removed_here(line):
            hit.rewritten += 1
            carried.update(_replacement(hunks, line))
        else:
            carried.add(moved(line))
    gaps = []
    for gap in tracked.gaps:
        if any(h.old_len == 0 and h.old_start == gap for h in hunks) or any(lo <= gap < hi - 1 for lo, hi in removed):
            hit.restored += 1
        else:
            gaps.append(moved(gap))
    if not hit.changed and not hit.restored and not hit.rewritten:
        positions = list(tracked.lines) + list(tracked.gaps) + list(tracked.rewritten)
        for h in hunks:
            lo, hi = h.old_start - PROXIMITY_LINES, h.old_start + max(h.old_len, 1) + PROXIMITY_LINES
            if any(lo <= p <= hi for p in positions):
                hit.near += 1
    return TrackedLines(tuple(lines), tuple(gaps), tuple(sorted(carried)))


def _replacement(hunks: list[Hunk], line: int) -> range:
    """The new lines of the hunk that replaced `line` (none when it only deleted it)."""
    hunk = next(h for h in hunks if h.old_len and h.old_start <= line < h.old_start + h.old_len)
    return range(hunk.new_start, hunk.new_start + hunk.new_len)


def line_hits(culprit: LoggedCommit, culprit_diffs: list[FileDiff], meta: list[LoggedCommit],
              diffs: dict[str, list[FileDiff]]) -> dict[str, LineHit]:
    """Blame forward: carry the culprit's lines through every later commit (parents first)."""
    start = _culprit_tracked(culprit_diffs)
    states: dict[str, dict[str, TrackedLines]] = {culprit.sha: start}
    hits: dict[str, LineHit] = {}
    for commit in meta:
        parent = next((p for p in commit.parents if p in states), None)
        base = states[parent] if parent else {}
        file_diffs = diffs.get(commit.sha) if parent == (commit.parents[0] if commit.parents else None) else None
        if not file_diffs or not base:
            states[commit.sha] = base
            continue
        state = dict(base)
        hit = LineHit()
        for fd in file_diffs:
            tracked = state.get(fd.old_path) if fd.old_path else None
            if tracked is None:
                continue
            assert fd.old_path is not None  # tracked is only found under an old path
            del state[fd.old_path]
            if fd.new_path is None:
                hit.changed += len(tracked.lines)
                continue
            moved = map_through(tracked, fd.hunks, hit)
            if moved:
                state[fd.new_path] = moved
        states[commit.sha] = state
        if hit.changed or hit.restored or hit.rewritten or hit.near:
            hits[commit.sha] = hit
    return hits
