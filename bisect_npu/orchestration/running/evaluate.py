"""Evaluate one candidate: acquire its environment, run the bad case, let the oracle judge.

The session asks for commits; this room turns a commit into observations and a Verdict, and
tells the journal about every finished trial so an interrupted step is never redone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Literal, NoReturn, TypeVar

from bisect_npu import oracle
from bisect_npu.builders.base import Builder, BuildFailed, Environment, ImageGone
from bisect_npu.builders.failures import BuildUnreachable
from bisect_npu.defaults import RETRY_BACKOFF_S, TRIAL_TIMEOUT_S
from bisect_npu.errors import InfrastructureError
from bisect_npu.execute.base import Executor, RunResult, observation_path, probe_log_path, probe_stem, run_node_path
from bisect_npu.execute.card_memory import CardWait
from bisect_npu.observations import Observation, TimeoutIs, Verdict, VerdictKind
from bisect_npu.oracle import sequential
from bisect_npu.oracle.throughput import sample_of
from bisect_npu.orchestration.running.accuracy import AccuracySteps, load_from, next_round_trial, role_of
from bisect_npu.orchestration.running.earlier_results import (
    Earlier,
    control_ids,
    control_stages,
    control_standing,
    disagreement,
    earlier_for,
    earlier_settings,
)
from bisect_npu.orchestration.running.infrastructure import InfrastructureFailure, RetryPolicy, classify_run
from bisect_npu.orchestration.running.judging import (
    REASON_FILE_ENV,
    TIMEOUT_IS_BAD_NOTE,
    command_reason,
    command_verdict,
    tally,
    with_command_reason,
)
from bisect_npu.orchestration.running.observation_watch import ObservationWatcher, node_named, poll
from bisect_npu.orchestration.running.probe_requests import probe_request, trial_seed
from bisect_npu.probe.harness import HARNESS_FAILED_EXIT
from bisect_npu.probe.request import write_json_atomic
from bisect_npu.recipe.schema import CaseSpec, EarlierEndSpec, Recipe
from bisect_npu.records import COMMAND_CASE, BuildInfo, NodeBuild, RetryRun, TrialRun
from bisect_npu.search.retry_policy import rate_said

_T = TypeVar("_T")


@dataclass(frozen=True)
class EvaluationRequest:
    """What one evaluation of a commit is asked to do."""

    commit: str
    # New trials per case (noisy mode); in exact mode the step's total, `done` included.
    trials: int
    # Trials journaled before an interruption: re-used, never run again (exact mode).
    done: Sequence[TrialRun] = ()
    # Hears of each trial the moment it finishes (the session journals it).
    on_trial: Callable[[TrialRun], None] | None = None
    # Noisy mode: judge each trial alone and tally them; else judge the step's trials together.
    judge_each: bool = False
    # Where trial numbers start, so repeated trials of one commit never share a seed.
    first_trial: int = 0
    # The good end of a recipe whose reference is the good end: its own observations become the
    # reference before they are judged (token matching holds trivially; the other oracles judge).
    as_reference: bool = False
    # The bad end of an accuracy recipe: its per-sample results are the other half of the reference.
    as_bad_end: bool = False
    # The accuracy bad end's: runs a step at the good end (the session's), where the bad end's
    # verdict asks for the good end's next round first (orchestration/running/accuracy.py).
    good_end_again: Callable[[], None] | None = None
    # Hears of each attempt that failed on the host (the session journals it).
    on_retry: Callable[[RetryRun], None] | None = None
    # Attempts journaled before an interruption: the attempt numbers go on from them.
    retried: Sequence[RetryRun] = ()
    # Hears why the candidate was left unjudged once the host's failures spent a trial's retries.
    on_unjudged: Callable[[str], None] | None = None
    # Hears of the node builds each run on other machines ran on (--executor ray); the evaluator's own.
    on_nodes: Callable[[Sequence[NodeBuild]], None] | None = None
    # Hears of each environment acquired again because its image left the engine; the evaluator's own.
    on_acquired_again: Callable[[Environment], None] | None = None

    def report(self, record: TrialRun) -> None:
        if self.on_trial is not None:
            self.on_trial(record)

    def report_retry(self, retry: RetryRun) -> None:
        if self.on_retry is not None:
            self.on_retry(retry)

    def report_nodes(self, result: RunResult) -> None:
        if self.on_nodes is not None:
            self.on_nodes(result.nodes)


# A candidate's image gone from the engine before a run (ImageGone): acquired again at most this
# often for one run; past that, something keeps removing it, and the session stops (exit 5).
IMAGE_REACQUIRES = 2
LEVELS_STOPPED = "levels search"  # a levels-mode step's `stopped` figure: the search weighs its one run


def until_sure(recipe: Recipe | None) -> bool:
    """Whether a step's trials stop as soon as its verdict is sure (oracle/sequential.py): a
    throughput line drawn from the good end's runs, in exact mode, `oracle.throughput.sequential`."""
    if recipe is None or (spec := recipe.oracle.line_from_end()) is None:
        return False
    return spec.sequential and recipe.trials.mode == "exact"


