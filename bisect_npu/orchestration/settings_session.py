"""The settings search's session: the session engine (engine.py) over one commit's configurations,
searched with ddmin, as the commit search is the engine over a range's positions.

It opens as every session opens (opening/session_opening.py: a new search with its header, or the
one a session directory holds, checked against the question it started with), folds its journal
once (configuration_state.py), and is the engine's space: its decide function is ddmin's (after the
good variant's reference runs), each configuration the engine judges comes from configurations.py
(its recipe, label, step directory and record keys), and it ends with the settings search's answer
(settings_search.py holds the question and the answer).

Unresolved is not passing: a configuration the host's failures left unjudged reads as ddmin's
`Unresolved`; an end stops the search at once (`engine.HostStop`), and where the answer needs
another the search stops with exit 5 naming the failure (`_stop_on_the_host`); a later process runs
it again. The rest comes from the commit session's pieces: the executor checks
(`preflight.settle_executor`), the identity check (`open_session.first_difference`), the reference
(`reference.References`, the good variant as the good end) and the end's sentences (end_messages.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_npu.builders.base import Builder
from bisect_npu.errors import UsageError
from bisect_npu.execute.base import Executor
from bisect_npu.journal import JOURNAL_FILE
from bisect_npu.level import SettingsLevel
from bisect_npu.orchestration import engine
from bisect_npu.orchestration.configurations import Configurations
from bisect_npu.orchestration.opening.environments import session_evaluator
from bisect_npu.orchestration.opening.open_session import first_difference, refuse_other_request
from bisect_npu.orchestration.opening.preflight import RAY_REFUSED, settle_executor
from bisect_npu.orchestration.opening.reference import References
from bisect_npu.orchestration.opening.session_opening import Opening, check_recipe, open_session
from bisect_npu.orchestration.opening.session_spec import SessionSpec, check_dependency_options
from bisect_npu.orchestration.running.evaluate import Evaluator
from bisect_npu.orchestration.settings_search import (
    SettingsQuestion,
    SettingsResult,
    asks_variant,
    check_same_reference,
    culprit_settings,
    found_end,
    good_end_of,
    plan_differences,
    settings_facts,
    settings_header,
    settings_result,
    unresolved_end,
    value_checks,
    value_reading,
    wrong_end,
)
from bisect_npu.progress import PlainProgress, Progress
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from bisect_npu.recipe.settings import show
from bisect_npu.records import TrialRun
from bisect_npu.request import RunRequest
from bisect_npu.search import EndsWrong, Evidence
from bisect_npu.search.ddmin import Ask, Configuration, SettingsProblem, Trigger, Unresolved, decide_ddmin, rests_on
from bisect_npu.settings_journal import SettingsEnd, SettingsHeader, SettingsJournal
from bisect_npu.upstream import history

SettingsAnswer = Trigger | EndsWrong | Unresolved  # what the settings search ends with

if TYPE_CHECKING:
    from bisect_npu.orchestration.session import Session


class SettingsSearch:
    """One settings search, driven step by step from its journal."""

    def __init__(self, journal: SettingsJournal, recipe: Recipe, base: Evaluator, spec: SessionSpec,
                 repo_path: str, progress: Progress) -> None:
        self.space = Configurations(journal, recipe, base, spec, repo_path, progress)
        self.journal, self.header, self.base = journal, journal.header, base
        self.differences, self.verdicts, self.state = self.space.differences, self.space.verdicts, self.space.state
        self.slots = max(1, spec.executor.slots or 1)  # configurations run at once, each on a slot's cards
        self.problem = SettingsProblem(len(self.differences), mode=self.header.mode, confidence=self.header.confidence,
                                       batch=self.header.batch, max_trials=self.header.max_trials, slots=self.slots)
        # The good variant's runs at the commit are every configuration's reference, as a commit
        # search's good end's are (None where the reference commit gives each its own).
        self.references = References(recipe, base, self._good_variant_runs)
        self.reference_commit = self.header.reference_commit

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def start(cls, question: SettingsQuestion, request: RunRequest, session_dir: Path,
              progress: Progress | None = None, builder: Builder | None = None,
              executor: Executor | None = None) -> SettingsSearch:
        """A new search (its inputs checked before anything is made), or the one `session_dir`
        holds, which goes on under the request it started with, as `session_opening.open_session`
        opens any session. `request`: the runs' request at the question's commit (`settings_request`)."""
        if request.executor.executor == "ray":
            raise UsageError(RAY_REFUSED)
        recipe_name = request.judge.recipe
        assert recipe_name is not None  # settings_request's
        progress = progress or PlainProgress()
        session_dir = session_dir.resolve()
        recipe = load_recipe(recipe_name)
        if (session_dir / JOURNAL_FILE).exists() and not SettingsJournal.exists(session_dir):
            raise UsageError(f"{session_dir} is a commit search's session, not a settings search's; search at its "
                             f"culprit with `bisect-npu settings --after {session_dir}`")

        def check(journal: SettingsJournal) -> None:
            """The search the directory holds is the one asked: its commit, recipe, reference and keys."""
            if difference := first_difference(settings_facts(journal.header, request)):
                raise refuse_other_request("settings search", session_dir, difference, "the `bisect-npu settings` "
                                           f"command that started it, with --session {session_dir}")
            check_recipe(recipe, journal.header.recipe_digest, f"recipe {recipe_name} changed since settings search "
                         f"{session_dir} started; start a new one with another --session")
            check_same_reference(question, journal)
            asked = replace(question, reference_at=journal.header.reference_ref)
            given = [d.key for d in plan_differences(recipe, asked)[0]] if asks_variant(asked) else None
            if given is not None and given != [d.key for d in journal.header.differences]:
                raise UsageError(f"settings search {session_dir} searches other keys "
                                 f"({', '.join(d.key for d in journal.header.differences)}); continue it with the "
                                 "good variant it started with, or start a new one with another --session")

        spec: list[SessionSpec] = []

        def evaluator(journal: SettingsJournal) -> Evaluator:
            """The session a run of the one commit is (the header's request at its level), and the
            evaluator whose builder every configuration shares (the builder and executor given, or
            made as `run` makes them)."""
            spec.append(SessionSpec(journal.header.request.settled(), journal.header.level))
            check_dependency_options(spec[0], recipe)
            settle_executor(spec[0], recipe.cards_per_run())  # this host's: the host type, its refusals, the devices
            repo = history.open_repo(spec[0].range.repo or ".")
            return session_evaluator(spec[0], repo, recipe, session_dir, builder, executor)

        def header() -> SettingsHeader:
            """The question's header, its request's executor settled as a run's (its slots:
            configurations at once)."""
            made = settings_header(question, request, recipe)
            settle_executor(SessionSpec(made.request, made.level), recipe.cards_per_run())
            return made

        opening = Opening(SettingsJournal, header, reopens=True, check=check,
                          continuing=f"continuing the settings search in {session_dir}")
        journal, base = open_session(opening, session_dir, progress, evaluator)
        return cls(journal, recipe, base, spec[0], spec[0].range.repo or ".", progress)

    # -- the loop -------------------------------------------------------------------------------

    def evidence(self) -> dict[Configuration, Evidence]:
        """Each configuration's evidence: without the verdict store's verdicts once one was
        contradicted, and without what an earlier process left unresolved on the host (run again)."""
        return self.state.evidence(without_stored=self.verdicts is not None and self.verdicts.dropped())

    def run(self) -> SettingsResult:
        """Search until the trigger is named or the ends are wrong; journal the answer (`engine.drive`)."""
        space: engine.CandidateSpace[Ask, SettingsAnswer, SettingsResult] = self
        return engine.drive(space)

    # -- the space the engine asks ----------------------------------------------------------------

    def answered(self) -> SettingsResult | None:
        return self._result(self.state.end) if self.state.end is not None else None

    def open(self) -> None:
        """Nothing before the first decision: each configuration asks the verdict store when it is asked."""

    def decide(self) -> engine.Round[Ask] | SettingsAnswer:
        self._ensure_reference()  # before the round is asked: the good variant, run alone, is then one of its ends
        decision = decide_ddmin(self.problem, self.evidence())
        if isinstance(decision, Ask):
            return engine.Round((decision, *decision.alongside))
        return decision

    def run_query(self, ask: Ask, first_trial: int | None) -> None:
        """One configuration the search asks (its trial numbers its own: no two slots run one configuration)."""
        self.space.run(ask.configuration, ask.trials)

    def confirm(self, answer: SettingsAnswer) -> bool:
        return not isinstance(answer, Unresolved) and self.verdicts is not None and self._confirm(answer)

    def stop_runs(self) -> None:
        self.space.stop_runs()

    def finish(self, answer: SettingsAnswer) -> SettingsResult:
        self._stop_on_the_host(answer)
        if isinstance(answer, Unresolved):
            unjudged = [(self.space.label(c), records[-1].verdict.reason if (records := self.state.records(c))
                         else "not run") for c in answer.configurations]
            return self._end(unresolved_end(self.header, answer, unjudged))
        if isinstance(answer, EndsWrong):
            side = frozenset() if answer.which == "good" else frozenset(range(len(self.differences)))
            reference = self.state.failed_reference(side)
            return self._end(wrong_end(self.header, answer, reference,
                                       self.space.reference_label() if reference is not None else "",
                                       self.journal.session_dir / "configurations"))
        self._check_values(answer)
        return self._end(found_end(self.header, answer, self.state.tried()))

    def _stop_on_the_host(self, decision: Trigger | EndsWrong | Unresolved) -> None:
        """Where the answer stands on a configuration the host's failures left unjudged (an end
        skipped, or one the trigger rests on), the search stops (exit 5) naming the failure:
        resumed once the host is freed, it runs that configuration again."""
        if isinstance(decision, Trigger):
            return
        standing = decision.configurations if isinstance(decision, Unresolved) else rests_on(self.problem, decision)
        for configuration in standing:
            records = self.state.records(configuration)
            if records and records[-1].host_failure is not None:
                raise self.space.stop(configuration, "no trigger can be named without it").error(
                    records[-1].host_failure)

    def _confirm(self, decision: Trigger | EndsWrong) -> bool:
        """Run fresh the configurations the answer rests on where only the verdict store judged them
        (`SessionVerdicts.confirm`); True when it ran any."""
        assert self.verdicts is not None
        resting = {self.space.recipe_of(configuration).digest(): configuration
                   for configuration in rests_on(self.problem, decision)}
        return self.verdicts.confirm(list(resting), lambda digest: self.space.run(resting[digest], self.problem.batch))

    def _ensure_reference(self) -> None:
        """A recipe judged against the good end's output is judged here against the good variant's."""
        if not self.reference_commit:
            self.references.ensure(self._run_good_variant)

    def _good_variant_runs(self) -> list[TrialRun] | None:
        good = [record for record in self.state.records(frozenset()) if record.host_failure is None]
        return [trial for record in good for trial in record.trials] if good else None

    def _run_good_variant(self, trials: int) -> None:
        self.space.run(frozenset(), trials, as_reference=True)

    def _check_values(self, trigger: Trigger) -> None:
        """Run each further --vary value of a trigger key (`value_checks`) until its check reads."""
        for key, value in value_checks(self.header, trigger):
            check = f"{key}={show(value)}"
            while value_reading(self.problem, self.state.value_records(check), self.evidence()) is None:
                self.space.run(trigger.keys, self.problem.batch, extra={key: value})

    # -- the end ------------------------------------------------------------------------------

    def _end(self, end: SettingsEnd) -> SettingsResult:
        self.space.append(end)
        return self._result(end)

    def _result(self, end: SettingsEnd) -> SettingsResult:
        return settings_result(self.header, end, self.journal.session_dir, self.state.tried())

    def close(self) -> None:
        try:
            self.space.close()
            self.base.close()
        finally:
            self.journal.close()


def search_at_culprit(session: Session, level: SettingsLevel) -> SettingsResult:
    """`run --settings`: the settings search at a commit session's culprit, under that session's
    request (its repository, recipe, executor, store and search options), in the session's
    `settings/` (continued where a killed run left it). The user hears the trigger; its report
    section is the session's."""
    from bisect_npu.report.settings import SETTINGS_DIR, write_settings_reports

    if session.spec.executor.executor == "ray":  # refused before the run (preflight); a journal could still hold it
        raise UsageError(f"--settings with {RAY_REFUSED}")
    question, request = culprit_settings(session.spec, level, session.journal.session_dir,
                                         good_end_of(session.journal.header))
    directory = session.journal.session_dir / SETTINGS_DIR
    session.progress.note(f"searching the settings the culprit {level.commit[:12]} needs ({len(level.good_set)} "
                          "given by --settings)")
    search = SettingsSearch.start(question, request, directory, session.progress)
    try:
        result = search.run()
    finally:
        search.close()
    write_settings_reports(directory)
    session.progress.note(result.message)
    return result
