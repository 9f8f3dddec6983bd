"""A bisection session: the search over one level's candidates (releases or commits), their
evaluation, and the journal of both.

The loop lives here: decide, run the round, journal. `state` keeps what the journal says as it
grows, `slots` runs a round over the slots, `sentences` says how it ended; `levels` runs the
sessions of a bisection's levels and its fix stage; `options` (the session's request and level),
`preflight`, `wiring`, `memory` and `costs` are rooms of their own, as are `search`, `evaluate`,
`oracle`, `journal` and `report`. The journal is the only state that outlives a process: a session
killed at any moment resumes from it without redoing a finished step or trial.
"""

from __future__ import annotations

import functools
import itertools
import math
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import git

from bisect_npu import __version__, search
from bisect_npu.builders.base import Builder, tail
from bisect_npu.contracts import Verdict, VerdictKind
from bisect_npu.errors import UsageError
from bisect_npu.execute.base import Executor
from bisect_npu.execute.host import host_changes
from bisect_npu.execute.inprocess import Oracle
from bisect_npu.journal import DEFAULT_ROOT, Journal, latest_session, new_session_dir
from bisect_npu.level import held_of, scope_of
from bisect_npu.orchestration import sentences
from bisect_npu.orchestration.costs import measured_costs, told_costs
from bisect_npu.orchestration.evaluate import EvaluationRequest, Evaluator, StepResult
from bisect_npu.orchestration.options import SessionSpec, earlier_runs_for_search, earlier_runs_spec
from bisect_npu.orchestration.preflight import check_run, settle_slots
from bisect_npu.orchestration.slots import run_in_slots
from bisect_npu.orchestration.state import SessionState
from bisect_npu.orchestration.verdict_reuse import VerdictReuse, command_changed, command_oracle, open_verdict_reuse
from bisect_npu.orchestration.wiring import load_golden, session_evaluator
from bisect_npu.progress import PlainProgress, Progress
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import (
    JOURNAL_SCHEMA_VERSION,
    BuildInfo,
    EarlierRunsCounts,
    EndRecord,
    HeaderRecord,
    JournalRecord,
    StepRecord,
    TrialRecord,
    TrialRun,
)
from bisect_npu.upstream import history

EXIT_FOUND, EXIT_NARROWED, EXIT_ENDS_WRONG = 0, 3, 4
EXIT_CODES = {"found": EXIT_FOUND, "narrowed": EXIT_NARROWED, "ends_wrong": EXIT_ENDS_WRONG}  # by EndRecord.status


@dataclass(frozen=True)
class SessionResult:
    """How a session ended; `exit_code` as docs/reference/exit-codes.md gives it (0, 3 or 4)."""

    status: Literal["found", "narrowed", "ends_wrong"]
    exit_code: int
    session_dir: Path
    culprit: str | None = None
    range: tuple[str, str] | None = None
    message: str = ""
    steps: int = 0
    output_tail: str = ""  # ends judged wrong: the last lines of that end's last run (its log is in `message`)


END_OUTPUT_LINES = 10  # what an end judged wrong shows of its run's output


def _reference(recipe: Recipe | None, base: str) -> str:
    """What a recipe's verdicts are relative to, for the verdict store: the good end where the
    oracle compares against the good end's own runs, else nothing."""
    return base if recipe is not None and recipe.reference.kind == "good_end" else ""


def _stop_leftovers(evaluator: Evaluator, progress: Progress) -> None:
    """What a killed earlier process of this session left running goes before anything runs (on
    an NPU host it would hold the cards); the user hears how much."""
    if stopped := evaluator.executor.sweep():
        progress.note(f"stopped {stopped} leftover container(s) or process(es) of a killed earlier run")


def _github_of(spec: SessionSpec, recipe: Recipe | None, repo: git.Repo | None) -> str | None:
    """Where the report links commits and pull requests: the clone's GitHub remote; for a
    dependency level on a clone without one, the dependency's declared url."""
    from bisect_npu.orchestration.options import declared_dependencies

    if repo is None or spec.range.package is not None:
        return None
    found = history.github_url(repo)
    if found is None and (held := held_of(spec.level)) is not None:
        dependency = next((d for d in declared_dependencies(spec, recipe) if d.name == held.dependency), None)
        found = history.github_base(dependency.url) if dependency is not None and dependency.url else None
    return found


