"""A bisection session: the search over one level's candidates (releases or commits), their
evaluation, and the journal of both.

The loop lives here: decide, run the round, journal. `opening/open_session.py` starts a session or reopens one
from its journal, `state` keeps what the journal says as it grows, `slots` runs a round over the
slots, `reference` keeps what the oracle compares with, `verdict_reuse` is the verdict store's part
(what it recalls, keeps and confirms), `end_messages` says how it ended; `bisection` runs the sessions of
a bisection's levels and its fix stage. The journal is the only state that outlives a process: a
session killed at any moment resumes from it without redoing a finished step or trial.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from pathlib import Path
from typing import Literal

import git

from bisect_npu import interrupts, search
from bisect_npu.builders.base import Builder, tail
from bisect_npu.builders.prefetch import Prefetcher, speculative_queries
from bisect_npu.defaults import CONFIDENCE
from bisect_npu.execute.base import Executor
from bisect_npu.execute.inprocess import Oracle
from bisect_npu.journal import DEFAULT_ROOT, Journal
from bisect_npu.level import scope_of
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.costs import measured_costs, told_costs
from bisect_npu.orchestration.ending import end_messages
from bisect_npu.orchestration.ending.result import EXIT_CODES, EXIT_ENDS_WRONG, EXIT_FOUND, EXIT_NARROWED, SessionResult
from bisect_npu.orchestration.opening.open_session import Opened, open_journal, open_new
from bisect_npu.orchestration.opening.reference import References, step_trials
from bisect_npu.orchestration.opening.session_spec import SessionSpec, earlier_runs_for_search, earlier_runs_spec
from bisect_npu.orchestration.opening.state import SessionState, accuracy_weight
from bisect_npu.orchestration.opening.verdict_reuse import Reused, SessionVerdicts, VerdictReuse
from bisect_npu.orchestration.running.candidate import CandidateJournal, run_candidate
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator, StepResult, until_sure
from bisect_npu.orchestration.running.slots import first_trials, run_in_slots
from bisect_npu.progress import Progress
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import (
    BuildInfo,
    EndRecord,
    JournalRecord,
    RetryRecord,
    RetryRun,
    StepRecord,
    TrialRecord,
    TrialRun,
)

END_OUTPUT_LINES = 10  # what an end judged wrong shows of its run's output


def search_mode_for(recipe: Recipe | None, asked: Literal["exact", "noisy"] | None = None,
                    ) -> Literal["exact", "noisy", "likelihood"]:
    """The search's mode for a recipe: an accuracy recipe's steps, and a throughput recipe's against
    its good end whose steps stop when sure, are measurements, so the search weighs each one's
    likelihood ratio; otherwise the mode asked (--mode), else the recipe's."""
    if recipe is not None and (recipe.accuracy is not None or (until_sure(recipe) and asked != "noisy")):
        return "likelihood"
    if asked:
        return asked
    return recipe.trials.mode if recipe else "exact"


