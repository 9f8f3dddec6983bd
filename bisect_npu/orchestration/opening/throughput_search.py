"""How a throughput session searches (`oracle.throughput.search`: levels, one run a step and every
run weighed together; per_step, each step's trials) is the session's own: its journal header keeps
it as the session started (`HeaderRecord.throughput_search`), and a resumed session searches that
way whatever this version's default, since a search changed mid-session would weigh its finished
steps by another model than the one that chose them. A recipe edited to search the other way is
refused as any edited recipe is, in words that say which line to put back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from bisect_npu.orchestration.running.evaluate import LEVELS_STOPPED
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import HeaderRecord, JournalRecord, StepRecord, TrialRecord

ThroughputSearch = Literal["levels", "per_step"]
SEARCHES: tuple[ThroughputSearch, ...] = ("levels", "per_step")


def asked_by(recipe: Recipe | None) -> ThroughputSearch | None:
    """The search a recipe asks (None: it has no throughput oracle)."""
    if recipe is None or recipe.oracle.throughput is None:
        return None
    return recipe.oracle.throughput.search


def journaled(entries: Sequence[JournalRecord]) -> ThroughputSearch | None:
    """How a journal whose header does not keep it was searched: levels where a step was one run of
    the levels search, per_step where anything else ran (the versions before levels mode searched
    per step), None where nothing ran yet."""
    steps = [entry for entry in entries if isinstance(entry, StepRecord)]
    if any(step.verdict.figures.get("stopped") == LEVELS_STOPPED for step in steps):
        return "levels"
    if steps or any(isinstance(entry, TrialRecord) for entry in entries):
        return "per_step"
    return None


def pinned(header: HeaderRecord, entries: Sequence[JournalRecord], recipe: Recipe | None) -> ThroughputSearch | None:
    """The search a session goes on with: its header's, else what its journal shows it ran, else
    (nothing ran) the recipe's; None without a throughput oracle."""
    if asked_by(recipe) is None:
        return None
    return header.throughput_search or journaled(entries) or asked_by(recipe)


def with_search(recipe: Recipe, search: ThroughputSearch) -> Recipe:
    """The recipe searching `search` (a recipe with a throughput oracle)."""
    assert recipe.oracle.throughput is not None
    throughput = recipe.oracle.throughput.model_copy(update={"search": search})
    return recipe.model_copy(update={"oracle": recipe.oracle.model_copy(update={"throughput": throughput})})


def edited_search(recipe: Recipe, digest: str | None, path: str | Path, session_dir: Path) -> str | None:
    """The refusal of a recipe whose one edit since the session started is its
    `oracle.throughput.search` line, naming the line to put back; None where the recipe is as it
    started or another edit changed it (refused as any edited recipe is)."""
    asked = asked_by(recipe)
    if asked is None or recipe.digest() == digest:
        return None
    started = next((s for s in SEARCHES if s != asked and with_search(recipe, s).digest() == digest), None)
    if started is None:
        return None
    line = f"`oracle.throughput.search: {started}`" + (" (or no line: the default)" if started == "levels" else "")
    return (f"recipe {path} changed since the session started: its oracle.throughput.search is now {asked}, not "
            f"{started} (a session searches one way to its end: its journal keeps how); put {line} back to resume "
            f"it with `bisect-npu resume --session {session_dir}`, or start a new session with `bisect-npu run` to "
            f"search {asked}")


def other_search_note(recipe: Recipe | None, search: ThroughputSearch | None) -> str | None:
    """What the user hears when the recipe asks another search than the session runs: one an older
    version started (its default was per_step), or a finer level's under it."""
    if search is None or asked_by(recipe) in (None, search):
        return None
    return (f"searching {search}, as this session started (its journal keeps how it searches); the recipe asks "
            f"{asked_by(recipe)}, as a new session (`bisect-npu run`) would search")
