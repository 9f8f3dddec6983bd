"""What `bisect-npu run` was asked, kept apart from the session that runs it: the journal header
stores it (as `records.HeaderOptions`), resume reads it back, and the report turns it into a
reproduce line."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, ValidationError

from bisect_npu.errors import UsageError
from bisect_npu.recipe import DependencySpec, EarlierRunsSpec, Recipe, parse_dependency_option
from bisect_npu.records import HeaderOptions
from bisect_npu.search import EarlierRuns


class RunOptions(HeaderOptions):
    """Everything `bisect-npu run` was asked: the journal header's options (`records.HeaderOptions`,
    where each field is declared once), which the run settles in place before it starts (the
    recipe's mode, resolved paths, the host type, the slots)."""

    model_config = ConfigDict(frozen=False)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()

    def to_header(self) -> HeaderOptions:
        return HeaderOptions.model_validate(self.model_dump())

    @classmethod
    def from_header(cls, header: HeaderOptions) -> RunOptions:
        return cls.model_validate(header.model_dump())

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunOptions:
        return cls.model_validate(raw)


def earlier_runs_spec(options: RunOptions, recipe: Recipe | None) -> EarlierRunsSpec | None:
    """The ends' earlier runs: --earlier-runs, else the recipe's ``trials.earlier_runs``."""
    if not options.earlier_runs:
        return recipe.trials.earlier_runs if recipe else None
    bad_end, good_end = options.earlier_runs
    try:
        return EarlierRunsSpec(bad_end=bad_end, good_end=good_end)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise UsageError(f"--earlier-runs {bad_end} {good_end}: {reason}") from exc


def earlier_runs_for_search(spec: EarlierRunsSpec, *, find_fix: bool) -> EarlierRuns:
    """The recipe's counts in the search's terms: "bad" is the side the search hunts for. With
    --find-fix that is the side without the symptom, so the ends swap and passes count."""
    (bad_failed, bad_runs), (good_failed, good_runs) = spec.counts("bad_end"), spec.counts("good_end")
    if find_fix:
        return EarlierRuns(good_runs - good_failed, good_runs, bad_runs - bad_failed, bad_runs)
    return EarlierRuns(bad_failed, bad_runs, good_failed, good_runs)


def declared_dependencies(options: RunOptions, recipe: Recipe | None) -> list[DependencySpec]:
    """The recipe's `dependencies`, then the --dependency ones (which replace a recipe's of the
    same name)."""
    given = [parse_dependency_option(text) for text in options.dependencies]
    names = {spec.name for spec in given}
    return [*(spec for spec in (recipe.dependencies if recipe else []) if spec.name not in names), *given]


def dep_repo_of(options: RunOptions, name: str) -> str | None:
    """What --dep-repo NAME=PATH_OR_URL names for the dependency `name`."""
    for entry in options.dep_repos:
        key, _, value = entry.partition("=")
        if key.strip() == name:
            return value.strip()
    return None


def check_dependency_options(options: RunOptions, recipe: Recipe | None) -> list[DependencySpec]:
    """The declared dependencies; a --dep-repo that is not NAME=PATH_OR_URL or names none of
    them is an error."""
    declared = declared_dependencies(options, recipe)
    known = [spec.name for spec in declared]
    for entry in options.dep_repos:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--dep-repo {entry!r}: write NAME=PATH_OR_URL, e.g. --dep-repo vllm=~/src/vllm")
        if key.strip() not in known:
            raise UsageError(f"--dep-repo {entry!r}: no dependency named {key.strip()!r} is declared "
                             f"({', '.join(known) or 'none'}); declare it in the recipe's `dependencies` or with "
                             "--dependency")
    return declared
