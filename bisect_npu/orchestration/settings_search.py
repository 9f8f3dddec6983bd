"""Which setting breaks it: the settings search at one commit, driven from its journal.

Given a bad recipe and a good variant (`--good-set KEY=VALUE`, a second recipe, or `--vary`),
the keys they differ in are searched with ddmin (search/ddmin.py) for the smallest set whose bad
values turn the good variant bad. This module holds the question (the good variant, `--vary` and
its further values, the reference commit, which a resumed search must keep:
`_check_same_reference`), the loop and the answer (`SettingsEnd`: a trigger of keys, not a
culprit). Running a configuration is its space's (orchestration/configurations.py: each on the
commit's one build, through `candidate.run_candidate` as the commit search runs a commit, every
trial and failed attempt journaled, the verdict store asked first).

Unresolved is not passing: a configuration the host's failures left unjudged reads as ddmin's
`Unresolved`, and where the answer needs it the search stops with exit 5 naming the failure
(`_stop_on_the_host`); a later process runs it again. The rest comes from the commit session's
pieces: the journal file (journal.py), the executor checks (`preflight.settle_executor`), the
identity check (`opening.first_difference`), the leftovers' sweep, the reference
(`reference.References`, the good variant as the good end), the slots (`slots.run_in_slots`),
the verdict store's confirmation of what the answer rests on (`ddmin.rests_on`) and the end's
sentences (end_messages.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bisect_npu import __version__, interrupts
from bisect_npu.builders.base import Builder
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.execute.base import Executor
from bisect_npu.journal import JOURNAL_FILE
from bisect_npu.level import SettingsLevel
from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration import end_messages
from bisect_npu.orchestration.configurations import Configurations
from bisect_npu.orchestration.environments import session_evaluator
from bisect_npu.orchestration.evaluate import Evaluator
from bisect_npu.orchestration.opening import Fact, first_difference, refuse_other_request, stop_leftovers
from bisect_npu.orchestration.preflight import RAY_REFUSED, settle_executor
from bisect_npu.orchestration.reference import References
from bisect_npu.orchestration.result import EXIT_CODES, EXIT_NARROWED
from bisect_npu.orchestration.session_spec import SessionSpec, check_dependency_options
from bisect_npu.orchestration.slots import run_in_slots
from bisect_npu.progress import PlainProgress, Progress
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from bisect_npu.recipe.settings import (
    Difference,
    check_key,
    differences_between,
    differences_from_settings,
    parse_assignment,
    show,
    value_of,
)
from bisect_npu.records import HeaderRecord, TrialRun
from bisect_npu.request import RangeSpec, RunRequest
from bisect_npu.search import EndsWrong, Evidence
from bisect_npu.search.ddmin import (
    Ask,
    Configuration,
    SettingsProblem,
    Trigger,
    Unresolved,
    decide_ddmin,
    read_trials,
    rests_on,
)
from bisect_npu.settings_journal import (
    ConfigurationRecord,
    ConfigurationTrial,
    DifferenceRecord,
    ReferenceRecord,
    SettingsEnd,
    SettingsHeader,
    SettingsJournal,
)
from bisect_npu.upstream import history

if TYPE_CHECKING:
    from bisect_npu.orchestration.session import Session



@dataclass(frozen=True)
class SettingsQuestion:
    """What a settings search asks beyond its runs' request (whose repository, recipe, executor,
    store and search options it runs under, as a commit search does): the commit (`ref`; None:
    the `after_session`'s culprit), the good variant (`good_set`, `good_recipe`, `vary`), the
    finished commit session it follows, the reference commit (`reference_at`) and that session's
    good end (`session_good`: the reference commit where the keys need one and `reference_at` is
    not given; None where the session names none: find-fix, versions)."""

    ref: str | None = None
    good_set: Sequence[str] = ()
    good_recipe: str | None = None
    vary: Sequence[str] = ()
    after_session: Path | None = None
    reference_at: str | None = None
    session_good: str | None = None


@dataclass(frozen=True)
class SettingsResult:
    status: Literal["found", "ends_wrong", "unresolved"]
    exit_code: int
    session_dir: Path
    message: str
    trigger: list[Difference] = field(default_factory=list)
    configurations: int = 0


def settings_request(question: SettingsQuestion, fields: Mapping[str, Any]) -> tuple[SettingsQuestion, RunRequest]:
    """The question with what it leaves unset taken from its finished commit session (its
    repository, culprit and recipe), and the request its runs are made under: `fields` by name
    (`RunRequest.of`'s) at the question's commit."""
    after = question.after_session
    repo, recipe = fields.get("repo"), fields.get("recipe")
    if after is None:
        if recipe is None:
            raise UsageError("a settings search needs --recipe (the bad case) or --after SESSION")
        repo = repo or "."
    else:
        from bisect_npu.journal import Journal
        from bisect_npu.records import EndRecord

        journal = Journal.open(after, read_only=True)
        if question.session_good is None:
            question = replace(question, session_good=good_end_of(journal.header))
        question = replace(question, after_session=after.resolve())
        end = next((e for e in reversed(journal.entries) if isinstance(e, EndRecord)), None)
        if question.ref is None and (end is None or end.status != "found" or end.culprit is None):
            raise UsageError(f"--after {after}: the session named no culprit; give --at REF for the commit to search "
                             "at")
        asked = journal.header.request
        recipe = recipe or asked.judge.recipe
        if recipe is None:
            raise UsageError(f"--after {after}: the session was judged by no recipe; give --recipe (the bad case)")
        repo = repo or asked.range.repo or "."
        question = replace(question, ref=question.ref or (end.culprit if end else None))
    if question.ref is None:
        raise UsageError("a settings search runs at one commit: give --at REF (or --after SESSION)")
    return question, RunRequest.of(**{**fields, "repo": repo, "recipe": recipe, "good": question.ref,
                                      "bad": question.ref})


def settings_facts(header: SettingsHeader, request: RunRequest) -> list[Fact]:
    """What makes a settings search another one, as `opening.first_difference` compares: its
    repository and the commit it runs at (`request`: `settings_request`'s, at the question's commit)."""
    repo = str(Path(request.range.repo or ".").resolve())
    return [("repository", header.request.range.repo, repo),
            ("commit", header.commit, history.resolve_ref(history.open_repo(repo), request.range.bad))]


def good_end_of(header: HeaderRecord) -> str | None:
    """A commit session's good end, as a settings search's reference commit: none for a search
    for a fix (its old end has the symptom) or over published versions (no commit of the repository)."""
    if header.range.kind != "commits" or header.request.search.find_fix:
        return None
    return header.range.base


def parse_vary(text: str) -> tuple[str, list[Any]]:
    """`KEY=V1,V2,...`: the first value is the good variant's, the others are checked alone."""
    key, values = parse_assignment(text, "--vary")
    raw = text.partition("=")[2]
    parsed = [parse_assignment(f"{key}={part}", "--vary")[1] for part in raw.split(",")] if "," in raw else [values]
    return key, parsed


def check_vary_values(recipe: Recipe, key: str, values: Sequence[Any]) -> None:
    """--vary's values each differ from the recipe's (the bad case, which the search runs anyway)
    and from each other: a configuration is not run twice."""
    bad = value_of(recipe, key)
    if bad in values:
        raise UsageError(f"--vary {key}: {show(bad)} is the recipe's own value (the bad case, which the search runs "
                         "anyway); give only values that differ from it")
    shown = [show(v) for v in values]
    if len(set(shown)) != len(shown):
        raise UsageError(f"--vary {key}: a value is given twice ({', '.join(shown)}); give each once")


def plan_differences(recipe: Recipe, request: SettingsQuestion) -> tuple[list[Difference], dict[str, list[Any]]]:
    """The differing keys (in the search's order) and the --vary keys' further values."""
    good: dict[str, Any] = {}
    further: dict[str, list[Any]] = {}
    for text in request.vary:  # the open questions first: the keys the user suspects
        key, values = parse_vary(text)
        check_key(recipe, key, "--vary")
        check_vary_values(recipe, key, values)
        if key in good:
            raise UsageError(f"--vary {key} is given twice; give each key once")
        good[key] = values[0]
        further[key] = values[1:]
    for text in request.good_set:
        key, value = parse_assignment(text, "--good-set")
        if key in good:
            raise UsageError(f"--good-set {key} is given twice (or also as --vary); give each key once")
        good[key] = value
    found = differences_from_settings(recipe, good) if good else []
    if request.good_recipe:
        known = {d.key for d in found}
        found += [d for d in differences_between(recipe, load_recipe(request.good_recipe)) if d.key not in known]
    if not found:
        raise UsageError("a settings search needs a good variant that differs from the recipe: --good-set KEY=VALUE, "
                         "--good-recipe FILE or --vary KEY=V1,V2")
    if request.reference_at is None and request.session_good is None and (cause := reference_cause(recipe, found)):
        raise UsageError(cause)
    return found, further


LOAD_KEYS = ("engine.load.concurrency", "engine.load.requests")


def compares_with_good_end(recipe: Recipe) -> bool:
    """Whether the oracle compares a run with the good end's output (an accuracy recipe's pairing
    is its harness's, not a configuration's)."""
    return recipe.reference.kind == "good_end" and recipe.accuracy is None


def reference_cause(recipe: Recipe, differences: Sequence[Difference]) -> str | None:
    """Why the good variant's output at the searched commit cannot be every configuration's
    reference, as the error that refuses the search without a reference commit; None where it can.

    An output length: the good variant's output has its length, so another length mismatches it
    at the first token past the shorter one whatever the commit, and has no reference tokens past
    it, where a long-output regression shows. A throughput judged against the good end's: the
    output length and the load change the throughput at any commit. Either way the search would
    name the key at a good commit too; against the same configuration at a good commit it does not."""
    if not compares_with_good_end(recipe):
        return None
    throughput = recipe.oracle.throughput
    against_good_end = "throughput" in recipe.oracle.kinds and throughput is not None and \
        throughput.reference == "good_end"
    for difference in differences:
        length = difference.key.endswith(".sampling.max_tokens")
        if against_good_end and (length or difference.key in LOAD_KEYS):
            return (f"{difference.key}: the recipe's throughput is compared with the good variant's (oracle.throughput."
                    f"reference good_end), and {'the output length' if length else 'the load'} changes the throughput "
                    f"at any commit: {_NEXT_STEP}, or hold the key fixed")
        if length:
            return (f"{difference.key}: the recipe's output is compared with the good variant's (reference good_end), "
                    f"which at max_tokens {show(difference.good)} has no tokens past that; another length mismatches "
                    f"it at any commit: {_NEXT_STEP}, hold the length fixed, or judge by an oracle that needs no "
                    "reference (repetition)")
    return None


_NEXT_STEP = ("give --reference-at REF (a commit where the case is good, such as the commit search's good end: each "
              "configuration is then judged against its own output there)")


class SettingsSearch:
    """One settings search, driven step by step from its journal."""

    def __init__(self, journal: SettingsJournal, recipe: Recipe, base: Evaluator, spec: SessionSpec,
                 repo_path: str, progress: Progress) -> None:
        self.space = Configurations(journal, recipe, base, spec, repo_path, progress)
        self.journal, self.header, self.base = journal, journal.header, base
        self.differences, self.verdicts = self.space.differences, self.space.verdicts
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
        holds, which goes on under the request it started with. `request`: the runs' request at
        the question's commit (`settings_request`)."""
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
        if SettingsJournal.exists(session_dir):
            journal = SettingsJournal.open(session_dir)
            if difference := first_difference(settings_facts(journal.header, request)):
                journal.close()
                raise refuse_other_request("settings search", session_dir, difference, "the `bisect-npu settings` "
                                           f"command that started it, with --session {session_dir}")
            if journal.header.recipe_digest != recipe.digest():
                journal.close()
                raise UsageError(f"recipe {recipe_name} changed since settings search {session_dir} started; "
                                 "start a new one with another --session")
            cls._check_same_reference(question, journal)
            question = replace(question, reference_at=journal.header.reference_ref)
            given = [d.key for d in plan_differences(recipe, question)[0]] if cls._asks_variant(question) else None
            if given is not None and given != [d.key for d in journal.header.differences]:
                journal.close()
                raise UsageError(f"settings search {session_dir} searches other keys "
                                 f"({', '.join(d.key for d in journal.header.differences)}); continue it with the "
                                 "good variant it started with, or start a new one with another --session")
            progress.note(f"continuing the settings search in {session_dir}")
        else:
            journal = SettingsJournal.create(session_dir, cls._header(question, request, recipe))
        try:
            spec, base = cls._environment(journal.header, recipe, session_dir, builder, executor, progress)
        except BaseException:
            journal.close()
            raise
        return cls(journal, recipe, base, spec, spec.range.repo or ".", progress)

    @staticmethod
    def _environment(header: SettingsHeader, recipe: Recipe, session_dir: Path, builder: Builder | None,
                     executor: Executor | None, progress: Progress) -> tuple[SessionSpec, Evaluator]:
        """The session a run of the one commit is (the header's request at its level), and the
        evaluator whose builder every configuration shares (the builder and executor given, or
        made as `run` makes them)."""
        spec = SessionSpec(header.request.settled(), header.level)
        check_dependency_options(spec, recipe)
        settle_executor(spec, recipe.cards_per_run())  # this host's: the host type, its refusals, the device files
        repo = history.open_repo(spec.range.repo or ".")
        evaluator = session_evaluator(spec, repo, recipe, session_dir, builder, executor)
        stop_leftovers(evaluator, progress)
        return spec, evaluator

    @staticmethod
    def _check_same_reference(question: SettingsQuestion, journal: SettingsJournal) -> None:
        """A search continues against the reference it started with (its verdicts are judged against it)."""
        started = journal.header.reference_commit
        if question.reference_at is None:
            return
        try:
            asked = history.resolve_ref(history.open_repo(journal.header.request.range.repo or "."),
                                        question.reference_at)
        except UsageError as exc:
            journal.close()
            raise UsageError(f"--reference-at {question.reference_at}: {exc}") from None
        if asked != started:
            journal.close()
            was = f"the reference commit {started[:12]} ({journal.header.reference_ref})" if started else \
                "no reference commit"
            raise UsageError(f"settings search {journal.session_dir} judges against {was}, not --reference-at "
                             f"{question.reference_at}; continue it without --reference-at, or start a new one with "
                             "another --session")

    @staticmethod
    def _asks_variant(question: SettingsQuestion) -> bool:
        return bool(question.good_set or question.good_recipe or question.vary)

    @staticmethod
    def _header(question: SettingsQuestion, request: RunRequest, recipe: Recipe) -> SettingsHeader:
        repo_path = str(Path(request.range.repo or ".").resolve())
        repo = history.open_repo(repo_path)
        ref = question.ref
        assert ref is not None  # settings_request's
        commit = history.resolve_ref(repo, ref)
        if question.reference_at is not None and not compares_with_good_end(recipe):
            raise UsageError(f"--reference-at {question.reference_at}: recipe {recipe.name} compares no output with "
                             f"a good end's (reference.kind {recipe.reference.kind}"
                             f"{', an accuracy recipe' if recipe.accuracy is not None else ''}), so it needs no "
                             "reference commit; drop --reference-at")
        differences, further = plan_differences(recipe, question)
        reference_ref = question.reference_at or (question.session_good if reference_cause(recipe, differences)
                                                  else None)
        reference_commit = None
        if reference_ref is not None:
            try:
                reference_commit = history.resolve_ref(repo, reference_ref)
            except UsageError as exc:
                raise UsageError(f"--reference-at {reference_ref}: {exc}") from None
            if reference_commit == commit:
                raise UsageError(f"--reference-at {reference_ref} is the commit the settings are searched at "
                                 f"({commit[:12]}), where every configuration would match itself; give a commit "
                                 "where the case is good (the commit search's good end)")
        mode = request.search.mode or recipe.trials.mode
        noisy = mode == "noisy"
        recipe_name = request.judge.recipe
        assert recipe_name is not None  # settings_request's
        settled = request.settled()  # the request every configuration runs under, kept as a commit session keeps it
        settled.range = RangeSpec(good=commit, bad=commit, repo=repo_path)
        settled.judge.recipe = str(Path(recipe_name).resolve()) if Path(recipe_name).exists() else recipe_name
        settled.search.mode = mode
        level = SettingsLevel(commit=commit, good_set=[f"{d.key}={json.dumps(d.good)}"  # JSON values are YAML
                                                       for d in differences])
        settle_executor(SessionSpec(settled, level), recipe.cards_per_run())  # its slots: configurations at once
        return SettingsHeader(
            tool_version=__version__, request=settled, level=level,
            ref=ref, title=str(repo.commit(commit).summary), recipe_digest=recipe.digest(),
            good_given=[*question.good_set, *question.vary] + (
                [f"--good-recipe {question.good_recipe}"] if question.good_recipe else []),
            differences=[DifferenceRecord(key=d.key, bad=d.bad, good=d.good) for d in differences], vary=further,
            mode=mode, confidence=request.search.confidence or recipe.trials.confidence,
            batch=recipe.trials.count if noisy else 1,
            max_trials=recipe.oracle.stats.max_trials if noisy else 1,
            after_session=str(question.after_session) if question.after_session else None,
            reference_ref=reference_ref, reference_commit=reference_commit)

    # -- configurations -----------------------------------------------------------------------

    def evidence(self) -> dict[Configuration, Evidence]:
        """Each configuration's evidence: without the verdict store's verdicts once one was
        contradicted, and without what an earlier process left unresolved on the host (run again)."""
        evidence: dict[Configuration, Evidence] = {}
        noisy = self.problem.mode == "noisy"
        dropped = self.verdicts is not None and self.verdicts.dropped()
        for at, entry in enumerate(self.journal.entries):
            if isinstance(entry, ConfigurationTrial) and noisy and entry.outcome in (VerdictKind.GOOD, VerdictKind.BAD):
                key = frozenset(entry.configuration)
                evidence[key] = evidence.get(key, Evidence()).add("bad" if entry.outcome == VerdictKind.BAD else "good")
            elif isinstance(entry, ConfigurationRecord) and entry.value_check is None:
                if (dropped and entry.stored is not None) or self.space.run_again(at, entry):
                    continue
                key = frozenset(entry.configuration)
                seen = evidence.get(key, Evidence())
                if entry.stored is not None and noisy:
                    seen = Evidence(seen.good + entry.stored.good, seen.bad + entry.stored.bad, seen.skipped)
                elif not noisy or (entry.verdict.kind == VerdictKind.SKIP and
                                   not any(t.outcome in (VerdictKind.GOOD, VerdictKind.BAD) for t in entry.trials)):
                    seen = seen.add(entry.verdict.kind.value)
                evidence[key] = seen
        return evidence

    def run(self) -> SettingsResult:
        """Search until the trigger is named or the ends are wrong; journal the answer."""
        end = next((e for e in self.journal.entries if isinstance(e, SettingsEnd)), None)
        if end is not None:
            return self._result(end)
        while True:
            interrupts.raise_if_received()
            self._ensure_reference()  # before the round is asked: the good variant, run alone, is then one of its ends
            decision = decide_ddmin(self.problem, self.evidence())
            if isinstance(decision, Ask):
                run_in_slots((decision, *decision.alongside), self.slots, self._run_ask, self.space.stop_runs)
                continue
            if not isinstance(decision, Unresolved) and self.verdicts is not None and self._confirm(decision):
                continue
            break
        self._stop_on_the_host(decision)
        if isinstance(decision, Unresolved):
            return self._finish_unresolved(decision)
        if isinstance(decision, EndsWrong):
            return self._finish_wrong(decision)
        self._check_values(decision)
        return self._finish_found(decision)

    def _stop_on_the_host(self, decision: Trigger | EndsWrong | Unresolved) -> None:
        """Where the answer stands on a configuration the host's failures left unjudged (an end
        skipped, or one the trigger rests on), the search stops (exit 5) naming the failure:
        resumed once the host is freed, it runs that configuration again."""
        if isinstance(decision, Trigger):
            return
        standing = decision.configurations if isinstance(decision, Unresolved) else rests_on(self.problem, decision)
        for configuration in standing:
            records = self.space.records(configuration)
            if records and records[-1].host_failure is not None:
                raise InfrastructureError(
                    f"configuration {self.space.label(configuration)} could not be judged: {records[-1].host_failure}; "
                    "no trigger can be named without it: free the host (cards, ports, the harness's server) or "
                    f"raise --retries, then run the same `bisect-npu settings` command with --session "
                    f"{self.journal.session_dir}")

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
        good = self.space.records(frozenset())
        return [trial for record in good for trial in record.trials] if good else None

    def _run_good_variant(self, trials: int) -> None:
        self.space.run(frozenset(), trials, as_reference=True)

    def _run_ask(self, ask: Ask, _first_trial: int | None) -> None:
        """One configuration the search asks (its trial numbers its own: no two slots run one configuration)."""
        self.space.run(ask.configuration, ask.trials)

    # -- the further values of --vary ---------------------------------------------------------

    def _check_values(self, trigger: Trigger) -> None:
        """Each further --vary value of a trigger key, in place of its bad value: does it avoid the
        failure as the good variant's value does?"""
        for key, values in self.header.vary.items():
            index = next(i for i, d in enumerate(self.differences) if d.key == key)
            if index not in trigger.keys:
                continue
            for value in values:
                check = f"{key}={show(value)}"
                while self._value_reading(trigger.keys, check) is None:
                    self.space.run(trigger.keys, self.problem.batch, extra={key: value})

    def _value_reading(self, configuration: Configuration, check: str) -> str | None:
        records = [e for at, e in enumerate(self.journal.entries) if isinstance(e, ConfigurationRecord)
                   and e.value_check == check and not self.space.run_again(at, e)]
        if not records:
            return None
        if self.problem.mode == "exact":
            return records[-1].verdict.kind.value
        trials = [t for r in records for t in r.trials if t.outcome]
        seen = Evidence(good=sum(t.outcome == VerdictKind.GOOD for t in trials),
                        bad=sum(t.outcome == VerdictKind.BAD for t in trials))
        return read_trials(self.problem, self.evidence(), seen) if trials else "skip"

    # -- the end ------------------------------------------------------------------------------

    def _finish_found(self, trigger: Trigger) -> SettingsResult:
        keys = [self.differences[i] for i in sorted(trigger.keys)]
        tried = len({e.digest for e in self.journal.entries if isinstance(e, ConfigurationRecord)})
        message = end_messages.settings_found(self.header.commit, keys, len(self.differences) - len(keys), tried)
        end = SettingsEnd(status="found", trigger=sorted(trigger.keys), message=message)
        self.journal.append(end)
        return self._result(end)

    def _finish_unresolved(self, unresolved: Unresolved) -> SettingsResult:
        """No trigger: configurations it rests on were skipped for reasons of their own (the host's
        failures stop the search before: `_stop_on_the_host`)."""
        unjudged = [(self.space.label(c), records[-1].verdict.reason if (records := self.space.records(c))
                     else "not run") for c in unresolved.configurations]
        message = end_messages.settings_unresolved(
            self.header.commit, [self.differences[i] for i in sorted(unresolved.trigger)], unjudged)
        end = SettingsEnd(status="unresolved", message=message,
                          unresolved=[sorted(c) for c in unresolved.configurations])
        self.journal.append(end)
        return self._result(end)

    def _finish_wrong(self, wrong: EndsWrong) -> SettingsResult:
        side_keys = frozenset() if wrong.which == "good" else frozenset(range(len(self.differences)))
        reference = next((e for e in self.journal.entries if isinstance(e, ReferenceRecord)
                          and frozenset(e.configuration) == side_keys and e.verdict.kind != VerdictKind.GOOD), None)
        message = end_messages.settings_ends_wrong(
            wrong.which, self.differences, f"{self.header.commit[:12]} ({self.header.ref})",
            skipped=bool(wrong.figures.get("skipped")), reference=reference,
            reference_label=self.space.reference_label() if reference is not None else "",
            log_dir=self.journal.session_dir / "configurations")
        end = SettingsEnd(status="ends_wrong", which=wrong.which, message=message,
                          figures={k: float(v) for k, v in wrong.figures.items()})
        self.journal.append(end)
        return self._result(end)

    def _result(self, end: SettingsEnd) -> SettingsResult:
        tried = len({e.digest for e in self.journal.entries if isinstance(e, ConfigurationRecord)})
        trigger = [self.differences[i] for i in end.trigger]
        code = EXIT_NARROWED if end.status == "unresolved" else EXIT_CODES[end.status]  # untestable ones hide it
        return SettingsResult(end.status, code, self.journal.session_dir, end.message, trigger, tried)

    def close(self) -> None:
        try:
            self.space.close()
            self.base.close()
        finally:
            self.journal.close()


def culprit_settings(spec: SessionSpec, level: SettingsLevel, session_dir: Path,
                     session_good: str | None) -> tuple[SettingsQuestion, RunRequest]:
    """The settings search `run --settings` asks at a commit session's culprit (`level.commit`), and
    the request its runs are made under: the commit session's own, every option kept, at the culprit."""
    question = SettingsQuestion(ref=level.commit, good_set=level.good_set, after_session=session_dir.resolve(),
                                session_good=session_good)
    request = spec.request.settled()
    request.range = RangeSpec(good=level.commit, bad=level.commit, repo=spec.range.repo or ".")
    return question, request


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