class Session:
    """One bisection over a resolved range, driven step by step from the journal."""

    def __init__(self, journal: Journal, spec: SessionSpec, repo: git.Repo | None, recipe: Recipe | None,
                 evaluator: Evaluator, progress: Progress, reuse: VerdictReuse | None = None) -> None:
        self.journal = journal
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
        self._told: dict[str, float] = {}  # the costs the search was told for the round being run
        self.earlier_runs = earlier_runs_spec(spec, recipe)
        confidence = recipe.accuracy.confidence if recipe is not None and recipe.accuracy is not None else None
        if until_sure(recipe):  # a stored throughput verdict weighs what a step stopped at the oracle's bound said
            assert recipe is not None and recipe.oracle.throughput is not None
            confidence = recipe.oracle.throughput.confidence
        self.state = SessionState(self.mode == "noisy", spec.search.find_fix, journal.entries,
                                  weigh=accuracy_weight(confidence, self.n, find_fix=spec.search.find_fix))
        # A resumed session goes on with the host's failure rate its journaled attempts give.
        evaluator.retry.host.add(self.state.host_record.failures, self.state.host_record.successes)
        self.references = References(recipe, evaluator, functools.partial(self._runs_at, 0),
                                     functools.partial(self._runs_at, self.n))
        always_run = frozenset({0} if self.references.from_good_end else ())  # the reference's runs
        self.verdicts: SessionVerdicts[int] | None = None if reuse is None else SessionVerdicts(
            lambda _index: reuse, self.state, progress, always_run=always_run,
            outcomes=self.state.outcomes if self.mode == "noisy" else None)

    @classmethod
    def _of(cls, opened: Opened) -> Session:
        return cls(opened.journal, opened.spec, opened.repo, opened.recipe, opened.evaluator, opened.progress,
                   opened.reuse)

    @classmethod
    def start(cls, spec: SessionSpec, session_dir: Path | None = None, root: Path = DEFAULT_ROOT,
              progress: Progress | None = None, builder: Builder | None = None,
              executor: Executor | None = None, parent: Path | None = None, oracle: Oracle | None = None) -> Session:
        """A new session (`open_session.open_new`)."""
        return cls._of(open_new(spec, session_dir, root, progress, builder, executor, parent, oracle))

    @classmethod
    def resume(cls, session_dir: Path | None = None, root: Path = DEFAULT_ROOT, progress: Progress | None = None,
               builder: Builder | None = None, executor: Executor | None = None,
               oracle: Oracle | None = None, accept_changed_command: bool = False) -> Session:
        """An interrupted session, from its journal (`open_session.open_journal`)."""
        return cls._of(open_journal(session_dir, root, progress, builder, executor, oracle, accept_changed_command))

    # -- what the search is asked -----------------------------------------------------------------

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

    @property
    def confidence(self) -> float:
        """The posterior the search must reach (--confidence, else the recipe's)."""
        return self.spec.search.confidence or (self.recipe.trials.confidence if self.recipe else CONFIDENCE)

    def problem(self) -> search.SearchProblem:
        confidence = self.confidence
        earlier = (earlier_runs_for_search(self.earlier_runs, find_fix=self.spec.search.find_fix)
                   if self.earlier_runs else None)
        # Costs in the search's unit, measured from the journal, so a resumed session weighs as
        # the interrupted one did. Which groups have an image is asked of the builder: those are
        # real, whoever built them.
        groups = self.build_groups
        load_cost, build_cost, overlay_cost = measured_costs(
            self.journal.entries, self.recipe.trials if self.recipe else None, noisy=self.mode == "noisy",
            batches=self.evaluator.batches, grouped=bool(groups))
        mode = search_mode_for(self.recipe, self.spec.search.mode)
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
        """The search's evidence: without the verdict store's verdicts once one was contradicted."""
        dropped = self.verdicts is not None and self.verdicts.dropped()
        return self.state.evidence(without_stored=dropped)

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
        if self.verdicts is not None:
            judged = self.state.judged()
            self.verdicts.recall_all([index for index in range(self.n + 1) if index not in judged],
                                     lambda index: self._reuse(index, self.commit_at(index)))
        while True:
            interrupts.raise_if_received()
            problem = self.problem()
            decision = search.decide(problem, self.evidence())
            if not isinstance(decision, search.Next):
                if self.verdicts is not None and self.verdicts.confirm(search.rests_on(decision, self.n),
                                                                        self._run_fresh):
                    continue
                break
            self._told = told_costs(problem)
            self._prefetch_next(problem, decision.queries)
            self._run_queries(decision.queries)
        return self._finish(decision)

    def _prefetch_next(self, problem: search.SearchProblem, queries: tuple[search.Query, ...]) -> None:
        """Start building what the search will ask next, whatever verdicts these queries get."""
        builder = self.evaluator.builder
        if isinstance(builder, Prefetcher):
            wanted = speculative_queries(problem, self.evidence(), [q.index for q in queries])
            builder.prefetch([self.commit_at(i) for i in wanted])

    def _prefetch_saved(self) -> float | None:
        builder = self.evaluator.builder
        return builder.seconds_saved() if isinstance(builder, Prefetcher) else None

    def _run_queries(self, queries: tuple[search.Query, ...]) -> None:
        first, rest = self.references.first(queries)
        if first is not None:
            self._run_query(first)
        run_in_slots(rest, self.slots, self._run_query, self.evaluator.executor.close,
                     functools.partial(first_trials, next_trial=self.state.next_trial))

    def _runs_at(self, index: int) -> list[TrialRun] | None:
        """The trials journaled at a position; None where it has not run."""
        steps = [step for step in self.state.steps() if step.index == index]
        return [trial for step in steps for trial in step.trials] if steps else None

    def _run_good_end(self, trials: int) -> None:
        self._run_query(search.Query(0, trials))

    def _run_fresh(self, index: int) -> None:
        """Run a position this session took from the verdict store, with the recipe's trials."""
        self._run_query(search.Query(index, self.recipe.trials.count if self.recipe else 1))

    def _run_query(self, query: search.Query, first_trial: int | None = None) -> None:
        interrupts.raise_if_received()
        if query.index != 0:
            self.references.ensure(self._run_good_end)
        commit = self.commit_at(query.index)
        if self._reuse(query.index, commit):
            return
        left = self.state.candidates_left(self.n)
        self.progress.step_started(query.index, commit, self.titles.get(commit, ""), left,
                                   max(1, math.ceil(math.log2(left + 1))))
        noisy = self.mode == "noisy"
        as_reference = query.index == 0 and self.references.from_good_end
        trials = query.trials if noisy else step_trials(self.recipe, as_reference)

        pending = self.state.pending_trials(query.index) if not noisy else []
        expected = trials * (len(self.recipe.cases) if self.recipe else 1)
        finished = itertools.count(len(pending) + 1)

        def on_trial(record: TrialRun) -> None:
            self.append(TrialRecord(index=query.index, commit=commit, **record.model_dump()))
            outcome = record.outcome.value if record.outcome else "run"
            self.progress.trial_finished(query.index, record.trial, outcome, next(finished), expected)

        def on_retry(retry: RetryRun) -> None:
            self.append(RetryRecord(index=query.index, commit=commit, **retry.model_dump()))

        first = self.state.next_trial(query.index) if first_trial is None else first_trial
        result = run_candidate(self.evaluator, EvaluationRequest(
            commit, trials, tuple(pending), judge_each=noisy, first_trial=first, as_reference=as_reference,
            as_bad_end=query.index == self.n, at_end=query.index in (0, self.n)),
            CandidateJournal(commit[:10], on_trial, on_retry, self.state.pending_retries(query.index)),
            self.progress).result
        self._record_step(query.index, result)
        if self.verdicts is not None:
            self.verdicts.keep(query.index, result.commit, self._build_key(query.index), result.verdict)

    def _build_key(self, index: int) -> str:
        """The position's build key as the verdict store keys it ("" where every commit is its own build)."""
        return self.build_keys[index] if self.build_keys is not None else ""

    def _reuse(self, index: int, commit: str) -> bool:
        """Journal the verdict store's verdict of `commit` instead of testing it, where it holds one."""
        if self.verdicts is None:
            return False
        key = self._build_key(index)

        def journal(reused: Reused) -> None:
            self.append(StepRecord(index=index, commit=commit, title=self.titles.get(commit, ""),
                                   build=BuildInfo(how="stored", key=key or None), verdict=reused.verdict,
                                   told=self._told, stored=reused.stored))

        reused = self.verdicts.recall(index, commit, key, journal)
        if reused is None:
            return False
        self.progress.step_finished(index, commit, reused.verdict, 0.0)
        return True

    def _record_step(self, index: int, result: StepResult) -> None:
        self.append(StepRecord(index=index, commit=result.commit, title=self.titles.get(result.commit, ""),
                                build=result.build, verdict=result.verdict, trials=result.trials,
                                seconds=result.seconds, told=self._told, retries=self.state.pending_retries(index)))
        self.progress.step_finished(index, result.commit, result.verdict, result.seconds)

    def append(self, record: JournalRecord) -> None:
        with self._lock:
            self.journal.append(record)
            self.state.apply(record)

    # -- the end --------------------------------------------------------------------------------

    def _finish(self, decision: search.Decision) -> SessionResult:
        steps = len(self.state.steps())
        if isinstance(decision, search.Found):
            culprit = self.commit_at(decision.index)
            message = end_messages.found(self.spec.level.name, culprit, self.titles.get(culprit, ""),
                                         find_fix=self.spec.search.find_fix, scope=scope_of(self.spec.level))
            message += end_messages.short_of(decision.confidence, self.confidence)
            end = EndRecord(status="found", culprit=culprit, index=decision.index, confidence=decision.confidence,
                            figures=decision.figures)
            result = SessionResult("found", EXIT_FOUND, self.journal.session_dir, culprit=culprit,
                                   message=message, steps=steps)
        elif isinstance(decision, search.Narrowed):
            lo, hi = self.commit_at(decision.lo), self.commit_at(decision.hi)
            message = end_messages.narrowed(lo, hi, decision.hi - decision.lo, find_fix=self.spec.search.find_fix,
                                            skipped=self._skipped_between(decision.lo, decision.hi))
            end = EndRecord(status="narrowed", lo=lo, hi=hi, lo_index=decision.lo, hi_index=decision.hi,
                            figures=decision.figures)
            result = SessionResult("narrowed", EXIT_NARROWED, self.journal.session_dir, range=(lo, hi),
                                   message=message, steps=steps)
        else:
            assert isinstance(decision, search.EndsWrong)
            end_index = 0 if decision.which == "good" else self.n
            untested = None
            if self.evidence().get(end_index, search.Evidence()).skipped:
                untested = next((e.verdict.reason for e in reversed(self.state.steps()) if e.index == end_index),
                                "")
            log, output = self._end_run(end_index)
            message = end_messages.ends_wrong(decision.which, self.spec.range.good, self.spec.range.bad,
                                              find_fix=self.spec.search.find_fix, untested=untested,
                                              noisy=self.mode == "noisy", figures=decision.figures,
                                              oracle="recipe" if self.recipe is not None else "command", log=log,
                                              base=self.base if self.base != self.journal.header.range.good else None)
            end = EndRecord(status="ends_wrong", which=decision.which, figures=decision.figures)
            result = SessionResult("ends_wrong", EXIT_ENDS_WRONG, self.journal.session_dir, message=message,
                                   steps=steps, output_tail=output)
        self.append(end.model_copy(update={"message": message, "prefetch_saved_s": self._prefetch_saved()}))
        return result

    def _result_from_end(self, end: EndRecord) -> SessionResult:
        steps = len(self.state.steps())
        code = EXIT_CODES[end.status]
        rng = (end.lo, end.hi) if end.status == "narrowed" and end.lo and end.hi else None
        output = self._end_run(0 if end.which == "good" else self.n)[1] if end.status == "ends_wrong" else ""
        return SessionResult(end.status, code, self.journal.session_dir, culprit=end.culprit, range=rng,
                             message=end.message, steps=steps, output_tail=output)

    def _skipped_between(self, lo: int, hi: int) -> list[tuple[str, str]]:
        """Each commit strictly between two positions whose last step was a skip, with its reason."""
        last = {step.index: step for step in self.state.steps() if lo < step.index < hi}
        return [(self.commit_at(i), last[i].verdict.reason) for i in sorted(last)
                if last[i].verdict.kind == VerdictKind.SKIP]

    def _end_run(self, end_index: int) -> tuple[Path | None, str]:
        """The log of the last run at an end and the last lines of its output: where a user finds
        why the end was judged as it was (a missing file, a traceback, the wrong interpreter)."""
        step = next((e for e in reversed(self.state.steps()) if e.index == end_index and e.trials), None)
        if step is None or not step.trials[-1].log:
            return None, ""
        log = self.evaluator.abs(step.trials[-1].log)
        return log, tail(log, END_OUTPUT_LINES)

    def verdict_of(self, commit: str) -> Verdict:
        """Evaluate any commit (a fix applied on the bad end) with this session's recipe or command."""
        self.references.ensure(self._run_good_end)
        trials = self.recipe.trials.count if self.recipe else 1
        if self.mode == "noisy" and self.recipe is not None:
            return self.evaluator.evaluate(EvaluationRequest(commit, max(trials, 10), judge_each=True)).verdict
        return self.evaluator.evaluate(EvaluationRequest(commit, trials)).verdict