def levels_search(recipe: Recipe | None, search: Literal["levels", "per_step"] | None = None) -> bool:
    """Whether a session searches a throughput recipe in levels mode (search/two_levels.py): a line
    drawn from the good end's runs, in exact mode, `oracle.throughput.search: levels` (the default;
    `search`: the session's own, as its journal keeps it, over the recipe's). Each step is then one
    run, and the search weighs every run of every commit together. Under --find-fix the history
    rises (search/rising.py) and the line is drawn from the new end's runs (`Session.reference_end`)."""
    if recipe is None or (spec := recipe.oracle.line_from_end()) is None:
        return False
    return (search or spec.search) == "levels" and recipe.trials.mode == "exact"


class _HostGaveUp(Exception):
    """A trial's retries were spent on the host: the candidate's other trials are not run (the host
    stopped working), and it is skipped with `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class StepResult:
    """A finished evaluation of one commit: its build, its trials and the verdict."""

    commit: str
    verdict: Verdict
    build: BuildInfo
    trials: list[TrialRun] = field(default_factory=list)
    seconds: float = 0.0


def build_record(env: Environment | None, failure: BuildFailed | None = None,
                 nodes: Sequence[NodeBuild] = ()) -> BuildInfo:
    if failure is not None:
        return BuildInfo(how="failed", log=failure.log_path, log_tail=failure.log_tail, error=str(failure))
    assert env is not None
    record = BuildInfo(how=env.how, key=env.build_key, image=env.image, seconds=env.seconds, log=env.log_path,
                       run_env=env.run_env, compiled_changes=env.compiled_changes, venv_made=env.venv_made or None)
    return ran_on(record, nodes) if nodes else record


COSTS = ("reused", "overlay", "built")  # a node's build, cheapest first


def ran_on(record: BuildInfo, nodes: Sequence[NodeBuild]) -> BuildInfo:
    """A step whose runs went to other machines (--executor ray), where the driver built nothing:
    its build is what the nodes ran. Each node's build once (its first: a later batch there reuses
    it), `how` and `seconds` the costliest node's (a step one node built cost a build), `image` the
    one name every node ran (none where they differ: each node names its own)."""
    first: dict[tuple[str, str | None, str | None], NodeBuild] = {}
    for node in nodes:
        first.setdefault((node.node, node.image, node.image_id), node)
    kept = list(first.values())
    costliest = max(kept, key=lambda node: COSTS.index(node.how) if node.how in COSTS else -1)
    images = {node.image for node in kept}
    return record.model_copy(update={"how": costliest.how, "seconds": costliest.seconds,
                                     "image": images.pop() if len(images) == 1 else None, "nodes": kept})


class Evaluator:
    """Runs candidates for one session: a builder, an executor, and either a recipe or a command."""

    def __init__(self, builder: Builder, executor: Executor, session_dir: Path, *,
                 recipe: Recipe | None = None, command: list[str] | None = None,
                 timeout_s: float = TRIAL_TIMEOUT_S, timeout_is: TimeoutIs | None = None,
                 retries: int | None = None, cards: CardWait | None = None,
                 earlier: Mapping[str, EarlierEndSpec] | None = None) -> None:
        if (recipe is None) == (command is None):
            raise ValueError("an Evaluator needs exactly one of a recipe or a command")
        self.builder = builder
        self.executor = executor
        self.session_dir = session_dir
        self.recipe = recipe
        self.command = command
        self.timeout_s = timeout_s
        # A trial past the timeout: the option's word, else the recipe's, else skip.
        self.timeout_is: TimeoutIs = timeout_is or (recipe.trials.timeout_is if recipe else None) or "skip"
        # A run that failed on the host: retried as the host's failure rate says, at most the
        # option's count, else the recipe's, where one is given.
        count = retries if retries is not None else recipe.trials.retries if recipe else None
        self.retry = RetryPolicy(count, recipe.trials.retry_backoff_s if recipe else RETRY_BACKOFF_S)
        self.cards = cards  # an NPU host's cards, waited for before each probe run
        self.earlier = dict(earlier or {})  # --earlier-results: an end's results by role, over the recipe's
        self.reference: list[Observation] | None = None
        self.bad_end_runs: list[Observation] = []  # a throughput step's other level, once the bad end ran
        # Every throughput run of the session's finished steps, by commit then observation file:
        # the run-to-run spread each later step pools (oracle/sequential.py's `pooled_spread`).
        self.session_runs: dict[str, dict[str, float]] = {}
        self.accuracy = AccuracySteps(recipe) if recipe is not None and recipe.accuracy is not None else None
        # A throughput session in levels mode (`levels_search`, set by the session): each step is one
        # run, judged against the good end's runs so far, all of which are the reference.
        self.levels = False

    def close(self) -> None:
        """End of the session: stop anything the executor still runs, then free the cached
        environments (even when stopping is interrupted). In that order: a builder waits for the
        builds its prefetch threads run, which the executor's stop ends (an interrupt would
        otherwise wait for a compile to finish), and worktrees go once nothing runs in them."""
        try:
            self.executor.close()
        finally:
            self.builder.close()

    def rel(self, path: str | Path | None) -> str | None:
        """Paths in the journal are relative to the session, so a session directory can be moved."""
        if path is None:
            return None
        try:
            return str(Path(path).resolve().relative_to(self.session_dir.resolve()))
        except ValueError:
            return str(path)

    def abs(self, path: str) -> Path:
        return (self.session_dir / path) if not Path(path).is_absolute() else Path(path)

    def step_dir(self, commit: str) -> Path:
        return self.session_dir / "steps" / commit[:12]

    def evaluate(self, request: EvaluationRequest) -> StepResult:
        """Evaluate the request's commit (what each field asks: EvaluationRequest); a trial whose
        retries the host's failures spent skips the candidate, its other trials not run."""
        ran: list[TrialRun] = list(request.done)
        told = request.on_trial

        def on_trial(record: TrialRun) -> None:
            ran.append(record)
            if told is not None:
                told(record)

        return self._evaluate(replace(request, on_trial=on_trial), ran)

    def _evaluate(self, request: EvaluationRequest, ran: list[TrialRun]) -> StepResult:
        nodes: list[NodeBuild] = []  # what the runs on other machines ran on
        again: list[Environment] = []  # acquired again where the image left the engine (`_on_image`)
        request = replace(request, on_nodes=nodes.extend, on_acquired_again=again.append)
        commit = request.commit
        started = time.monotonic()
        step_dir = self.step_dir(commit)
        if not request.judge_each and self.accuracy is None and (self._all_done(request.trials, request.done)
                                                                 or self._sure_already(request)):
            # Every trial was journaled before an interruption: judge them, build nothing again.
            records = list(request.done)
            if request.as_reference and self.command is None:
                self._take_reference(records)
            return StepResult(commit, self._step_verdict(request, records),
                              BuildInfo(how="journaled", seconds=0.0), records, round(time.monotonic() - started, 3))
        try:
            env = self._acquire(request, step_dir)
        except BuildFailed as failure:
            verdict = Verdict(kind=VerdictKind.SKIP, reason=f"build failed: {failure}",
                              figures={"log_tail": failure.log_tail[-2000:]}, trials=0)
            return StepResult(commit, verdict, build_record(None, failure), list(request.done),
                              round(time.monotonic() - started, 3))
        try:
            if self.command is not None:
                records = self._run_commands(request, env)
                verdict = self._verdict(records, request.judge_each)
            elif self.accuracy is not None:
                records, verdict = self._run_accuracy(request, env)
            else:
                records = self._run_trials(request, env)
                if request.as_reference:
                    self._take_reference(records)
                verdict = self._step_verdict(request, records)
        except _HostGaveUp as gave_up:
            records, verdict = ran, Verdict(kind=VerdictKind.SKIP, reason=gave_up.reason, trials=len(ran))
        finally:
            for held in [env, *again]:  # each acquire its release (a dependency's layer holds one per acquire)
                self.builder.release(held)
        if again:  # the step's build is the last one, and cost them all
            env = again[-1].model_copy(update={"seconds": round(sum(e.seconds for e in [env, *again]), 3)})
        return StepResult(commit, verdict, build_record(env, nodes=nodes), records,
                          round(time.monotonic() - started, 3))

    def _acquire(self, request: EvaluationRequest, step_dir: Path) -> Environment:
        """The commit's environment, built again while the build fails on the network and the retry
        budget lasts (each failed attempt journaled, its log kept aside); spent, at any step, the
        run stops (InfrastructureError): an outage is no verdict on any commit. Attempts journaled
        before an interrupt count as a probe run's do (`_run_group`)."""
        return self._built(request, lambda: self.builder.acquire(request.commit, step_dir))

    def _built(self, request: EvaluationRequest, attempt: Callable[[], _T]) -> _T:
        """`attempt()` (a build, or a run that builds where it runs: `--executor ray` builds on the
        node) again while it fails on the network, under `_acquire`'s rules."""
        journaled = sum(1 for r in request.retried if r.stage == "build")
        spent = self.retry.spent(journaled)
        attempts = 0
        while True:
            started = time.monotonic()
            try:
                return attempt()
            except BuildUnreachable as unreachable:
                attempts += 1
                number = journaled + attempts
                log = (self._keep_log(str(unreachable.log_path), number) if unreachable.log_path else None) or \
                    self.rel(unreachable.log_path) or ""
                request.report_retry(RetryRun(case_id="", trial=request.first_trial, attempt=number, kind="network",
                                              cause=unreachable.failure.cause, log=log, stage="build",
                                              seconds=round(time.monotonic() - started, 3)))
                if self.retry.given_up(spent + attempts):
                    tried = self.retry.attempts_said(spent + attempts)
                    raise InfrastructureError(f"{request.commit[:12]} could not be built, {tried} failed on the "
                                              f"network ({rate_said(self.retry.host.record)}): "
                                              f"{unreachable.failure.message(self.abs(log) if log else None)}") \
                        from None
                time.sleep(self.retry.delay(spent + attempts))

    def _on_image(self, request: EvaluationRequest, env: Environment, run: Callable[[], _T]) -> _T:
        """`run()` (a run of `env`, under `_built`'s rules); where the candidate's image left the
        container engine since its acquire (ImageGone: another session's prune or a removal, or its
        name moved), that is a cache miss: the commit is acquired again (built, or its own image
        named again; the build log says why) and the run goes ahead, at most IMAGE_REACQUIRES times.
        The image's name is the commit's, so `run` finds the new image by it."""
        reacquired = 0
        while True:
            try:
                return self._built(request, run)
            except ImageGone as gone:
                reacquired += 1
                if reacquired > IMAGE_REACQUIRES:
                    raise ImageGone(f"{gone}; acquired again {IMAGE_REACQUIRES} times and gone again each time: "
                                    "something on this container engine keeps removing it") from gone
                self._acquire_again(request, env, gone)

    def _acquire_again(self, request: EvaluationRequest, env: Environment, gone: ImageGone) -> None:
        """The commit acquired again for `_on_image`, under the same image name as `env` (else `gone`
        stands); a build that fails now stops the session (it built before: the host's doing)."""
        try:
            again = self._acquire(request, self.step_dir(request.commit))
        except BuildFailed as failure:
            raise InfrastructureError(f"{gone}, and building it again failed: {failure}") from failure
        how: str = again.how
        if again.log_path is None:  # made where it runs (--executor ray, its node named in `gone`): the step's
            how = "where it runs next"  # build log is written here, as a builder of this host writes its own
            again = again.model_copy(update={
                "log_path": str(self.step_dir(request.commit) / f"build-{request.commit[:12]}.log")})
        if request.on_acquired_again is not None:
            request.on_acquired_again(again)
        if again.image != env.image:
            raise gone
        log_path = Path(again.log_path or "")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a", encoding="utf-8") as log:
            log.write(f"# acquired again ({how}) before its run: {gone}; a cache miss\n")

    def _verdict(self, records: list[TrialRun], judge_each: bool) -> Verdict:
        """Noisy mode tallies each trial's verdict; exact mode judges the step's trials together
        (a command runs once there: its exit status is the verdict)."""
        if judge_each:
            return tally(records)
        if self.command is not None:
            return Verdict(kind=records[0].outcome or VerdictKind.SKIP, reason=records[0].reason)
        return self._judge_step(records)

    def _take_reference(self, records: list[TrialRun]) -> None:
        """The good end's step's runs become the reference: in levels mode they join its earlier
        steps' runs (each step there is one run), else they are the whole reference."""
        if not self.levels:
            self.set_reference(records)
            return
        self.reference = [*(self.reference or []), *self._observed(records)]

    def _step_verdict(self, request: EvaluationRequest, records: list[TrialRun]) -> Verdict:
        """A recipe step's verdict: the sequential test's where the step stopped when sure; in
        levels mode its one run against the good end's runs so far (the search weighs the value)."""
        if self.levels and not request.judge_each and self.command is None and self.accuracy is None:
            return self._level_run(self._verdict(records, False))
        if not self._sequential(request):
            return self._verdict(records, request.judge_each)
        assert self.recipe is not None and self.recipe.oracle.throughput is not None
        spec, observations = self.recipe.oracle.throughput, self._observed(records)
        if request.as_reference:
            stop = sequential.reference_known(spec, observations, len(records), request.trials) or "cap"
            self.remember_runs(request.commit, records, observations)
            return sequential.said(sequential.judge_reference(spec, self._judge_step(records)), stop, len(records))
        if not observations:
            return self._judge_step(records)
        verdict = sequential.judge_sequential(spec, observations, self.reference, len(records), request.trials,
                                              self._bad_end(request), self.pooled())[0]
        if request.as_bad_end:
            self.bad_end_runs = observations
        self.remember_runs(request.commit, records, observations)
        return verdict

    def _level_run(self, verdict: Verdict) -> Verdict:
        """A levels-mode step's verdict said as what it is: a measurement the search weighs with
        every other run; its kind (against the line of the good end's runs so far) only tells the
        reader which side it looks like."""
        samples = verdict.figures.get("throughput_samples")
        if verdict.kind == VerdictKind.SKIP or not samples:
            return verdict
        figures = {**verdict.figures, "stopped": LEVELS_STOPPED, "trials_run": len(samples)}
        runs = "one run" if len(samples) == 1 else f"{len(samples)} runs"  # a fix verified on the bad end: its count
        reason = (f"{', '.join(f'{s:.1f}' for s in samples)} tokens/s, {runs} (levels search); "
                  f"{verdict.kind.value} against the line {figures.get('line', 0.0):.1f} so far")
        return verdict.model_copy(update={"figures": figures, "reason": reason})

    def pooled(self) -> sequential.Spread | None:
        """The run-to-run spread pooled over every commit of the session's finished steps (the ends'
        included); None (the ends' runs alone) where those hold more, as where a search set the
        reference itself without running the good end here."""
        pool = sequential.pooled_spread(list(runs.values()) for runs in self.session_runs.values())
        ends = sequential.pooled_spread([sequential.throughputs(self.reference or []),
                                         sequential.throughputs(self.bad_end_runs)])
        return pool if pool.df > ends.df else None

    def remember_runs(self, commit: str, records: Sequence[TrialRun],
                      observations: Sequence[Observation] | None = None) -> None:
        """A finished step's throughput runs join the pooled spread (a resumed session gives its
        journaled steps' runs here, so it pools what the interrupted one did). `observations`: the
        records' observations where the step has loaded them already (`_observed`'s order), so
        their files are not read twice; else they are loaded here."""
        runs = self.session_runs.setdefault(commit, {})
        keys = [record.observation for record in records if record.observation]
        if observations is None:
            loaded = {key: Observation.load(self.abs(key)) for key in keys if key not in runs}
        else:
            loaded = dict(zip(keys, observations, strict=True))
        for key, observation in loaded.items():
            value = sample_of(observation)
            if key not in runs and value is not None:
                runs[key] = value

    def _sequential(self, request: EvaluationRequest) -> bool:
        return self.command is None and not request.judge_each and not self.levels and until_sure(self.recipe)

    def _observed(self, records: Sequence[TrialRun]) -> list[Observation]:
        return [Observation.load(self.abs(r.observation)) for r in records if r.observation]

    def _wanted(self, request: EvaluationRequest, records: Sequence[TrialRun]) -> int:
        """Trials the step runs next where it stops when sure (0: it is settled)."""
        assert self.recipe is not None and self.recipe.oracle.throughput is not None
        reference = None if request.as_reference else self.reference
        return sequential.trials_wanted(self.recipe.oracle.throughput, self._observed(records), reference,
                                        len(records), request.trials, request.as_reference, self._bad_end(request),
                                        self.pooled())

    def _bad_end(self, request: EvaluationRequest) -> list[Observation]:
        """The bad end's runs a throughput step is weighed against (the bad end's own step: none)."""
        return [] if request.as_bad_end else self.bad_end_runs

    def _sure_already(self, request: EvaluationRequest) -> bool:
        """Whether the trials journaled before an interruption already settled a step that stops when sure."""
        return bool(request.done) and self._sequential(request) and len(self.recipe.cases if self.recipe else ()) == 1 \
            and self._wanted(request, request.done) == 0

    def _all_done(self, trials: int, done: Sequence[TrialRun]) -> bool:
        """Whether `done` already holds `trials` trials of every case (exact mode's step total)."""
        if not done:
            return False
        cases = [COMMAND_CASE] if self.recipe is None else [case.id for case in self.recipe.cases]
        return all(sum(1 for r in done if r.case_id == case) >= trials for case in cases)

    def _run_commands(self, request: EvaluationRequest, env: Environment) -> list[TrialRun]:
        """The user command once per trial; each exit status is that trial's verdict."""
        assert self.command is not None
        commit = request.commit
        records = list(request.done)
        wanted = request.trials if request.judge_each else max(0, request.trials - len(request.done))
        for trial in range(request.first_trial, request.first_trial + wanted):
            log_path = self.step_dir(commit) / f"command-t{trial}.log"
            reason_path = (self.step_dir(commit) / f"command-t{trial}.reason").resolve()
            reason_path.unlink(missing_ok=True)
            extra = {"BISECT_NPU_COMMIT": commit, "BISECT_NPU_TRIAL": str(trial), REASON_FILE_ENV: str(reason_path)}
            result = self._on_image(request, env, partial(self.executor.run_command, env, self.command, log_path,
                                                          self.timeout_s, extra))
            request.report_nodes(result)
            said = command_reason(reason_path)
            verdict = with_command_reason(command_verdict(result, self.timeout_is, said, self.timeout_s), said)
            record = TrialRun(case_id=COMMAND_CASE, trial=trial, seconds=result.seconds,
                              log=self.rel(result.log_path) or "", outcome=verdict.kind, reason=verdict.reason)
            request.report(record)
            records.append(record)
        return records

    def _run_trials(self, request: EvaluationRequest, env: Environment) -> list[TrialRun]:
        assert self.recipe is not None
        records = list(request.done)
        if self._sequential(request):
            return self._run_until_sure(request, env)
        for case in self.recipe.cases:
            already = sum(1 for r in request.done if r.case_id == case.id)
            wanted = request.trials if request.judge_each else max(0, request.trials - already)
            numbers = list(range(request.first_trial, request.first_trial + wanted))
            groups = [numbers] if self.batches and numbers else [[n] for n in numbers]
            for group in groups:
                records += self._run_group(request, env, case, group)
        return records

    def _run_until_sure(self, request: EvaluationRequest, env: Environment) -> list[TrialRun]:
        """Each case's trials, a few at a time, until oracle/sequential.py says its step is settled
        (`request.trials`: the most); the numbers go on after the journaled ones."""
        assert self.recipe is not None
        records = list(request.done)
        for case in self.recipe.cases:
            mine = [r for r in records if r.case_id == case.id]
            while wanted := self._wanted(request, mine):
                first = max((r.trial + 1 for r in mine), default=request.first_trial)
                numbers = list(range(first, first + wanted))
                groups = [numbers] if self.batches else [[n] for n in numbers]
                for group in groups:
                    got = self._run_group(request, env, case, group)
                    mine += got
                    records += got
        return records

    @property
    def batches(self) -> bool:
        """Whether a case's trials at one commit share one engine start (one probe run); layer
        dumps hook the model for good, so they need an engine per trial."""
        return bool(self.recipe and self.recipe.trials.batch and not self.recipe.capture.layers)

    def _run_accuracy(self, request: EvaluationRequest, env: Environment) -> tuple[list[TrialRun], Verdict]:
        """An accuracy step: rounds (one trial each) until the oracle is clear (orchestration/running/accuracy.py);
        at an end with earlier results, their control share first (orchestration/running/earlier_results.py)."""
        assert self.accuracy is not None and self.recipe is not None
        case = self.recipe.cases[0]
        role = role_of(request.as_reference, request.as_bad_end)

        def run_round(trial: int, sample_ids: Sequence[str] | None) -> TrialRun:
            return self._run_group(request, env, case, [trial], sample_ids)[0]

        # the good end's extra round asked by the bad end's step runs the whole dataset here
        earlier = None if self.accuracy.good_end_again else earlier_for(self.recipe, role, request.commit, self.earlier)
        before: list[TrialRun] = []
        done, first, aside = list(request.done), request.first_trial, ""
        if earlier is not None and earlier.samples is not None:
            taken, aside = self._from_earlier(request, earlier, run_round)
            if isinstance(taken, tuple):
                return taken
            before = taken
            done, first = done[len(taken):], taken[-1].trial + 1
        elif earlier is not None:
            aside = f"earlier results {earlier.source} set aside: {earlier.why_not}"
        records, verdict = self.accuracy.step(request.commit, role, done, run_round, first,
                                              load_from(self.session_dir), request.good_end_again)
        if aside:
            verdict = verdict.model_copy(update={"reason": f"{verdict.reason} ({aside}; the whole dataset ran)"})
        if request.as_reference:
            self.reference = self.accuracy.good_end
        return before + records, verdict

    def _from_earlier(self, request: EvaluationRequest, earlier: Earlier,
                      run_round: Callable[[int, Sequence[str] | None], TrialRun],
                      ) -> tuple[tuple[list[TrialRun], Verdict] | list[TrialRun], str]:
        """The end judged from its earlier results once the control share agrees: (records,
        verdict); else the control rounds' records (the step goes on over the whole dataset) and
        why. The control share runs in stages (`control_stages`): the rest only when one of the
        first stage's samples differs."""
        assert self.accuracy is not None and self.recipe is not None and self.recipe.accuracy is not None
        settings = earlier_settings(self.recipe, self.earlier)
        assert settings is not None and earlier.samples is not None
        role = role_of(request.as_reference, request.as_bad_end)
        stages = control_stages([s.id for s in earlier.samples], settings.control_share, request.commit)
        load = load_from(self.session_dir)

        def ran(done: TrialRun) -> list[str]:
            return [s.id for s in load(done.observation).samples or []] if done.observation else []
        share = control_ids([s.id for s in earlier.samples], settings.control_share, request.commit)
        if request.done and len(stages) > 1 and ran(request.done[0]) == share:
            stages = [share]  # a step an older version began: its one control round ran the whole share
        controls: list[TrialRun] = []
        checked: list[Observation] = []
        stands: bool | None = None
        for number, wanted in enumerate(stages):
            done = request.done[number] if number < len(request.done) else None
            reused = done if done is not None and ran(done) == wanted else None
            control = reused or run_round(next_round_trial(controls, request.first_trial), wanted)
            controls.append(control)
            if not control.observation:
                return (controls, Verdict(kind=VerdictKind.SKIP, reason=control.reason or "the control round wrote "
                                          "no observation", trials=len(controls))), ""
            checked.append(load(control.observation))
            stands = control_standing(earlier.samples, [s for o in checked for s in o.samples or []],
                                      settings.max_disagreement, complete=number == len(stages) - 1)
            if stands is not None:
                break
        differ, of = disagreement(earlier.samples, [s for o in checked for s in o.samples or []])
        if not stands:
            return controls, (f"earlier results {earlier.source} set aside: {differ} of {of} control samples came "
                              "out otherwise here")
        control = controls[-1]
        resumed = len(request.done) > len(controls) and all(
            a is b for a, b in zip(controls, request.done[:len(controls)], strict=True))
        kept = request.done[len(controls)] if resumed else None
        if kept is None or not kept.observation:
            path = self.step_dir(request.commit).resolve() / f"earlier-{role}.json"
            observation = Observation(commit=request.commit, recipe=self.recipe.name,
                                      run_digest=self.recipe.run_digest(), case_id=control.case_id,
                                      trial=control.trial + 1, samples=earlier.samples,
                                      extra={"earlier_results": earlier.source, "samples_run": 0})
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(str(path), observation.model_dump(mode="json"))
            kept = TrialRun(case_id=control.case_id, trial=control.trial + 1, observation=self.rel(path),
                            reason=f"earlier results {earlier.source}")
            request.report(kept)
        assert kept.observation is not None
        observations = [load(kept.observation), *checked]
        verdict = self.accuracy.judge(observations, role, final=True)
        self.accuracy.remember(role, observations)
        if request.as_reference:
            self.reference = observations
        reason = (f"from the earlier results {earlier.source} ({differ} of {of} control samples differ): "
                  f"{verdict.reason}")
        return ([*controls, kept], verdict.model_copy(update={"reason": reason})), ""

    def _run_group(self, request: EvaluationRequest, env: Environment, case: CaseSpec,
                   numbers: list[int], sample_ids: Sequence[str] | None = None) -> list[TrialRun]:
        """The trials `numbers` of `case` in one probe run, run again (its unfinished trials) while
        it fails on the host and the retry budget lasts; spent, the unfinished trials are skips naming
        every attempt's cause and the candidate's other trials are not run. Attempts journaled
        for these trials before an interrupt count against the budget; where they spent it (the run
        stopped on them, exit 5, and was resumed once the host was freed) a new budget starts."""
        records: list[TrialRun] = []
        attempts: list[RetryRun] = []
        journaled = sum(1 for r in request.retried if r.stage == "run" and r.case_id == case.id and r.trial in numbers)
        spent = self.retry.spent(journaled)
        unsettled = journaled  # failed attempts not yet followed by a finished trial
        while True:
            left = numbers[len(records):]
            held = self.cards.wait() if self.cards is not None else ""  # before the engine starts on them
            got, result, log, node = self._probe_run(request, env, case, left, sample_ids)
            records += got
            if got:
                self.retry.ran(unsettled, sum(1 for trial in got if trial.outcome != VerdictKind.SKIP))
                unsettled = 0
            failure = classify_run(result.returncode, result.timed_out, result.log_path) \
                if len(records) < len(numbers) else None
            if failure is None:
                break
            trial = numbers[len(records)]
            earlier = sum(1 for r in request.retried if r.stage == "run" and r.case_id == case.id and r.trial == trial)
            number = earlier + len(attempts) + 1
            cause = f"{failure} ({held})" if held else str(failure)
            attempt = RetryRun(case_id=case.id, trial=trial, attempt=number, kind=failure.kind, cause=cause,
                               log=self._keep_log(result.log_path, number) or log, seconds=round(result.seconds, 3))
            request.report_retry(attempt)
            attempts.append(attempt)
            unsettled += 1
            if self.retry.given_up(spent + len(attempts)):
                self._unjudged(request, case, numbers[len(records):], failure, attempts, attempt.log, spent)
            time.sleep(self.retry.delay(spent + len(attempts)))
        return records + self._missing(request, case, numbers[len(records):], result, log, node)

    def _keep_log(self, log_path: str, attempt: int) -> str | None:
        """A failed attempt's probe log moved aside (`...attempt-N.log`), so the next attempt does
        not write over it; its path as the journal keeps it (None when it cannot be moved)."""
        source = Path(log_path)
        kept = source.with_name(f"{source.stem}.attempt-{attempt}{source.suffix}")
        try:
            source.replace(kept)
        except OSError:
            return None
        return self.rel(kept)

    def _unjudged(self, request: EvaluationRequest, case: CaseSpec, numbers: list[int],
                  failure: InfrastructureFailure, attempts: list[RetryRun], log: str,
                  before: int = 0) -> NoReturn:
        """Trials the host kept from running through every attempt (`before` of them journaled
        before a resume): skips, and the candidate's stop (`_HostGaveUp`)."""
        tried = self.retry.attempts_said(before + len(attempts))
        reason = f"{failure} ({tried}: " + "; ".join(f"{a.attempt}. {a.kind}" for a in attempts) + ")"
        if request.on_unjudged is not None:
            request.on_unjudged(f"{tried} failed on the host: {failure} (probe log {log}); more failures in a row "
                                f"than a working host gives ({self.retry.said()})")
        for n in numbers:
            request.report(TrialRun(case_id=case.id, trial=n, log=log, outcome=VerdictKind.SKIP, reason=reason[:500]))
        raise _HostGaveUp(reason[:500])

    def _probe_run(self, request: EvaluationRequest, env: Environment, case: CaseSpec, numbers: list[int],
                   sample_ids: Sequence[str] | None) -> tuple[list[TrialRun], RunResult, str, str | None]:
        """One probe run for the trials `numbers` of `case`; each trial is judged and reported as
        soon as its observation file appears, so an interrupted batch keeps its finished trials.
        An accuracy round runs `sample_ids` (None: the whole dataset). Returns the trials that
        finished, how the run went, its log and the machine it ran on."""
        assert self.recipe is not None
        probe = probe_request(self.recipe, case, request.commit, numbers[0], sample_ids)
        if len(numbers) > 1:
            probe["batch"] = [{"trial": n, "seed": trial_seed(case, n), "output": ""} for n in numbers]
        out_dir = self.step_dir(request.commit).resolve()
        paths = [observation_path(out_dir, case.id, n) for n in numbers]
        node_file = run_node_path(out_dir, probe_stem(case.id, numbers[0]))
        for stale in [*paths, node_file]:  # left by a run killed before the journal took it: not this run's
            stale.unlink(missing_ok=True)
        watcher = ObservationWatcher(paths)
        records: list[TrialRun] = []

        log = self.rel(probe_log_path(out_dir, probe_stem(case.id, numbers[0]))) or ""

        def collect() -> None:
            for index, path, seconds in watcher.arrived():
                record = self._record(case, numbers[index], path, seconds, index == 0, log, request.judge_each,
                                      request.as_reference)
                records.append(record.model_copy(update={"node": node_named(node_file)}))
                request.report(records[-1])

        stop = threading.Event()
        thread = threading.Thread(target=poll, args=(collect, stop), daemon=True)
        thread.start()
        try:
            result = self._on_image(request, env, partial(self.executor.run_probe, env, probe, out_dir,
                                                          self.timeout_s * len(numbers)))
        finally:
            stop.set()
            thread.join()
            collect()
        request.report_nodes(result)
        return records, result, log, node_named(node_file)

    def _missing(self, request: EvaluationRequest, case: CaseSpec, numbers: list[int], result: RunResult,
                 log: str, node: str | None) -> list[TrialRun]:
        """The trials `numbers` a probe run did not finish for a reason of the commit's (or a
        harness that cannot run at all: InfrastructureError)."""
        records: list[TrialRun] = []
        if numbers and result.returncode == HARNESS_FAILED_EXIT and not result.timed_out:
            # The accuracy harness (or its dataset, or its output) failed, not the candidate.
            lines = [line for line in result.log_tail.strip().splitlines() if line.strip()]
            raise InfrastructureError(f"{(lines[-1] if lines else 'the accuracy harness failed')[:600]} "
                                      f"(probe log {log})")
        hung = result.timed_out and self.timeout_is == "bad"
        why = "timed out" if result.timed_out else f"probe exited {result.returncode}"
        why += TIMEOUT_IS_BAD_NOTE if hung else ""
        tail = result.log_tail.strip().splitlines()[-1:] or [""]
        for n in numbers:
            missing = TrialRun(case_id=case.id, trial=n, log=log, outcome=VerdictKind.BAD if hung else VerdictKind.SKIP,
                               reason=f"{why}: {tail[0][:200]}", node=node)
            request.report(missing)
            records.append(missing)
        return records

    def _record(self, case: CaseSpec, trial: int, path: Path, seconds: float, starts_engine: bool, log: str,
                judge_each: bool, as_reference: bool) -> TrialRun:
        """A trial whose observation arrived `seconds` after the previous one (after the probe
        started, for the first): its startup share is what the engine start cost."""
        observation = Observation.load(path)
        startup = max(0.0, round(seconds - observation.timings.generate_s, 3)) if starts_engine else 0.0
        outcome, reason = None, ""
        if judge_each:
            if as_reference:
                self.reference = [*(self.reference or []), observation]
            verdict = self._judge_observations([observation])
            outcome, reason = verdict.kind, verdict.reason
        return TrialRun(case_id=case.id, trial=trial, observation=self.rel(path), seconds=round(seconds, 3), log=log,
                        outcome=outcome, reason=reason, startup_s=startup)

    def _judge_observations(self, observations: list[Observation]) -> Verdict:
        assert self.recipe is not None
        if len(observations) == 1:
            return oracle.judge_observation(self.recipe.oracle, observations[0],
                                            oracle.reference_for(observations[0], self.reference))
        return oracle.judge(self.recipe.oracle, observations, self.reference, trials_per_case=self.recipe.trials.count)

    def _judge_step(self, records: list[TrialRun]) -> Verdict:
        usable = [r for r in records if r.observation]
        hung = next((r for r in records if not r.observation and r.outcome == VerdictKind.BAD), None)
        if hung is not None:  # a trial past --timeout under --timeout-is bad: the commit hangs
            return Verdict(kind=VerdictKind.BAD, reason=hung.reason, trials=len(records))
        if not usable:
            reasons = "; ".join(sorted({r.reason for r in records}))[:300]
            return Verdict(kind=VerdictKind.SKIP, reason=f"no usable observation ({reasons})", trials=len(records))
        observations = [Observation.load(self.abs(r.observation)) for r in usable if r.observation]
        verdict = self._judge_observations(observations)
        if len(usable) < len(records):
            figures = {**verdict.figures, "failed_trials": len(records) - len(usable)}
            verdict = verdict.model_copy(update={"figures": figures})
        return verdict

    def set_reference(self, records: list[TrialRun]) -> None:
        """The good end's observations become the reference for token matching."""
        self.reference = [Observation.load(self.abs(r.observation)) for r in records if r.observation]
        if self.accuracy is not None:
            self.accuracy.remember("good_end", self.reference)

    def recall_accuracy_step(self, commit: str, records: Sequence[TrialRun], verdict: Verdict | None = None) -> None:
        """A finished accuracy step journaled before a resume: which samples it ran at `commit`
        (a step asked there again runs the others) and, with its `verdict`, a candidate's runs on
        its side (`AccuracySteps.recall_ran`). Rounds whose observation file is gone told nothing
        and are passed over."""
        if self.accuracy is not None:
            kept = [r for r in records if r.observation and self.abs(r.observation).is_file()]
            self.accuracy.recall_ran(commit, self._observed(kept), verdict)

    def set_bad_reference(self, records: list[TrialRun]) -> None:
        """The bad end, judged before a resume: an accuracy recipe's other half of the reference,
        a throughput step's other level (where it stops when sure), as the interrupted run had it."""
        if self.accuracy is not None:
            self.accuracy.remember("bad_end", self._observed(records))
        elif until_sure(self.recipe):
            self.bad_end_runs = self._observed(records)
