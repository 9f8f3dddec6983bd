"""A bisection session: the search over one level's candidates (releases or commits), their
evaluation, and the journal of both.

A session is the session engine (engine.py: the loop, and how a candidate is judged and journaled)
over this space: its decide function (`search.decide`, the likelihood search among its modes), a
position's commit, label, trials and records. `opening/open_session.py` starts a session or reopens
one from its journal, `state` keeps what the journal says as it grows, `reference` keeps what the
oracle compares with, `verdict_reuse` is the verdict store's part
(what it recalls, keeps and confirms), `end_messages` says how it ended; `bisection` runs the sessions of
a bisection's levels and its fix stage. The journal is the only state that outlives a process: a
session killed at any moment resumes from it without redoing a finished step or trial.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
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
from bisect_npu.orchestration import engine
from bisect_npu.orchestration.costs import measured_costs, told_costs
from bisect_npu.orchestration.ending import end_messages
from bisect_npu.orchestration.ending.result import EXIT_CODES, EXIT_ENDS_WRONG, EXIT_FOUND, EXIT_NARROWED, SessionResult
from bisect_npu.orchestration.opening import throughput_search
from bisect_npu.orchestration.opening.open_session import Opened, open_journal, open_new
from bisect_npu.orchestration.opening.reference import References, reference_at_new_end, step_trials
from bisect_npu.orchestration.opening.session_opening import folded
from bisect_npu.orchestration.opening.session_spec import SessionSpec, earlier_runs_for_search, earlier_runs_spec
from bisect_npu.orchestration.opening.state import SessionState, accuracy_weight, answer_log_lr
from bisect_npu.orchestration.opening.throughput_search import ThroughputSearch
from bisect_npu.orchestration.opening.verdict_reuse import SessionVerdicts, VerdictReuse
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator, levels_search, until_sure
from bisect_npu.progress import Progress
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import (
    EndRecord,
    JournalRecord,
    RetryRecord,
    StepRecord,
    TrialRecord,
    TrialRun,
)

Answer = search.Found | search.Narrowed | search.EndsWrong  # what the commit search ends with

END_OUTPUT_LINES = 10  # what an end judged wrong shows of its run's output


def search_mode_for(recipe: Recipe | None, asked: Literal["exact", "noisy"] | None = None,
                    throughput: ThroughputSearch | None = None) -> Literal["exact", "noisy", "likelihood", "levels"]:
    """The search's mode for a recipe: a throughput recipe against its good end searches every run
    together (levels mode, `oracle.throughput.search: levels`, one run a step; `throughput`: the
    session's search as its journal keeps it, over the recipe's); an accuracy recipe's steps, and a
    throughput recipe's whose steps stop when sure (`search: per_step`), are measurements, so the
    search weighs each one's likelihood ratio; otherwise the mode asked (--mode), else the recipe's."""
    if levels_search(recipe, throughput) and asked != "noisy":
        return "levels"
    if recipe is not None and (recipe.accuracy is not None or (until_sure(recipe) and asked != "noisy")):
        return "likelihood"
    if asked:
        return asked
    return recipe.trials.mode if recipe else "exact"


def earlier_figures(earlier: search.EarlierLevels) -> dict[str, float]:
    """The earlier runs the levels search counted at each end (the failing nightly's at the bad
    end), for the journal's end record and the report: their count and mean, per end given."""
    figures: dict[str, float] = {}
    for end, values in zip(("good", "bad"), earlier, strict=True):
        if values:
            figures |= {f"earlier_{end}_runs": float(len(values)), f"earlier_{end}_mean": sum(values) / len(values)}
    return figures


