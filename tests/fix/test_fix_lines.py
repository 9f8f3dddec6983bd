"""Property: carrying the culprit's lines through any diff keeps them on the same text, or counts them."""

from __future__ import annotations

import difflib

from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.fix.gitlog import Hunk
from bisect_npu.fix.lines import LineHit, TrackedLines, map_through


def u0_hunks(old: list[str], new: list[str]) -> list[Hunk]:
    """The hunks `git diff -U0` would print for old -> new (1-based; an empty side names the line before)."""
    hunks = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        old_start = i1 + 1 if i2 > i1 else i1
        new_start = j1 + 1 if j2 > j1 else j1
        hunks.append(Hunk(old_start, i2 - i1, new_start, j2 - j1, ""))
    return hunks


@st.composite
def edits(draw):
    old = [f"line {i}" for i in range(draw(st.integers(1, 30)))]
    new = list(old)
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        at = draw(st.integers(0, len(new)))
        if op == "insert":
            new[at:at] = [f"new {draw(st.integers(0, 10**6))}" for _ in range(draw(st.integers(1, 3)))]
        elif new and at < len(new):
            count = draw(st.integers(1, 3))
            new[at:at + count] = [f"new {draw(st.integers(0, 10**6))}"] if op == "replace" else []
    tracked = sorted(draw(st.sets(st.integers(1, len(old)), max_size=len(old))))
    return old, new, tracked


@settings(max_examples=200, deadline=None)
@given(edits())
def test_tracked_lines_keep_their_text_or_count_as_changed(case):
    old, new, tracked = case
    hit = LineHit()
    moved = map_through(TrackedLines(tuple(tracked), ()), u0_hunks(old, new), hit)
    assert hit.changed + len(moved.lines) == len(tracked)
    kept = [old[line - 1] for line in tracked if old[line - 1] in new]
    assert [new[line - 1] for line in moved.lines] == kept
