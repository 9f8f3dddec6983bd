"""Which setting breaks it: the settings search's question and its answer, at one commit.

Given a bad recipe and a good variant (`--good-set KEY=VALUE`, a second recipe, or `--vary`),
the keys they differ in are searched with ddmin (search/ddmin.py) for the smallest set whose bad
values turn the good variant bad. This module holds the question (the good variant, `--vary` and
its further values, the reference commit, which a resumed search must keep:
`check_same_reference`; the journal's header that keeps them) and the answer (`SettingsEnd`: a
trigger of keys, not a culprit; how a --vary value's check reads). Nothing here runs a
configuration: the session over configurations does (orchestration/settings_session.py), each
through its space (orchestration/configurations.py) and `candidate.run_candidate`, as the commit
search runs a commit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from bisect_npu import __version__
from bisect_npu.errors import UsageError
from bisect_npu.level import SettingsLevel
from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.ending import end_messages
from bisect_npu.orchestration.ending.result import EXIT_CODES, EXIT_NARROWED
from bisect_npu.orchestration.opening.open_session import Fact
from bisect_npu.orchestration.opening.session_spec import SessionSpec
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
from bisect_npu.records import HeaderRecord
from bisect_npu.request import RangeSpec, RunRequest
from bisect_npu.search import EndsWrong, Evidence
from bisect_npu.search.ddmin import (
    Configuration,
    SettingsProblem,
    Trigger,
    Unresolved,
    read_trials,
)
from bisect_npu.settings_journal import (
    ConfigurationRecord,
    DifferenceRecord,
    ReferenceRecord,
    SettingsEnd,
    SettingsHeader,
    SettingsJournal,
)
from bisect_npu.upstream import history


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
    """What makes a settings search another one, as `open_session.first_difference` compares: its
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
    against_good_end = recipe.oracle.line_from_end() is not None
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


def check_same_reference(question: SettingsQuestion, journal: SettingsJournal) -> None:
    """A search continues against the reference it started with (its verdicts are judged against it)."""
    started = journal.header.reference_commit
    if question.reference_at is None:
        return
    try:
        asked = history.resolve_ref(history.open_repo(journal.header.request.range.repo or "."),
                                    question.reference_at)
    except UsageError as exc:
        raise UsageError(f"--reference-at {question.reference_at}: {exc}") from None
    if asked != started:
        was = f"the reference commit {started[:12]} ({journal.header.reference_ref})" if started else \
            "no reference commit"
        raise UsageError(f"settings search {journal.session_dir} judges against {was}, not --reference-at "
                         f"{question.reference_at}; continue it without --reference-at, or start a new one with "
                         "another --session")


def asks_variant(question: SettingsQuestion) -> bool:
    return bool(question.good_set or question.good_recipe or question.vary)


def settings_header(question: SettingsQuestion, request: RunRequest, recipe: Recipe) -> SettingsHeader:
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


# -- the answer -------------------------------------------------------------------------------


def value_checks(header: SettingsHeader, trigger: Trigger) -> list[tuple[str, Any]]:
    """The further --vary values of the trigger's keys, each checked alone in place of its key's
    bad value (does it avoid the failure as the good variant's value does?)."""
    keys = [d.key for d in header.differences]
    return [(key, value) for key, values in header.vary.items() if keys.index(key) in trigger.keys
            for value in values]


def value_reading(problem: SettingsProblem, records: Sequence[ConfigurationRecord],
                  evidence: Mapping[Configuration, Evidence]) -> str | None:
    """How a --vary value's check reads from its `records`: None until it ran; exact, its last
    verdict; noisy, its trials read as ddmin reads a configuration's (`read_trials`)."""
    if not records:
        return None
    if problem.mode == "exact":
        return records[-1].verdict.kind.value
    trials = [t for r in records for t in r.trials if t.outcome]
    seen = Evidence(good=sum(t.outcome == VerdictKind.GOOD for t in trials),
                    bad=sum(t.outcome == VerdictKind.BAD for t in trials))
    return read_trials(problem, evidence, seen) if trials else "skip"


def found_end(header: SettingsHeader, trigger: Trigger, tried: int) -> SettingsEnd:
    differences = differences_of(header)
    keys = [differences[i] for i in sorted(trigger.keys)]
    message = end_messages.settings_found(header.commit, keys, len(differences) - len(keys), tried)
    return SettingsEnd(status="found", trigger=sorted(trigger.keys), message=message)


def unresolved_end(header: SettingsHeader, unresolved: Unresolved, unjudged: list[tuple[str, str]]) -> SettingsEnd:
    """No trigger: configurations it rests on (`unjudged`: each label and why) were skipped for
    reasons of their own (the host's failures stop the search before it answers)."""
    differences = differences_of(header)
    message = end_messages.settings_unresolved(header.commit, [differences[i] for i in sorted(unresolved.trigger)],
                                               unjudged)
    return SettingsEnd(status="unresolved", message=message, unresolved=[sorted(c) for c in unresolved.configurations])


def wrong_end(header: SettingsHeader, wrong: EndsWrong, reference: ReferenceRecord | None, reference_label: str,
              log_dir: Path) -> SettingsEnd:
    """A side (the good variant, the bad case) that did not behave as given; `reference`: that
    side's run at the reference commit where it was not good there."""
    message = end_messages.settings_ends_wrong(
        wrong.which, differences_of(header), f"{header.commit[:12]} ({header.ref})",
        skipped=bool(wrong.figures.get("skipped")), reference=reference, reference_label=reference_label,
        log_dir=log_dir)
    return SettingsEnd(status="ends_wrong", which=wrong.which, message=message,
                       figures={k: float(v) for k, v in wrong.figures.items()})


def settings_result(header: SettingsHeader, end: SettingsEnd, session_dir: Path, tried: int) -> SettingsResult:
    differences = differences_of(header)
    code = EXIT_NARROWED if end.status == "unresolved" else EXIT_CODES[end.status]  # untestable ones hide it
    return SettingsResult(end.status, code, session_dir, end.message, [differences[i] for i in end.trigger], tried)


def differences_of(header: SettingsHeader) -> list[Difference]:
    return [Difference(d.key, d.bad, d.good) for d in header.differences]


def culprit_settings(spec: SessionSpec, level: SettingsLevel, session_dir: Path,
                     session_good: str | None) -> tuple[SettingsQuestion, RunRequest]:
    """The settings search `run --settings` asks at a commit session's culprit (`level.commit`), and
    the request its runs are made under: the commit session's own, every option kept, at the culprit."""
    question = SettingsQuestion(ref=level.commit, good_set=level.good_set, after_session=session_dir.resolve(),
                                session_good=session_good)
    request = spec.request.settled()
    request.range = RangeSpec(good=level.commit, bad=level.commit, repo=spec.range.repo or ".")
    return question, request
