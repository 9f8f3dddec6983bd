"""Opening a session: a new one is checked before anything is made (`preflight`) and its journal
header written; an interrupted one is read from its journal and refused where its recipe or command
changed since it started, or its unit tests were judged by other verdict rules. Either way the
evaluator is made and what a killed earlier process of the session left running is stopped before
anything runs."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import git

from bisect_npu import __version__
from bisect_npu.builders.base import Builder
from bisect_npu.builders.unit_tests import rules_refusal
from bisect_npu.errors import UsageError
from bisect_npu.execute.base import Executor
from bisect_npu.execute.host import host_changes
from bisect_npu.execute.inprocess import Oracle
from bisect_npu.journal import DEFAULT_ROOT, Journal, latest_session, new_session_dir
from bisect_npu.level import held_of
from bisect_npu.orchestration.environments import session_evaluator
from bisect_npu.orchestration.evaluate import Evaluator
from bisect_npu.orchestration.preflight import check_run, settle_slots
from bisect_npu.orchestration.reference import store_reference
from bisect_npu.orchestration.session_spec import SessionSpec, declared_dependencies
from bisect_npu.orchestration.verdict_reuse import VerdictReuse, command_changed, command_oracle, open_verdict_reuse
from bisect_npu.progress import PlainProgress, Progress
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import JOURNAL_SCHEMA_VERSION, EarlierRunsCounts, HeaderRecord
from bisect_npu.upstream import history


@dataclass(frozen=True)
class Opened:
    """The parts of an opened session."""

    journal: Journal
    spec: SessionSpec
    repo: git.Repo | None
    recipe: Recipe | None
    evaluator: Evaluator
    progress: Progress
    reuse: VerdictReuse | None


def open_new(spec: SessionSpec, session_dir: Path | None = None, root: Path = DEFAULT_ROOT,
             progress: Progress | None = None, builder: Builder | None = None, executor: Executor | None = None,
             parent: Path | None = None, oracle: Oracle | None = None) -> Opened:
    """Check the request, then create the journal and the evaluator (`oracle`: the Python callable
    of a session started through bisect_npu.api)."""
    inputs = check_run(spec)
    recipe, repo, candidates_range = inputs.recipe, inputs.repo, inputs.candidates_range
    session_dir = (session_dir or new_session_dir(root)).resolve()
    progress = progress or PlainProgress()
    reuse = open_verdict_reuse(spec, recipe, session_dir, store_reference(recipe, candidates_range.base), progress)
    if inputs.last_good_note:
        progress.note(inputs.last_good_note)
    header = HeaderRecord(
        schema_version=JOURNAL_SCHEMA_VERSION,
        tool_version=__version__,
        request=spec.request.settled(),
        level=spec.level,
        context=spec.context.model_copy(),
        recipe_digest=recipe.digest() if recipe else None,
        mode=spec.search.mode or (recipe.trials.mode if recipe else "exact"),  # what the search ran in
        earlier_runs=EarlierRunsCounts(**inputs.earlier_runs.model_dump()) if inputs.earlier_runs else None,
        range=candidates_range,
        github=_github_of(spec, recipe, repo),
        parent_session=str(parent) if parent else None,
        host_changes=host_changes(recipe, spec.context.host) if recipe else {},
        command_oracle=command_oracle(spec),
    )
    journal = Journal.create(session_dir, header)
    if candidates_range.merge_base_note:
        progress.note(candidates_range.merge_base_note)
    evaluator = session_evaluator(spec, repo, recipe, session_dir, builder, executor, oracle)
    _stop_leftovers(evaluator, progress)
    return Opened(journal, spec, repo, recipe, evaluator, progress, reuse)


def open_journal(session_dir: Path | None = None, root: Path = DEFAULT_ROOT, progress: Progress | None = None,
                 builder: Builder | None = None, executor: Executor | None = None,
                 oracle: Oracle | None = None) -> Opened:
    """Open an interrupted session (the newest under `root` by default) from its journal."""
    session_dir = (session_dir or latest_session(root)).resolve()
    journal = Journal.open(session_dir)
    header = journal.header
    spec = SessionSpec(header.request.settled(), header.level, header.context.model_copy())
    recipe = load_recipe(spec.judge.recipe) if spec.judge.recipe else None
    if recipe is not None and recipe.digest() != journal.header.recipe_digest:
        journal.close()
        raise UsageError(f"recipe {spec.judge.recipe} changed since the session started; "
                         "start a new session with `bisect-npu run` (results would mix two bad cases)")
    repo = history.open_repo(spec.range.repo, remedy=(
        "the session's repository was moved or removed; put it back there to resume, or start a new "
        "session with `bisect-npu run`")) if spec.range.repo else None
    if spec.judge.unit_tests and (refusal := rules_refusal(spec.judge.command or [])):
        journal.close()
        raise UsageError(refusal)
    if changed := command_changed(spec, journal.header.command_oracle):
        journal.close()
        raise UsageError(f"command {shlex.join(spec.judge.command or [])!r} changed since the session started "
                         f"({', '.join(changed)}); start a new session with `bisect-npu run` (results would mix "
                         "two oracles)")
    progress = progress or PlainProgress()
    try:
        reuse = open_verdict_reuse(spec, recipe, session_dir, store_reference(recipe, journal.header.range.base),
                                   progress)
    except UsageError:
        journal.close()
        raise
    if journal.dropped_tail:
        progress.note("dropped a torn last journal line (the previous run was killed mid-write)")
    per_run = recipe.cards_per_run() if recipe else 1
    if spec.executor.devices and len(spec.executor.devices) // (spec.executor.slots or 1) < per_run:
        # A session started before slots followed the engine's size: one card per slot.
        spec.executor.slots = None
        settle_slots(spec, per_run)
        progress.note(f"{spec.executor.slots} slot(s): the recipe's engine needs {per_run} of the "
                      f"{len(spec.executor.devices)} cards")
    evaluator = session_evaluator(spec, repo, recipe, session_dir, builder, executor, oracle)
    _stop_leftovers(evaluator, progress)
    return Opened(journal, spec, repo, recipe, evaluator, progress, reuse)


def _stop_leftovers(evaluator: Evaluator, progress: Progress) -> None:
    """What a killed earlier process of this session left running goes before anything runs (on
    an NPU host it would hold the cards); the user hears how much."""
    if stopped := evaluator.executor.sweep():
        progress.note(f"stopped {stopped} leftover container(s) or process(es) of a killed earlier run")


def _github_of(spec: SessionSpec, recipe: Recipe | None, repo: git.Repo | None) -> str | None:
    """Where the report links commits and pull requests: the clone's GitHub remote; for a
    dependency level on a clone without one, the dependency's declared url."""
    if repo is None or spec.range.package is not None:
        return None
    found = history.github_url(repo)
    if found is None and (held := held_of(spec.level)) is not None:
        dependency = next((d for d in declared_dependencies(spec, recipe) if d.name == held.dependency), None)
        found = history.github_base(dependency.url) if dependency is not None and dependency.url else None
    return found