class Session:
    """One bisection over a resolved range, driven step by step from the journal."""

    def __init__(self, journal: Journal, spec: SessionSpec, repo: git.Repo | None, recipe: Recipe | None,
                 evaluator: Evaluator, progress: Progress, memory: VerdictReuse | None = None) -> None:
        self.journal = journal
        self.memory = memory
        self.spec = spec
        self.repo = repo
        self.recipe = recipe
        self.evaluator = evaluator
        self.progress = progress
        header_range = journal.header.range
        self.base = header_range.base
        self.candidates = list(header_range.candidates)
        self.titles = header_range.titles
        self._lock = threading.Lock()
        self._store_lock = threading.Lock()  # one slot at a time reads or writes a position's stored verdict
        self._told: dict[str, float] = {}  # the costs the search was told for the round being run
        self.earlier_runs = earlier_runs_spec(spec, recipe)
        self.state = SessionState(self.mode == "noisy", spec.search.find_fix, journal.entries, weigh=self._log_lr)
        if recipe is not None and recipe.reference.kind == "golden":
            evaluator.reference = load_golden(recipe)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def start(cls, spec: SessionSpec, session_dir: Path | None = None, root: Path = DEFAULT_ROOT,
              progress: Progress | None = None, builder: Builder | None = None,
              executor: Executor | None = None, parent: Path | None = None, oracle: Oracle | None = None) -> Session:
        """Check the request before anything is made (`preflight`), then create the journal and the
        evaluator (`oracle`: the Python callable of a session started through bisect_npu.api)."""
        inputs = check_run(spec)
        recipe, repo, candidates_range = inputs.recipe, inputs.repo, inputs.candidates_range
        session_dir = (session_dir or new_session_dir(root)).resolve()
        progress = progress or PlainProgress()
        memory = open_verdict_reuse(spec, recipe, session_dir, _reference(recipe, candidates_range.base), progress)
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
        return cls(journal, spec, repo, recipe, evaluator, progress, memory)

    @classmethod
    def resume(cls, session_dir: Path | None = None, root: Path = DEFAULT_ROOT, progress: Progress | None = None,
               builder: Builder | None = None, executor: Executor | None = None,
               oracle: Oracle | None = None) -> Session:
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
        if changed := command_changed(spec, journal.header.command_oracle):
            journal.close()
            raise UsageError(f"command {shlex.join(spec.judge.command or [])!r} changed since the session started "
                             f"({', '.join(changed)}); start a new session with `bisect-npu run` (results would mix "
                             "two oracles)")
        progress = progress or PlainProgress()
        try:
            memory = open_verdict_reuse(spec, recipe, session_dir, _reference(recipe, journal.header.range.base),
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
        return cls(journal, spec, repo, recipe, evaluator, progress, memory)

    # -- state from the journal -----------------------------------------------------------------

    @property
    def slots(self) -> int:
        """Candidates tested at once (settled when the run started)."""
        return max(1, self.spec.executor.slots or 1)

    @property
    def check_ends(self) -> bool:
        return self.spec.level.checks_ends(self.spec.search.check_ends, noisy=self.mode == "noisy")

    @property
    def n(self) -> int:
        return len(self.candidates)

    def commit_at(self, index: int) -> str:
        return self.base if index == 0 else self.candidates[index - 1]

    @property
    def mode(self) -> Literal["exact", "noisy"]:
        if self.recipe is not None and self.recipe.accuracy is not None:
            return "exact"  # one verdict per step: its own sequential test (the search weighs its likelihood ratio)
        if self.spec.search.mode:
            return self.spec.search.mode
        return self.recipe.trials.mode if self.recipe else "exact"

    def problem(self) -> search.SearchProblem:
        confidence = self.spec.search.confidence or (self.recipe.trials.confidence if self.recipe else 0.99)
        earlier = (earlier_runs_for_search(self.earlier_runs, find_fix=self.spec.search.find_fix)
                   if self.earlier_runs else None)
        # Costs in the search's unit, measured from the journal, so a resumed session weighs as
        # the interrupted one did. Which groups have an image is asked of the builder: those are
        # real, whoever built them.
        groups = self.build_groups
        load_cost, build_cost, overlay_cost = measured_costs(
            self.journal.entries, self.recipe.trials if self.recipe else None, noisy=self.mode == "noisy",
            batches=self.evaluator.batches, grouped=bool(groups))
        # An accuracy recipe's steps are measurements: the search weighs each one's likelihood ratio.
        mode = "likelihood" if self.recipe is not None and self.recipe.accuracy is not None else self.mode
        return search.SearchProblem(n=self.n, mode=mode, check_ends=self.check_ends,
                                    slots=self.slots, confidence=confidence, earlier_runs=earlier,
                                    load_cost=load_cost, build_cost=build_cost, build_groups=groups,
                                    prebuilt_groups=self.prebuilt_groups(), overlay_cost=overlay_cost,
                                    weights=self.weights)

    @property
    def weights(self) -> tuple[int, ...] | None:
        """Each position's commits brought in (merges weigh more), where the range has merges."""
        brought_in = self.journal.header.range.brought_in
        if not brought_in:
            return None
        return tuple(brought_in.get(self.commit_at(i), 1) for i in range(self.n + 1))

    @functools.cached_property
    def build_keys(self) -> list[str] | None:
        """Each position's build key, where the builder shares compiled images between commits
        (a full build for the first commit of a key, an overlay for the others); else None."""
        keys = [self.evaluator.builder.build_key(self.commit_at(i)) for i in range(self.n + 1)]
        if any(key is None for key in keys):
            return None
        return [key for key in keys if key is not None]

    @functools.cached_property
    def build_groups(self) -> tuple[int, ...] | None:
        """``build_keys`` as the search's group ids."""
        return search.group_ids(self.build_keys) if self.build_keys is not None else None

    def prebuilt_groups(self) -> frozenset[int]:
        """The groups whose image the builder holds already (asked at each decision: an earlier
        session's images, and what prefetch has built since)."""
        if self.build_keys is None or self.build_groups is None:
            return frozenset()
        built = self.evaluator.builder.built_keys()
        return frozenset(group for key, group in zip(self.build_keys, self.build_groups, strict=True) if key in built)

    def evidence(self) -> dict[int, search.Evidence]:
        dropped = self.memory is not None and self.store_dropped()
        return self.state.evidence(without_stored=dropped)

    def _log_lr(self, step: StepRecord) -> float:
        """A step's likelihood ratio (accuracy oracle) in the search's terms: under --find-fix the
        symptom's side is the good one, so the ratio changes sign. A verdict without one (the
        verdict store keeps the kind, not the figures) weighs what a step decided at the recipe's
        confidence at least said; other oracles' steps carry none (0)."""
        value = step.verdict.figures.get("log_likelihood_ratio")
        if not isinstance(value, int | float) or not math.isfinite(value):
            if self.recipe is None or self.recipe.accuracy is None or step.verdict.kind == "skip" or step.index in (
                    0, self.n):
                return 0.0
            bound = math.log(self.recipe.accuracy.confidence / (1 - self.recipe.accuracy.confidence))
            value = bound if step.verdict.kind == "bad" else -bound
        return -float(value) if self.spec.search.find_fix else float(value)

    def _finished_steps(self) -> list[StepRecord]:
        return self.state.steps()

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> SessionResult:
        """Bisect this level alone (levels.Bisection runs the levels and the fix stage), then close."""
        try:
            return self.bisect()
        finally:
            self.close()

    def close(self) -> None:
        """Free the evaluator's environments and what its executor runs, then the progress display
        and the journal; each cleanup runs even when the one before it is interrupted."""
        try:
            self.evaluator.close()
        finally:
            try:
                self.progress.close()
            finally:
                self.journal.close()

    def ended(self) -> EndRecord | None:
        """How this level's search ended, if it has (the journal's `end` record)."""
        return next(iter(self.journal.records(EndRecord)), None)

    def bisect(self) -> SessionResult:
        """Search until the culprit is found, narrowed down or an end is judged wrong, and journal
        how it ended; a session that ended already answers from its journal."""
        ended = self.ended()
        if ended is not None:
            return self._result_from_end(ended)
        self._recall_known()
        while True:
            problem = self.problem()
            decision = search.decide(problem, self.evidence())
            if not isinstance(decision, search.Next):
                if self._confirm_stored(decision):
                    continue
                break
            self._told = told_costs(problem)
            self._prefetch_next(problem, decision.queries)
            self._run_queries(decision.queries)
        return self._finish(decision)

    # -- verdicts from the store, confirmed ------------------------------------------------------

    def _stored_kinds(self) -> dict[int, set[str]]:
        return self._kinds(stored=True)

    def _kinds(self, *, stored: bool) -> dict[int, set[str]]:
        """Each position's verdict kinds, from the store's steps or from the ones run here (skips left out)."""
        kinds: dict[int, set[str]] = {}
        for step in self._finished_steps():
            if (step.stored is not None) == stored and step.verdict.kind != VerdictKind.SKIP:
                kinds.setdefault(step.index, set()).add(step.verdict.kind.value)
        return kinds

    def store_dropped(self) -> bool:
        """Whether a commit run fresh here disagreed with the store's verdict of it: then the store's
        verdicts no longer hold for this session, which neither reuses nor counts them (a fact of
        the journal, so a resumed session knows it too)."""
        fresh = self._kinds(stored=False)
        return any(index in fresh and fresh[index] != kinds for index, kinds in self._stored_kinds().items())

    def _confirm_stored(self, decision: search.Decision) -> bool:
        """Before answering from evidence that holds a stored verdict, run the positions the answer
        rests on fresh (a culprit and its parent, a narrowed range's two ends, an end judged wrong)
        where only the store judged them: a check may read what its key does not see (a script its
        script calls). True when it ran any, so the search decides again (without the store's
        verdicts if one disagreed)."""
        if self.memory is None or self.store_dropped():
            return False
        stored = self._stored_kinds()
        if not stored:
            return False
        if isinstance(decision, search.Found):
            resting = [decision.index - 1, decision.index]
        elif isinstance(decision, search.Narrowed):
            resting = [decision.lo, decision.hi]
        elif isinstance(decision, search.EndsWrong):
            resting = [0 if decision.which == "good" else self.n]
        else:
            return False
        fresh = self._kinds(stored=False)
        unconfirmed = [index for index in resting if index in stored and index not in fresh]
        if not unconfirmed:
            return False
        self.progress.note(f"running {len(unconfirmed)} commit(s) the answer rests on fresh: their verdicts came "
                           "from the verdict store")
        trials = self.recipe.trials.count if self.recipe else 1
        for index in unconfirmed:
            self._run_query(search.Query(index, trials))
        if self.store_dropped():
            self.progress.note("a commit run fresh disagrees with the verdict store's verdict of it: this session "
                               "drops the store's verdicts and searches again (the check reads something its key "
                               "does not see; --verdict-env names a variable, --no-verdict-store turns reuse off)")
        return True

    def _prefetch_next(self, problem: search.SearchProblem, queries: tuple[search.Query, ...]) -> None:
        """Start building what the search will ask next, whatever verdicts these queries get."""
        from bisect_npu.builders.prefetch import Prefetcher, speculative_queries

        builder = self.evaluator.builder
        if isinstance(builder, Prefetcher):
            wanted = speculative_queries(problem, self.evidence(), [q.index for q in queries])
            builder.prefetch([self.commit_at(i) for i in wanted])

    def _prefetch_saved(self) -> float | None:
        from bisect_npu.builders.prefetch import Prefetcher

        builder = self.evaluator.builder
        return builder.seconds_saved() if isinstance(builder, Prefetcher) else None

    def _run_queries(self, queries: tuple[search.Query, ...]) -> None:
        ordered = sorted(queries, key=lambda q: q.index != 0)  # the good end first: it is the reference
        if self._needs_reference() and ordered and ordered[0].index == 0:
            self._run_query(ordered.pop(0))
        run_in_slots(ordered, self.slots, self.state.next_trial, self._run_query, self.evaluator.executor.close)

    def _needs_reference(self) -> bool:
        return bool(self.recipe and self.recipe.reference.kind == "good_end")

    def _ensure_reference(self) -> None:
        if not self._needs_reference() or self.evaluator.reference is not None:
            return
        good_steps = [e for e in self._finished_steps() if e.index == 0]
        if not good_steps:
            self._run_query(search.Query(0, self.recipe.trials.count if self.recipe else 1))
            good_steps = [e for e in self._finished_steps() if e.index == 0]
        self.evaluator.set_reference([t for s in good_steps for t in s.trials])
        bad_steps = [e for e in self._finished_steps() if e.index == self.n]
        if bad_steps and self.evaluator.accuracy is not None and self.evaluator.accuracy.bad_end is None:
            self.evaluator.set_bad_reference([t for s in bad_steps for t in s.trials])

    def _run_query(self, query: search.Query, first_trial: int | None = None) -> None:
        if query.index != 0:
            self._ensure_reference()
        commit = self.commit_at(query.index)
        if self._reuse(query.index, commit):
            return
        left = self._candidates_left()
        self.progress.step_started(query.index, commit, self.titles.get(commit, ""), left,
                                   max(1, math.ceil(math.log2(left + 1))))
        noisy = self.mode == "noisy"
        trials = query.trials if noisy else (self.recipe.trials.count if self.recipe else 1)

        pending = self.state.pending_trials(query.index) if not noisy else []
        expected = trials * (len(self.recipe.cases) if self.recipe else 1)
        finished = itertools.count(len(pending) + 1)

        def on_trial(record: TrialRun) -> None:
            self.append(TrialRecord(index=query.index, commit=commit, **record.model_dump()))
            outcome = record.outcome.value if record.outcome else "run"
            self.progress.trial_finished(query.index, record.trial, outcome, next(finished), expected)

        as_reference = query.index == 0 and self._needs_reference()
        first = self.state.next_trial(query.index) if first_trial is None else first_trial
        result = self.evaluator.evaluate(EvaluationRequest(commit, trials, tuple(pending), on_trial, judge_each=noisy,
                                                           first_trial=first, as_reference=as_reference,
                                                           as_bad_end=query.index == self.n))
        self._record_step(query.index, result)
        self._keep(query.index, result)

    def _build_key(self, index: int) -> str:
        """The position's build key as the verdict store keys it ("" where every commit is its own build)."""
        return self.build_keys[index] if self.build_keys is not None else ""

    def _recall_known(self) -> None:
        """Before the search decides anything, journal every verdict the store holds for this
        range, so the search starts from what earlier sessions judged and spends its runs on the
        rest (asked one by one, a cost-aware search could wander to commits they never judged)."""
        if self.memory is None:
            return
        judged = {step.index for step in self._finished_steps()}
        reused = sum(self._reuse(index, self.commit_at(index)) for index in range(self.n + 1) if index not in judged)
        if reused:
            self.progress.note(f"{reused} verdict(s) reused from the verdict store {self.memory.store.path}")

    def _reuse(self, index: int, commit: str) -> bool:
        """Journal the verdict store's verdict of `commit` instead of testing it, once per position
        (noisy mode: the search asks for more trials there if it wants them). The good end of a
        recipe whose reference is the good end always runs: its observations are the reference."""
        if self.memory is None or (index == 0 and self._needs_reference()) or self.store_dropped():
            return False
        key = self._build_key(index)
        with self._store_lock:
            if any(step.index == index and step.stored for step in self._finished_steps()):
                return False
            reused = self.memory.recall(commit, key)
            if reused is None:
                return False
            self.append(StepRecord(index=index, commit=commit, title=self.titles.get(commit, ""),
                                   build=BuildInfo(how="stored", key=key or None), verdict=reused.verdict,
                                   told=self._told, stored=reused.stored))
        self.progress.step_finished(index, commit, reused.verdict, 0.0)
        return True

    def _keep(self, index: int, result: StepResult) -> None:
        """Keep this session's verdict of the commit in the verdict store: in noisy mode with the
        tally of every trial this session ran there (not the ones it reused)."""
        if self.memory is None:
            return
        key = self._build_key(index)
        with self._store_lock:  # the tally counted and kept at once: a slot's later count is never overwritten
            if self.mode == "noisy":
                outcomes = self.state.outcomes(index)
                good, bad = outcomes.count(VerdictKind.GOOD), outcomes.count(VerdictKind.BAD)
                kind = VerdictKind.BAD if bad else VerdictKind.GOOD if good else VerdictKind.SKIP
                verdict = result.verdict.model_copy(update={"kind": kind})
            else:
                verdict = result.verdict
                good, bad = int(verdict.kind == VerdictKind.GOOD), int(verdict.kind == VerdictKind.BAD)
            self.memory.keep(result.commit, key, verdict, good, bad)

    def _record_step(self, index: int, result: StepResult) -> None:
        self.append(StepRecord(index=index, commit=result.commit, title=self.titles.get(result.commit, ""),
                                build=result.build, verdict=result.verdict, trials=result.trials,
                                seconds=result.seconds, told=self._told))
        self.progress.step_finished(index, result.commit, result.verdict, result.seconds)

    def append(self, record: JournalRecord) -> None:
        with self._lock:
            self.journal.append(record)
            self.state.apply(record)

    def _candidates_left(self) -> int:
        return self.state.candidates_left(self.n)

    # -- the end --------------------------------------------------------------------------------

    def _finish(self, decision: search.Decision) -> SessionResult:
        steps = len(self._finished_steps())
        if isinstance(decision, search.Found):
            culprit = self.commit_at(decision.index)
            message = sentences.found(self.spec.level.name, culprit, self.titles.get(culprit, ""),
                                      find_fix=self.spec.search.find_fix, scope=scope_of(self.spec.level))
            end = EndRecord(status="found", culprit=culprit, index=decision.index, confidence=decision.confidence,
                            figures=decision.figures)
            result = SessionResult("found", EXIT_FOUND, self.journal.session_dir, culprit=culprit,
                                   message=message, steps=steps)
        elif isinstance(decision, search.Narrowed):
            lo, hi = self.commit_at(decision.lo), self.commit_at(decision.hi)
            message = sentences.narrowed(lo, hi, decision.hi - decision.lo, find_fix=self.spec.search.find_fix)
            end = EndRecord(status="narrowed", lo=lo, hi=hi, lo_index=decision.lo, hi_index=decision.hi,
                            figures=decision.figures)
            result = SessionResult("narrowed", EXIT_NARROWED, self.journal.session_dir, range=(lo, hi),
                                   message=message, steps=steps)
        else:
            assert isinstance(decision, search.EndsWrong)
            end_index = 0 if decision.which == "good" else self.n
            untested = None
            if self.evidence().get(end_index, search.Evidence()).skipped:
                untested = next((e.verdict.reason for e in reversed(self._finished_steps()) if e.index == end_index),
                                "")
            log, output = self._end_run(end_index)
            message = sentences.ends_wrong(decision.which, self.spec.range.good, self.spec.range.bad,
                                           find_fix=self.spec.search.find_fix, untested=untested,
                                           noisy=self.mode == "noisy", figures=decision.figures,
                                           oracle="recipe" if self.recipe is not None else "command", log=log)
            end = EndRecord(status="ends_wrong", which=decision.which, figures=decision.figures)
            result = SessionResult("ends_wrong", EXIT_ENDS_WRONG, self.journal.session_dir, message=message,
                                   steps=steps, output_tail=output)
        self.append(end.model_copy(update={"message": message, "prefetch_saved_s": self._prefetch_saved()}))
        return result

    def _result_from_end(self, end: EndRecord) -> SessionResult:
        steps = len(self._finished_steps())
        code = EXIT_CODES[end.status]
        rng = (end.lo, end.hi) if end.status == "narrowed" and end.lo and end.hi else None
        output = self._end_run(0 if end.which == "good" else self.n)[1] if end.status == "ends_wrong" else ""
        return SessionResult(end.status, code, self.journal.session_dir, culprit=end.culprit, range=rng,
                             message=end.message, steps=steps, output_tail=output)

    def _end_run(self, end_index: int) -> tuple[Path | None, str]:
        """The log of the last run at an end and the last lines of its output: where a user finds
        why the end was judged as it was (a missing file, a traceback, the wrong interpreter)."""
        step = next((e for e in reversed(self._finished_steps()) if e.index == end_index and e.trials), None)
        if step is None or not step.trials[-1].log:
            return None, ""
        log = self.evaluator.abs(step.trials[-1].log)
        return log, tail(log, END_OUTPUT_LINES)

    def verdict_of(self, commit: str) -> Verdict:
        """Evaluate any commit (a fix applied on the bad end) with this session's recipe or command."""
        self._ensure_reference()
        trials = self.recipe.trials.count if self.recipe else 1
        if self.mode == "noisy" and self.recipe is not None:
            return self.evaluator.evaluate(EvaluationRequest(commit, max(trials, 10), judge_each=True)).verdict
        return self.evaluator.evaluate(EvaluationRequest(commit, trials)).verdict

