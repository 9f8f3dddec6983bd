"""What one session runs: the request (`bisect_npu.request`), its level (`bisect_npu.level`) and
what the run found besides (`RunContext`), together as `SessionSpec`; and the request's facts the
sessions derive (earlier runs, declared dependencies)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from bisect_npu.errors import UsageError, validation_problem
from bisect_npu.level import CommitsLevel, LevelSpec, ReleasesLevel
from bisect_npu.recipe.schema import DependencySpec, EarlierRunsSpec, Recipe
from bisect_npu.request import (
    ExecutorSpec,
    FixSpec,
    JudgeSpec,
    RangeSpec,
    RunContext,
    RunRequest,
    SearchSpec,
    StoreSpec,
)
from bisect_npu.search import EarlierRuns


def first_level(request: RunRequest) -> LevelSpec:
    """The level a request starts at: its package's releases, else its repository's commits
    (laid over a release with --overlay-on-release)."""
    if request.range.package:
        return ReleasesLevel()
    return CommitsLevel(overlay_on_release=request.range.overlay_on_release)


@dataclass
class SessionSpec:
    """A session's request, level and context. The parts are settled in place before the session
    starts (the recipe's mode, resolved paths, the host type, the slots)."""

    request: RunRequest
    level: LevelSpec
    context: RunContext = field(default_factory=RunContext)

    @classmethod
    def of(cls, request: RunRequest, python_oracle: str | None = None) -> SessionSpec:
        """The first session of a request (its fields checked against their ranges first)."""
        return cls(request.checked(), first_level(request), RunContext(python_oracle=python_oracle))

    @property
    def range(self) -> RangeSpec:
        return self.request.range

    @property
    def judge(self) -> JudgeSpec:
        return self.request.judge

    @property
    def executor(self) -> ExecutorSpec:
        return self.request.executor

    @property
    def search(self) -> SearchSpec:
        return self.request.search

    @property
    def fix(self) -> FixSpec:
        return self.request.fix

    @property
    def store(self) -> StoreSpec:
        return self.request.store

    def with_executor(self, **changes: Any) -> SessionSpec:
        """The same session run another way (a Ray node's executor, one batch's cards)."""
        request = self.request.model_copy(update={"executor": self.executor.model_copy(update=changes)})
        return SessionSpec(request, self.level, self.context)


def earlier_runs_spec(spec: SessionSpec, recipe: Recipe | None) -> EarlierRunsSpec | None:
    """The ends' earlier runs: --earlier-runs (where the level's ends are the ones counted), else
    the recipe's ``trials.earlier_runs``."""
    if not spec.search.earlier_runs or not spec.level.takes_earlier_runs:
        return recipe.trials.earlier_runs if recipe else None
    bad_end, good_end = spec.search.earlier_runs
    try:
        return EarlierRunsSpec(bad_end=bad_end, good_end=good_end)
    except ValidationError as exc:
        _field, reason = validation_problem(exc)
        raise UsageError(f"--earlier-runs {bad_end} {good_end}: {reason}") from exc


def earlier_runs_for_search(counted: EarlierRunsSpec, *, find_fix: bool) -> EarlierRuns:
    """The recipe's counts in the search's terms: "bad" is the side the search hunts for. With
    --find-fix that is the side without the symptom, so the ends swap and passes count."""
    (bad_failed, bad_runs), (good_failed, good_runs) = counted.counts("bad_end"), counted.counts("good_end")
    if find_fix:
        return EarlierRuns(good_runs - good_failed, good_runs, bad_runs - bad_failed, bad_runs)
    return EarlierRuns(bad_failed, bad_runs, good_failed, good_runs)


def declared_dependencies(spec: SessionSpec, recipe: Recipe | None) -> list[DependencySpec]:
    """The recipe's `dependencies`, then the --dependency ones (which replace a recipe's of the
    same name)."""
    given = [parse_dependency_option(text) for text in spec.search.dependencies]
    names = {dependency.name for dependency in given}
    return [*(dependency for dependency in (recipe.dependencies if recipe else []) if dependency.name not in names),
            *given]


def dep_repo_of(spec: SessionSpec, name: str) -> str | None:
    """What --dep-repo NAME=PATH_OR_URL names for the dependency `name`."""
    for entry in spec.search.dep_repos:
        key, _, value = entry.partition("=")
        if key.strip() == name:
            return value.strip()
    return None


def parse_dependency_option(text: str) -> DependencySpec:
    """`--dependency` as `name=vllm,pin=Dockerfile:VLLM_COMMIT/VLLM_TAG,package_dir=vllm,...`
    (`pin=requirements.txt:vllm==` for a requirements line)."""
    fields: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep:
            raise UsageError(f"--dependency {text!r}: {part!r} is not KEY=VALUE; write e.g. name=vllm,"
                             "pin=Dockerfile:VLLM_TAG,package_dir=vllm")
        fields[key.strip()] = value.strip()
    pin = str(fields.pop("pin", ""))
    where, _, what = pin.rpartition(":")
    if what.endswith("=="):
        fields["pin"] = {"file": where or None, "requirement": what[:-2]}
    elif what:
        fields["pin"] = {"file": where or None, "arg": what.split("/")}
    for flag in ("python_only", "installed_by_image"):
        if flag in fields:
            fields[flag] = str(fields[flag]).lower() in ("1", "true", "yes")
    try:
        return DependencySpec.model_validate(fields)
    except ValidationError as exc:
        where_, problem = validation_problem(exc)
        raise UsageError(f"--dependency {text!r}: {where_}: {problem}") from exc


def check_dependency_options(spec: SessionSpec, recipe: Recipe | None) -> list[DependencySpec]:
    """The declared dependencies; a --dep-repo that is not NAME=PATH_OR_URL or names none of
    them is an error."""
    declared = declared_dependencies(spec, recipe)
    known = [dependency.name for dependency in declared]
    for entry in spec.search.dep_repos:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--dep-repo {entry!r}: write NAME=PATH_OR_URL, e.g. --dep-repo vllm=~/src/vllm")
        if key.strip() not in known:
            raise UsageError(f"--dep-repo {entry!r}: no dependency named {key.strip()!r} is declared "
                             f"({', '.join(known) or 'none'}); declare it in the recipe's `dependencies` or with "
                             "--dependency")
    return declared
