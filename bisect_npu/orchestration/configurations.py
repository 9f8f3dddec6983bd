"""A settings search's candidates: the configurations at one commit, each the good variant with
some keys at their bad value. What the session engine asks of this space for each lives here: a
configuration's settings and recipe, how it is labelled, its step directory and record keys (its
recipe digest), and what settles it before its run (not judged good at the reference commit, where
there is one: skipped). The engine judges it (`engine.judge`) as it judges a commit: the verdict
store first, every trial and failed attempt journaled, the retry budget a resume goes on with; a
configuration the host's failures left unjudged is journaled with why (`host_failure`), the
search stops there where it is an end (the good variant, the bad case), and a later process runs
it again, its attempts numbered on.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from bisect_npu.execute.base import Executor
from bisect_npu.execute.docker import DockerExecutor
from bisect_npu.execute.host import recipe_for_host
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.orchestration import engine
from bisect_npu.orchestration.opening.configuration_state import ConfigurationState
from bisect_npu.orchestration.opening.environments import make_environment
from bisect_npu.orchestration.opening.session_opening import folded
from bisect_npu.orchestration.opening.session_spec import SessionSpec
from bisect_npu.orchestration.opening.verdict_reuse import SessionVerdicts, VerdictReuse, open_verdict_reuse
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
from bisect_npu.progress import Progress
from bisect_npu.recipe.schema import Recipe
from bisect_npu.recipe.settings import Difference, apply, show
from bisect_npu.records import JudgedRun
from bisect_npu.search.ddmin import Configuration
from bisect_npu.settings_journal import (
    ConfigurationRecord,
    ConfigurationRetry,
    ConfigurationTrial,
    ReferenceRecord,
    ReferenceTrial,
    SettingsEntry,
    SettingsJournal,
)
from bisect_npu.upstream import history


class Configurations:
    """The configurations of one settings search, run on the one build of its commit (`base`'s
    builder), each with its own executor where its environment differs."""

    def __init__(self, journal: SettingsJournal, recipe: Recipe, base: Evaluator, spec: SessionSpec, repo_path: str,
                 progress: Progress) -> None:
        self.journal = journal
        self.header = journal.header
        self.recipe = recipe
        self.base = base
        self.spec = spec
        self.repo_path = repo_path
        self.progress = progress
        self.differences = [Difference(d.key, d.bad, d.good) for d in self.header.differences]
        self.noisy = self.header.mode == "noisy"
        self.batch = self.header.batch
        self.reference_commit = self.header.reference_commit
        self.state = folded(ConfigurationState(self.noisy, journal.entries), base)  # the journal, folded once
        self._executors: dict[tuple[tuple[str, str], ...], Executor] = {}
        self._memories: dict[str, VerdictReuse] = {}  # a configuration's digest -> its verdict store scope
        self.verdicts: SessionVerdicts[str] | None = None if spec.store.verdict_store is None else SessionVerdicts(
            self._memories.__getitem__, self.state, progress, noun="configuration",
            outcomes=self.state.outcomes if self.noisy else None)
        self._lock = threading.Lock()  # the slots' configurations make an executor or a store scope in turn

    def settings_of(self, configuration: Configuration) -> dict[str, Any]:
        """Every differing key -> its value in the configuration (bad where the key is in it)."""
        return {d.key: d.bad if i in configuration else d.good for i, d in enumerate(self.differences)}

    def recipe_of(self, configuration: Configuration, extra: dict[str, Any] | None = None) -> Recipe:
        """The configuration's recipe, as this host runs it (its image variant and dtype)."""
        return recipe_for_host(apply(self.recipe, {**self.settings_of(configuration), **(extra or {})}),
                               self.spec.context.host)

    def label(self, configuration: Configuration, check: str | None = None) -> str:
        """How the progress lines and the messages name a configuration: its keys at their bad value."""
        if check:
            return f"[trigger, {check}]"
        if not configuration:
            return "[good variant]"
        if len(configuration) == len(self.differences):
            return "[bad case]"
        return "[" + ", ".join(self.differences[i].key for i in sorted(configuration)) + "]"

    def _is_end(self, configuration: Configuration, check: str | None) -> bool:
        """The good variant and the bad case: no trigger can be named without either."""
        return check is None and len(configuration) in (0, len(self.differences))

    def stop(self, configuration: Configuration, why: str) -> engine.HostStop:
        """How the search stops on a configuration the host left unjudged that it needs (`why`)."""
        return engine.HostStop(f"configuration {self.label(configuration)} ({why})",
                               "run the same `bisect-npu settings` command with --session "
                               f"{self.journal.session_dir}")

    def reference_label(self) -> str:
        assert self.reference_commit is not None
        return f"{self.reference_commit[:12]} ({self.header.reference_ref})"

    def append(self, entry: SettingsEntry) -> None:
        """Journal an entry and fold it into the state: the one way the search journals."""
        self.journal.append(entry)
        self.state.apply(entry)

    def run(self, configuration: Configuration, trials: int, as_reference: bool = False,
            extra: dict[str, Any] | None = None) -> ConfigurationRecord:
        """Judge a configuration (`engine.judge`; `extra`: a further --vary value in place of a
        trigger key's bad value) and journal its record: the verdict store's verdict, else its
        run (`as_reference`: the good variant whose runs are every configuration's reference)."""
        recipe = self.recipe_of(configuration, extra)
        digest = recipe.digest()
        check = ", ".join(f"{k}={show(v)}" for k, v in (extra or {}).items()) or None
        settings = {**self.settings_of(configuration), **(extra or {})}
        keys, commit, noisy = sorted(configuration), self.header.commit, self.noisy
        label = f"configuration {self.label(configuration, check)}"
        verdicts = self.verdicts if not as_reference else None  # the reference's runs are always run, never kept
        if verdicts is not None:
            self._open_scope(recipe)
        at_reference: list[Observation] = []  # the configuration's observations at the reference commit
        ran: list[bool] = []

        def settled() -> JudgedRun | None:
            """Where a reference commit is asked, the configuration there first: not judged good
            there, it is skipped here."""
            if not self.reference_commit or as_reference:
                return None
            reference = self._reference_run(configuration, recipe, check)
            if reference.verdict.kind != VerdictKind.GOOD:
                return JudgedRun(verdict=Verdict(kind=VerdictKind.SKIP, trials=0, reason=(
                    f"{reference.verdict.kind.value} at the reference commit {self.reference_label()}: "
                    f"{reference.verdict.reason}")), build=reference.build, host_failure=reference.host_failure)
            at_reference.extend(Observation.load(self.base.abs(t.observation)) for t in reference.trials
                                if t.observation)
            return None

        def started() -> None:
            ran.append(True)
            self.progress.note(f"{label}: running {trials} trial(s)")

        def evaluation() -> tuple[Evaluator, EvaluationRequest]:
            evaluator = self._evaluator(Path("configurations") / digest, recipe)
            evaluator.reference = at_reference if self.reference_commit and not as_reference else self.base.reference
            pending = self.state.pending_trials(digest) if not noisy else []
            return evaluator, EvaluationRequest(commit, trials if noisy else recipe.trials.count, tuple(pending),
                                                judge_each=noisy, first_trial=self.state.next_trial(digest)
                                                if noisy else 0, as_reference=as_reference)

        def said(entry: SettingsEntry) -> None:
            if isinstance(entry, ConfigurationRecord):
                verdict = entry.verdict
                self.progress.note(f"{label}: {verdict.kind.value} ({verdict.reason})" if ran
                                   else f"{label}: {verdict.reason}")

        judged = engine.judge(engine.Candidate[str, SettingsEntry](
            key=digest, commit=commit, build_key=self.base.builder.build_key(commit) or "", label=label,
            evaluation=evaluation, retried=self.state.pending_retries(digest), given_up=self.state.given_up(digest),
            end=self.stop(configuration, "it is an end of the search") if self._is_end(configuration, check) else None,
            trial=lambda run: ConfigurationTrial(configuration=keys, digest=digest, **run.model_dump()),
            retry=lambda retry: ConfigurationRetry(configuration=keys, digest=digest, reference=False,
                                                   **retry.model_dump()),
            record=ConfigurationRecord,
            record_keys={"configuration": keys, "digest": digest, "settings": settings, "value_check": check},
            settled=settled, started=started, said=said), self.append, self.progress, verdicts)
        assert isinstance(judged, ConfigurationRecord)
        return judged

    def _evaluator(self, step: Path, recipe: Recipe) -> Evaluator:
        """A configuration's evaluator: the shared build, its own executor and step directory, and
        the session's retries and card wait (as the commit search's evaluator has them)."""
        evaluator = _ConfigurationEvaluator(step, self.base.builder, self._executor_for(recipe),
                                            self.journal.session_dir, recipe=recipe,
                                            timeout_s=self.spec.judge.timeout_s, timeout_is=self.spec.judge.timeout_is,
                                            retries=self.spec.judge.retries, cards=self.base.cards)
        evaluator.retry = replace(evaluator.retry, host=self.base.retry.host)  # one record of the host for all
        return evaluator

    def _reference_run(self, configuration: Configuration, recipe: Recipe, check: str | None) -> ReferenceRecord:
        """The configuration at the reference commit (`engine.judge`, never asked of the store):
        journaled once (an interrupted run's trials kept), so neither the rest of the search nor a
        resumed one runs it again (unless the host's failures left it unjudged before this
        process: then it runs again)."""
        reference_commit = self.reference_commit
        assert reference_commit is not None
        digest = recipe.digest()
        done = self.state.reference_record(digest)
        if done is not None:
            return done
        keys, label = sorted(configuration), f"configuration {self.label(configuration, check)}"
        pending = self.state.pending_trials(digest, reference=True)
        judged = engine.judge(engine.Candidate[str, SettingsEntry](
            key=digest, commit=reference_commit, build_key="", label=label,
            evaluation=lambda: (self._evaluator(Path("references") / digest, recipe), EvaluationRequest(
                reference_commit, recipe.trials.count, tuple(pending), as_reference=True)),
            retried=self.state.pending_retries(digest, reference=True),
            given_up=self.state.given_up(digest, reference=True),
            trial=lambda run: ReferenceTrial(configuration=keys, digest=digest, **run.model_dump()),
            retry=lambda retry: ConfigurationRetry(configuration=keys, digest=digest, reference=True,
                                                   **retry.model_dump()),
            record=ReferenceRecord,  # never asked of the store: `stored` stays None
            record_keys={"configuration": keys, "digest": digest, "commit": reference_commit},
            started=lambda: self.progress.note(f"{label} at the reference commit {self.reference_label()}: running "
                                               f"{recipe.trials.count} trial(s)")), self.append, self.progress, None)
        assert isinstance(judged, ReferenceRecord)
        return judged

    def _executor_for(self, recipe: Recipe) -> Executor:
        """The base executor where the configuration's environment is the recipe's; else one with
        its environment (the build stays the one shared build)."""
        if recipe.environment == self.recipe.environment:
            return self.base.executor
        key = tuple(sorted(recipe.environment.items()))
        with self._lock:
            if key not in self._executors:
                repo = history.open_repo(self.repo_path)
                made = make_environment(self.spec, repo, recipe, self.journal.session_dir,
                                        self.journal.session_dir / "worktrees")[1]
                base = self.base.executor
                pooled = LocalExecutor | DockerExecutor
                if isinstance(made, pooled) and isinstance(base, pooled):
                    made.device_pool = base.device_pool  # one pool of the cards: two slots never share one
                self._executors[key] = made
            return self._executors[key]

    def _open_scope(self, recipe: Recipe) -> None:
        """The verdict store under this configuration's recipe digest, relative to what the oracle
        compares it with: the reference commit (where the configuration itself is the reference,
        as a commit search's good end is), else the good variant."""
        digest = recipe.digest()
        with self._lock:
            if digest not in self._memories:
                reference = ""
                if self.reference_commit:
                    reference = self.reference_commit
                elif self.recipe.reference.kind == "good_end":
                    reference = self.recipe_of(frozenset()).digest()
                reuse = open_verdict_reuse(self.spec, recipe, self.journal.session_dir, reference, self.progress)
                assert reuse is not None  # a store is named (self.verdicts), and a recipe's verdicts have a scope
                self._memories[digest] = reuse

    def stop_runs(self) -> None:
        """An interrupt stops what the other slots run."""
        for executor in [self.base.executor, *self._executors.values()]:
            executor.close()

    def close(self) -> None:
        """Stop what the configurations' own executors run."""
        for executor in self._executors.values():
            executor.close()


class _ConfigurationEvaluator(Evaluator):
    """An Evaluator whose runs of the commit lie in the configuration's own directory, `step`
    under the session (the commit is the same for every configuration; the observations must not be)."""

    def __init__(self, step: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step = step

    def step_dir(self, commit: str) -> Path:
        return self.session_dir / self.step