def levels_ends_said(evidence: Mapping[int, search.Evidence], n: int, under_line: float, rising: bool = False) -> str:
    """Why the levels search judged the end with the symptom not to show it (the bad end; `rising`,
    a fix search: the old end): its runs, the other end's, and how likely it is that its mean lies
    under the other end's line."""
    (shows, line_end), name = ((0, n), "new") if rising else ((n, 0), "good")
    low, line = evidence[shows].measured, evidence[line_end].measured
    return (f"its {len(low)} run(s) average {sum(low) / len(low):.1f} tokens/s against the {name} end's "
            f"{sum(line) / len(line):.1f} over {len(line)} run(s); P(under the {name} end's line) = {under_line:.1%}")


def first_trials(queries: Sequence[search.Query], next_trial: Callable[[int], int]) -> list[int]:
    """Each query's first trial number, handed out before a round runs over the slots: a noisy
    round may put several slots on one commit, which must never share a trial number (a seed)."""
    firsts: list[int] = []
    following: dict[int, int] = {}
    for query in queries:
        first = following.get(query.index, next_trial(query.index))
        firsts.append(first)
        following[query.index] = first + query.trials
    return firsts


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
        # Levels mode: one run a step, every run the search's evidence; the verdict store keeps a
        # step's kind, not its run, so it is not asked.
        self.throughput_search = throughput_search.pinned(journal.header, journal.entries, recipe)
        if note := throughput_search.other_search_note(recipe, self.throughput_search):
            progress.note(note)
        self.levels = self.search_mode == "levels"
        evaluator.levels = self.levels
        confidence = recipe.accuracy.confidence if recipe is not None and recipe.accuracy is not None else None
        if until_sure(recipe):  # a stored throughput verdict weighs what a step stopped at the oracle's bound said
            assert recipe is not None and recipe.oracle.throughput is not None
            confidence = recipe.oracle.throughput.confidence
        self.state = folded(SessionState(self.mode == "noisy", spec.search.find_fix, journal.entries,
                                         weigh=accuracy_weight(confidence, self.n, find_fix=spec.search.find_fix),
                                         ends=(0, self.n), measured=self.levels), evaluator)
        if until_sure(recipe):  # the spread pooled over the finished steps' runs, as the interrupted run had it
            for step in self.state.steps():
                evaluator.remember_runs(step.commit, step.trials)
        self.references = References.at_end(recipe, evaluator, self._runs_at, self.reference_end, self.n)
        if evaluator.accuracy is not None:  # a candidate's side rates conditioned on those judged, by position
            evaluator.accuracy.positions = {self.commit_at(index): index for index in range(self.n + 1)}
        for step in self.state.steps():  # a resumed accuracy session: the samples each commit ran, its side
            evaluator.recall_accuracy_step(step.commit, step.trials, step.verdict)
        always_run = frozenset({self.reference_end} if self.references.from_good_end else ())  # the reference's runs
        self.verdicts: SessionVerdicts[int] | None = None if reuse is None or self.levels else SessionVerdicts(
            lambda _index: reuse, self.state, progress, always_run=always_run,
            outcomes=self.state.outcomes if self.mode == "noisy" else None)

    @classmethod
    def _of(cls, opened: Opened) -> Session:
        return cls(opened.journal, opened.spec, opened.repo, opened.recipe, opened.evaluator, opened.progress,
                   opened.reuse)

    @classmethod
    def start(cls, spec: SessionSpec, session_dir: Path | None = None, root: Path = DEFAULT_ROOT,
              progress: Progress | None = None, builder: Builder | None = None,
              executor: Executor | None = None, parent: Path | None = None, oracle: Oracle | None = None,
              searching: ThroughputSearch | None = None) -> Session:
        """A new session (`open_session.open_new`)."""
        return cls._of(open_new(spec, session_dir, root, progress, builder, executor, parent, oracle, searching))

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
    def search_mode(self) -> Literal["exact", "noisy", "likelihood", "levels"]:
        """The search's mode (`search_mode_for`), a throughput session's searching as it started."""
        return search_mode_for(self.recipe, self.spec.search.mode, self.throughput_search)

    @property
    def rising(self) -> bool:
        """A fix searched in levels mode: the low level at the old end, restored from the fix on."""
        return self.levels and self.spec.search.find_fix

    @property
    def reference_end(self) -> int:
        """The end whose runs are the reference: the good end's (0), but the new end's (`n`) in a fix
        search of a throughput line (`reference.reference_at_new_end`): the old end lies under it."""
        return self.n if reference_at_new_end(self.recipe, self.spec.search.find_fix) else 0

    @property
    def confidence(self) -> float:
        """The posterior the search must reach (--confidence, else the recipe's)."""
        return self.spec.search.confidence or (self.recipe.trials.confidence if self.recipe else CONFIDENCE)

    def problem(self) -> search.SearchProblem:
        confidence = self.confidence
        earlier = (earlier_runs_for_search(self.earlier_runs, find_fix=self.spec.search.find_fix)
                   if self.earlier_runs else None)
        # Costs in the search's unit, measured from the journal's records as folded, so a resumed
        # session weighs as the interrupted one did. Which groups have an image is asked of the builder: those are
        # real, whoever built them.
        groups = self.build_groups
        load_cost, build_cost, overlay_cost = measured_costs(
            self.state.seconds, self.recipe.trials if self.recipe else None, noisy=self.mode == "noisy",
            batches=self.evaluator.batches, grouped=bool(groups), levels=self.levels)
        mode = self.search_mode
        throughput = self.recipe.oracle.throughput if self.recipe is not None else None
        return search.SearchProblem(n=self.n, mode=mode, check_ends=self.check_ends,
                                    slots=self.slots, confidence=confidence, earlier_runs=earlier,
                                    load_cost=load_cost, build_cost=build_cost, build_groups=groups,
                                    prebuilt_groups=self.prebuilt_groups(), overlay_cost=overlay_cost,
                                    weights=self.weights, answer_log_lr=answer_log_lr(self.recipe),
                                    threshold=throughput.threshold if throughput is not None else 0.97,
                                    baseline=throughput.baseline if throughput is not None else None,
                                    earlier_levels=self.earlier_levels(), rising=self.rising)

    def earlier_levels(self) -> search.EarlierLevels:
        """The recipe's runs at the ends made before the session, as the levels search takes them
        (`SearchProblem.earlier_levels`): (the last good nightly's, the failing nightly's), the end
        whose runs draw the line first; in a fix search the failing one is the old end's."""
        throughput = self.recipe.oracle.throughput if self.recipe is not None else None
        if throughput is None or self.search_mode != "levels":
            return search.NO_EARLIER
        return throughput.earlier_levels()

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
        """How this level's search ended, if it has (the journal's `end` record, as folded)."""
        return self.state.ended()

    def bisect(self) -> SessionResult:
        """Search until the culprit is found, narrowed down or an end is judged wrong, and journal
        how it ended; a session that ended already answers from its journal (`engine.drive`)."""
        space: engine.CandidateSpace[search.Query, Answer, SessionResult] = self
        return engine.drive(space)

    # -- the space the engine asks ----------------------------------------------------------------

    def answered(self) -> SessionResult | None:
        ended = self.ended()
        return self._result_from_end(ended) if ended is not None else None

    def open(self) -> None:
        """The verdict store's verdicts of every position not judged yet, before the first decision."""
        if self.verdicts is not None:
            judged = self.state.judged()
            self.verdicts.recall_all([index for index in range(self.n + 1) if index not in judged],
                                     lambda index: engine.recall(self._candidate(search.Query(index, 1)), self.append,
                                                                 self.verdicts) is not None)

    def decide(self) -> engine.Round[search.Query] | Answer:
        problem = self.problem()
        decision = search.decide(problem, self.evidence())
        if not isinstance(decision, search.Next):
            return decision
        self._told = told_costs(problem)
        self._prefetch_next(problem, decision.queries)
        first, rest = self.references.first(decision.queries)
        return engine.Round(rest, alone=first, firsts=functools.partial(first_trials, next_trial=self.state.next_trial))

    def confirm(self, answer: Answer) -> bool:
        return self.verdicts is not None and self.verdicts.confirm(search.rests_on(answer, self.n), self._run_fresh)

    def stop_runs(self) -> None:
        self.evaluator.executor.close()

    def _prefetch_next(self, problem: search.SearchProblem, queries: tuple[search.Query, ...]) -> None:
        """Start building what the search will ask next, whatever verdicts these queries get."""
        builder = self.evaluator.builder
        if isinstance(builder, Prefetcher):
            wanted = speculative_queries(problem, self.evidence(), [q.index for q in queries])
            builder.prefetch([self.commit_at(i) for i in wanted])

    def _prefetch_saved(self) -> float | None:
        builder = self.evaluator.builder
        return builder.seconds_saved() if isinstance(builder, Prefetcher) else None

    def _runs_at(self, index: int) -> list[TrialRun] | None:
        """The trials journaled at a position; None where it has not run."""
        steps = [step for step in self.state.steps() if step.index == index]
        return [trial for step in steps for trial in step.trials] if steps else None

    def _run_reference_end(self, trials: int) -> None:
        self.run_query(search.Query(self.reference_end, trials))

    def _run_reference_again(self) -> None:
        """A step at the reference end asked by an accuracy bad end's step (its verdict found the
        good end's mean the looser): journaled as its own step, its round pooled onto the good end's."""
        self.run_query(search.Query(self.reference_end, 1))

    def _run_fresh(self, index: int) -> None:
        """Run a position this session took from the verdict store, with the recipe's trials."""
        self.run_query(search.Query(index, self.recipe.trials.count if self.recipe else 1))

    def run_query(self, query: search.Query, first_trial: int | None = None) -> None:
        """Judge a position (`engine.judge`), the reference end first where its runs are the reference."""
        interrupts.raise_if_received()
        if query.index != self.reference_end:
            self.references.ensure(self._run_reference_end)
        engine.judge(self._candidate(query, first_trial), self.append, self.progress, self.verdicts)

    def _candidate(self, query: search.Query, first_trial: int | None = None,
                   ) -> engine.Candidate[int, JournalRecord]:
        """A position as the engine judges it: its records keyed by index and commit, its steps
        told on the progress lines."""
        index, commit = query.index, self.commit_at(query.index)
        title, key = self.titles.get(commit, ""), self._build_key(query.index)
        noisy = self.mode == "noisy"
        as_reference = index == self.reference_end and self.references.from_good_end
        trials = query.trials if noisy else step_trials(self.recipe, as_reference, self.levels)
        pending = self.state.pending_trials(index) if not noisy else []
        expected = trials * (len(self.recipe.cases) if self.recipe else 1)
        finished = itertools.count(len(pending) + 1)

        def started() -> None:
            left = self.state.candidates_left(self.n)
            self.progress.step_started(index, commit, title, left, max(1, math.ceil(math.log2(left + 1))))

        def said(record: JournalRecord) -> None:
            if isinstance(record, TrialRecord):
                outcome = record.outcome.value if record.outcome else "run"
                self.progress.trial_finished(index, record.trial, outcome, next(finished), expected)
            elif isinstance(record, StepRecord):
                self.progress.step_finished(index, commit, record.verdict, record.seconds)

        def evaluation() -> tuple[Evaluator, EvaluationRequest]:
            first = self.state.next_trial(index) if first_trial is None else first_trial
            as_bad_end = index == self.n - self.reference_end
            return self.evaluator, EvaluationRequest(
                commit, trials, tuple(pending), judge_each=noisy, first_trial=first, as_reference=as_reference,
                as_bad_end=as_bad_end, good_end_again=self._run_reference_again if as_bad_end else None)

        return engine.Candidate(
            key=index, commit=commit, build_key=key, label=commit[:10], evaluation=evaluation,
            retried=self.state.pending_retries(index), given_up=self.state.given_up(index),
            end=engine.HostStop(f"{commit[:12]} (an end of the range)", "`bisect-npu resume`")
            if index in (0, self.n) else None,
            trial=lambda run: TrialRecord(index=index, commit=commit, **run.model_dump()),
            retry=lambda retry: RetryRecord(index=index, commit=commit, **retry.model_dump()),
            record=StepRecord, record_keys={"index": index, "commit": commit, "title": title, "told": self._told},
            started=started, said=said)

    def _build_key(self, index: int) -> str:
        """The position's build key as the verdict store keys it ("" where every commit is its own build)."""
        return self.build_keys[index] if self.build_keys is not None else ""

    def append(self, record: JournalRecord) -> None:
        with self._lock:
            self.journal.append(record)
            self.state.apply(record)

    # -- the end --------------------------------------------------------------------------------

    def finish(self, decision: Answer) -> SessionResult:
        """Journal how the search ended (its `end` record) and say it."""
        steps = len(self.state.steps())
        if self.levels:
            # the nightly's earlier runs at each end (counted, or beside ends judged wrong on the
            # session's runs alone), and why the search stopped: the confidence reached, or no
            # commit left to run again
            asked = {} if isinstance(decision, search.EndsWrong) else {"confidence_asked": self.confidence}
            decision = replace(decision, figures={**decision.figures, **asked,
                                                  **earlier_figures(self.earlier_levels())})
        if isinstance(decision, search.Found):
            culprit = self.commit_at(decision.index)
            message = end_messages.found(self.spec.level.name, culprit, self.titles.get(culprit, ""),
                                         find_fix=self.spec.search.find_fix, scope=scope_of(self.spec.level))
            end = EndRecord(status="found", culprit=culprit, index=decision.index, confidence=decision.confidence,
                            figures=decision.figures)
            result = SessionResult("found", EXIT_FOUND, self.journal.session_dir, culprit=culprit,
                                   message=message, steps=steps)
        elif isinstance(decision, search.Narrowed):
            lo, hi = self.commit_at(decision.lo), self.commit_at(decision.hi)
            guess = self.commit_at(int(decision.figures["best_guess"])) if "best_guess" in decision.figures else None
            if guess is not None:
                message = end_messages.best_guess(lo, hi, decision.hi - decision.lo, guess, self.titles.get(guess, ""),
                                                  reached=decision.figures["posterior"], asked=self.confidence,
                                                  find_fix=self.spec.search.find_fix)
            else:
                message = end_messages.narrowed(lo, hi, decision.hi - decision.lo, find_fix=self.spec.search.find_fix,
                                                skipped=self._skipped_between(decision.lo, decision.hi))
            end = EndRecord(status="narrowed", lo=lo, hi=hi, lo_index=decision.lo, hi_index=decision.hi,
                            best_guess=guess, figures=decision.figures)
            result = SessionResult("narrowed", EXIT_NARROWED, self.journal.session_dir, range=(lo, hi),
                                   best_guess=guess, message=message, steps=steps)
        else:
            assert isinstance(decision, search.EndsWrong)
            end_index = 0 if decision.which == "good" else self.n
            why = next((e.verdict.reason for e in reversed(self.state.steps()) if e.index == end_index), "")
            if self.levels and "under_line" in decision.figures:
                why = levels_ends_said(self.evidence(), self.n, decision.figures["under_line"], self.rising)
            untested = why if self.evidence().get(end_index, search.Evidence()).skipped else None
            log, output = self._end_run(end_index)
            message = end_messages.ends_wrong(decision.which, self.spec.range.good, self.spec.range.bad,
                                              find_fix=self.spec.search.find_fix, untested=untested, judged_why=why,
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
                             best_guess=end.best_guess, message=end.message, steps=steps, output_tail=output)

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
        self.references.ensure(self._run_reference_end)
        trials = self.recipe.trials.count if self.recipe else 1
        if self.mode == "noisy" and self.recipe is not None:
            return self.evaluator.evaluate(EvaluationRequest(commit, max(trials, 10), judge_each=True)).verdict
        return self.evaluator.evaluate(EvaluationRequest(commit, trials)).verdict

