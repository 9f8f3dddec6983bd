"""The one opening of a session, whatever space it searches (the commit search's `Session`, the
settings search's `SettingsSearch`): its journal reopened and checked against what is asked now (the
space's checks, its recipe unchanged: `check_recipe`), else a new one with its header; then its
evaluator made and what a killed earlier process left running stopped. The space folds the journal
into its state once (`folded`), which also gives the evaluator's retry budget the host's record of
attempts the journal holds, so a resumed session retries as the interrupted one would. What differs
(the journal's class, the header, the checks, how the evaluator is made) is the space's (`Opening`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from bisect_npu.errors import UsageError
from bisect_npu.journal import AppendOnlyJournal
from bisect_npu.orchestration.running.evaluate import Evaluator
from bisect_npu.progress import Progress
from bisect_npu.recipe.schema import Recipe
from bisect_npu.search.retry_policy import HostRecord

JournalT = TypeVar("JournalT", bound=AppendOnlyJournal[Any, Any])  # the space's journal: commits', settings'


@dataclass(frozen=True)
class Opening(Generic[JournalT]):
    """What differs in how a space's session opens: its journal's class, the header of a new one
    (None: it must exist, as `resume` asks), whether a request for a directory that holds a session
    goes on with it (the settings search) rather than being refused (`run`), the checks an existing
    one must pass before anything runs (a UsageError naming the way on), and what the user hears
    when it goes on."""

    journal: type[JournalT]
    header: Callable[[], Any] | None = None
    reopens: bool = False
    check: Callable[[JournalT], None] = lambda _journal: None
    continuing: str = ""


def open_session(opening: Opening[JournalT], session_dir: Path, progress: Progress,
                 evaluator: Callable[[JournalT], Evaluator]) -> tuple[JournalT, Evaluator]:
    """Open a session's journal (reopened and checked, or new with its header), then make its
    evaluator (`evaluator(journal)`) and stop what a killed earlier process left running; the
    journal is closed again where anything before that fails."""
    if opening.header is None or (opening.reopens and opening.journal.exists(session_dir)):
        journal = opening.journal.open(session_dir)
        try:
            opening.check(journal)
        except BaseException:
            journal.close()
            raise
        if journal.dropped_tail:
            progress.note("dropped a torn last journal line (the previous run was killed mid-write)")
        if opening.continuing:
            progress.note(opening.continuing)
    else:
        journal = opening.journal.create(session_dir, opening.header())
    try:
        made = evaluator(journal)
    except BaseException:
        journal.close()
        raise
    stop_leftovers(made, progress)
    return journal, made


def check_recipe(recipe: Recipe | None, digest: str | None, refusal: str) -> None:
    """A session goes on only with the recipe it started with (its verdicts would mix two bad
    cases): `refusal` where the recipe's digest is not the journal's."""
    if recipe is not None and recipe.digest() != digest:
        raise UsageError(refusal)


class FoldedState(Protocol):
    @property
    def host_record(self) -> HostRecord: ...


State = TypeVar("State", bound=FoldedState)


def folded(state: State, evaluator: Evaluator) -> State:
    """A space's state, built once from its journal: the evaluator's retry budget goes on with the
    host's failure rate the journaled attempts give."""
    evaluator.retry.host.add(state.host_record.failures, state.host_record.successes)
    return state


def stop_leftovers(evaluator: Evaluator, progress: Progress) -> None:
    """What a killed earlier process of this session left running goes before anything runs (on
    an NPU host it would hold the cards); the user hears how much."""
    if stopped := evaluator.executor.sweep():
        progress.note(f"stopped {stopped} leftover container(s) or process(es) of a killed earlier run")
