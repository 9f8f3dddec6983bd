"""Opening a session: a new one is checked before anything is made (`preflight`) and its journal
header written; an interrupted one is read from its journal and refused where its recipe or command
changed since it started, its unit tests were judged by other verdict rules, or a nightly's results
it names are now another model's (preflight's `check_models` again); a request given again
for an existing session is refused where it asks another run (`request_difference`). Either way the
evaluator is made and what a killed earlier process of the session left running is stopped before
anything runs."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git

from bisect_npu import __version__
from bisect_npu.builders.base import Builder
from bisect_npu.builders.unit_tests import rules_refusal
from bisect_npu.defaults import LAST_GOOD
from bisect_npu.errors import UsageError
from bisect_npu.execute.base import Executor
from bisect_npu.execute.host import host_changes
from bisect_npu.execute.inprocess import Oracle
from bisect_npu.journal import DEFAULT_ROOT, Journal, latest_session, new_session_dir
from bisect_npu.level import held_of
from bisect_npu.orchestration.opening import throughput_search
from bisect_npu.orchestration.opening.environments import session_evaluator
from bisect_npu.orchestration.opening.preflight import check_run, settle_slots
from bisect_npu.orchestration.opening.reference import store_reference
from bisect_npu.orchestration.opening.session_opening import Opening, check_recipe, open_session
from bisect_npu.orchestration.opening.session_spec import SessionSpec, declared_dependencies
from bisect_npu.orchestration.opening.verdict_reuse import (
    VerdictReuse,
    command_changed,
    command_oracle,
    open_verdict_reuse,
)
from bisect_npu.orchestration.running.earlier_results import check_models, settled_given
from bisect_npu.orchestration.running.evaluate import Evaluator
from bisect_npu.progress import PlainProgress, Progress
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import JOURNAL_SCHEMA_VERSION, EarlierRunsCounts, HeaderRecord
from bisect_npu.request import RunRequest, flagged_fields
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
             parent: Path | None = None, oracle: Oracle | None = None,
             searching: throughput_search.ThroughputSearch | None = None) -> Opened:
    """Check the request, then create the journal and the evaluator (`oracle`: the Python callable
    of a session started through bisect_npu.api; `searching`: a finer level's throughput search,
    the session's above it), as `session_opening.open_session` opens any."""
    inputs = check_run(spec)
    recipe, repo, candidates_range = inputs.recipe, inputs.repo, inputs.candidates_range
    session_dir = (session_dir or new_session_dir(root)).resolve()
    progress = progress or PlainProgress()
    reuse = open_verdict_reuse(spec, recipe, session_dir,
                               store_reference(recipe, candidates_range, spec.search.find_fix), progress)
    for line in inputs.owed:
        progress.note(line)
    if inputs.last_good_note:
        progress.note(inputs.last_good_note)
    asked = throughput_search.asked_by(recipe)

    def header() -> HeaderRecord:
        return HeaderRecord(
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
            throughput_search=(searching or asked) if asked else None,
        )

    def evaluator(_journal: Journal) -> Evaluator:
        if candidates_range.merge_base_note:
            progress.note(candidates_range.merge_base_note)
        return session_evaluator(spec, repo, recipe, session_dir, builder, executor, oracle)

    journal, made = open_session(Opening(Journal, header), session_dir, progress, evaluator)
    return Opened(journal, spec, repo, recipe, made, progress, reuse)


def open_journal(session_dir: Path | None = None, root: Path = DEFAULT_ROOT, progress: Progress | None = None,
                 builder: Builder | None = None, executor: Executor | None = None,
                 oracle: Oracle | None = None, accept_changed_command: bool = False) -> Opened:
    """Open an interrupted session (the newest under `root` by default) from its journal, as
    `session_opening.open_session` opens any. `accept_changed_command`: the user vouches that what
    the command sees changed without changing its verdicts (a fix of the command that aborted the run)."""
    session_dir = (session_dir or latest_session(root)).resolve()
    progress = progress or PlainProgress()
    opened: dict[str, Any] = {}

    def check(journal: Journal) -> None:
        header = journal.header
        spec = opened["spec"] = SessionSpec(header.request.settled(), header.level, header.context.model_copy())
        recipe = opened["recipe"] = load_recipe(spec.judge.recipe) if spec.judge.recipe else None
        if recipe is not None and (refusal := throughput_search.edited_search(
                recipe, header.recipe_digest, spec.judge.recipe or "", session_dir)):
            raise UsageError(refusal)
        check_recipe(recipe, header.recipe_digest, f"recipe {spec.judge.recipe} changed since the session started; "
                     "start a new session with `bisect-npu run` (results would mix two bad cases)")
        if recipe is not None and recipe.accuracy is not None:
            try:  # as a new session's preflight: a nightly's results replaced since by another model's
                check_models(recipe, spec.judge.earlier_results)
            except UsageError as exc:
                raise UsageError(f"{exc}; to resume, put back the nightly's results the session started with, or "
                                 "start a new session with `bisect-npu run`") from None
        repo = opened["repo"] = history.open_repo(spec.range.repo, remedy=(
            "the session's repository was moved or removed; put it back there to resume, or start a new "
            "session with `bisect-npu run`")) if spec.range.repo else None
        if repo is not None and (gone := _commits_gone(repo, header)):
            raise UsageError(f"the session's {gone} is no longer in {spec.range.repo} (a force-push and `git gc` drop "
                             "commits no branch holds): fetch it back (`git fetch REMOTE SHA` where a remote still "
                             "has it) to resume, or start a new session with `bisect-npu run`; `bisect-npu report "
                             f"--session {session_dir}` still reads this one")
        if spec.judge.unit_tests and (refusal := rules_refusal(spec.judge.command or [])):
            raise UsageError(refusal)
        changed = command_changed(spec, header.command_oracle)
        if changed and not accept_changed_command:
            raise UsageError(f"command {shlex.join(spec.judge.command or [])!r} changed since the session started "
                             f"({', '.join(changed)}); start a new session with `bisect-npu run` (results would mix "
                             "two oracles), or, where the change fixes what aborted the run and judges every commit "
                             f"as before, `bisect-npu resume --session {session_dir} --accept-changed-command`")
        if changed:
            progress.note(f"resuming with the command changed ({', '.join(changed)}), as --accept-changed-command asks")
        opened["reuse"] = open_verdict_reuse(spec, recipe, session_dir,
                                             store_reference(recipe, header.range, spec.search.find_fix), progress)

    def evaluator(_journal: Journal) -> Evaluator:
        spec, recipe = opened["spec"], opened["recipe"]
        per_run = recipe.cards_per_run() if recipe else 1
        if spec.executor.devices and len(spec.executor.devices) // (spec.executor.slots or 1) < per_run:
            # A session started before slots followed the engine's size: one card per slot.
            spec.executor.slots = None
            settle_slots(spec, per_run)
            progress.note(f"{spec.executor.slots} slot(s): the recipe's engine needs {per_run} of the "
                          f"{len(spec.executor.devices)} cards")
        return session_evaluator(spec, opened["repo"], recipe, session_dir, builder, executor, oracle)

    journal, made = open_session(Opening(Journal, check=check), session_dir, progress, evaluator)
    return Opened(journal, opened["spec"], opened["repo"], opened["recipe"], made, progress, opened["reuse"])


def _commits_gone(repo: git.Repo, header: HeaderRecord) -> str:
    """The ends of a session's commit range its repository no longer holds, in words ("" when both
    are there; every candidate lies on the bad end's history)."""
    bisected = header.range
    if bisected.kind != "commits":
        return ""
    ends = {"bad end": (bisected.bad, bisected.bad_ref), "good end": (bisected.base, bisected.good_ref)}
    return " and ".join(f"{name} {sha[:12]} ({ref})" for name, (sha, ref) in ends.items()
                        if not history.has_commit(repo, sha))


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


# Request fields that change where and how fast candidates run, not what a commit's run shows:
# a session asked again with other values of these is the same run.
NOT_IDENTITY = frozenset({"ray_address", "devices", "slots", "workdir", "prefetch", "cache_size_gb", "verdict_store"})
# Fields settled at the start (a path made absolute, a ref resolved, the recipe's mode): compared
# as settled below, not as written.
_SETTLED = frozenset({"repo", "good", "bad", "recipe", "command", "mode", "unit_test_from", "earlier_results"})

Fact = tuple[str, object, object]  # (what, the session's, the request's)


def first_difference(facts: Iterable[Fact]) -> str | None:
    """The first fact whose two values differ, as a phrase naming both; None: the same run."""
    for what, kept, asked in facts:
        if kept != asked:
            return f"its {what} is {_shown(kept)}, this request's {_shown(asked)}"
    return None


def refuse_other_request(kind: str, session_dir: Path, difference: str, resume: str) -> UsageError:
    """The one-line refusal of a request given for a session that ran another: the difference and
    the two ways on (`resume`: what continues the session as it was)."""
    return UsageError(f"{kind} {session_dir} is another run: {difference}; continue it as it was with {resume}, or "
                      "start a new session (another --session, or none)")


def check_same_request(session_dir: Path, asked: RunRequest, python_oracle: str | None = None) -> None:
    """A request given for a session that exists already must be the run it holds: else the
    one-line refusal, before anything of the session is opened."""
    journal = Journal.open(session_dir, read_only=True)
    if difference := request_difference(journal.header, asked, python_oracle):
        raise refuse_other_request("session", session_dir, difference, f"`bisect-npu resume --session {session_dir}`")


def request_difference(header: HeaderRecord, asked: RunRequest, python_oracle: str | None = None) -> str | None:
    """What makes `asked` another run than the session `header` opens, or None: its whole request
    (the repository, the ends as resolved commits, the oracle, the level and every option that
    changes what a run shows), compared as the session settled its own."""
    return first_difference(_facts(header, asked, python_oracle))


def _facts(header: HeaderRecord, asked: RunRequest, python_oracle: str | None) -> Iterator[Fact]:
    kept = header.request
    yield "repository", kept.range.repo, _settled_repo(asked.range.repo)
    yield "--package", kept.range.package, asked.range.package
    repo = history.open_repo(asked.range.repo) if asked.range.repo and asked.range.package is None else None
    yield "good end", *_end(header.range.good_ref, header.range.good, asked.range.good, repo)
    yield "bad end", *_end(header.range.bad_ref, header.range.bad, asked.range.bad, repo)
    recipe = load_recipe(asked.judge.recipe) if asked.judge.recipe else None
    yield "oracle", _kept_oracle(header), _asked_oracle(asked, recipe, python_oracle)
    settled_mode = kept.search.mode if asked.judge.nightly_case else (recipe.trials.mode if recipe else "exact")
    yield "mode", kept.search.mode, asked.search.mode or settled_mode
    yield "--unit-test-from", kept.judge.unit_test_from, (
        history.resolve_ref(repo, asked.judge.unit_test_from) if repo is not None and asked.judge.unit_test_from
        else asked.judge.unit_test_from)
    yield "level", header.level.model_dump(), SessionSpec.of(asked).level.model_dump()
    yield "--earlier-results", kept.judge.earlier_results, settled_given(asked.judge.earlier_results)
    for part, name, _info, flag, value in flagged_fields(asked):
        if name not in NOT_IDENTITY and name not in _SETTLED:
            yield flag.name, getattr(getattr(kept, part), name), value


def _settled_repo(repo: str | None) -> str | None:
    """A repository as the journal header keeps it: a clone's work tree, or the URL."""
    if repo is None or history.is_url(repo):
        return repo
    opened = history.open_repo(repo)
    return str(opened.working_tree_dir or opened.git_dir)


def _end(kept_ref: str, kept_sha: str, asked: str, repo: git.Repo | None) -> tuple[str, str]:
    """An end as the commit it names (as written where the session did not resolve it to one:
    `last-good`, a release)."""
    if repo is None or kept_ref == LAST_GOOD or asked == LAST_GOOD:
        return kept_ref, asked
    return kept_sha, history.resolve_ref(repo, asked)


def _kept_oracle(header: HeaderRecord) -> str:
    judge = header.request.judge
    if header.context.python_oracle:
        return f"callable {header.context.python_oracle}"
    if judge.unit_tests:
        return f"unit tests {' '.join(judge.unit_tests)}"
    if judge.nightly_case:
        return f"nightly case {judge.nightly_case}"
    if judge.recipe:
        return f"recipe {judge.recipe} ({(header.recipe_digest or '')[:12]})"
    return f"command {shlex.join(judge.command or [])}"


def _asked_oracle(asked: RunRequest, recipe: Recipe | None, python_oracle: str | None) -> str:
    judge = asked.judge
    if python_oracle:
        return f"callable {python_oracle}"
    if judge.unit_tests:
        return f"unit tests {' '.join(judge.unit_tests)}"
    if judge.nightly_case:
        return f"nightly case {judge.nightly_case}"
    if judge.recipe and recipe is not None:
        path = Path(judge.recipe)
        return f"recipe {path.resolve() if path.exists() else judge.recipe} ({recipe.digest()[:12]})"
    return f"command {shlex.join(judge.command or [])}"


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, str) and len(value) == 40 and all(c in "0123456789abcdef" for c in value):
        return value[:12]
    return repr(value) if not isinstance(value, str) else value
