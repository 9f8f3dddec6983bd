"""Ground truth of a generated demo upstream, stored next to (never inside) the repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

MANIFEST_SCHEMA_VERSION = 1


class CommitRef(BaseModel):
    sha: str
    title: str
    branch: str


class DependencyTruth(BaseModel):
    """The dependency side of a case whose upstream culprit only moves a pin: the dependency's own
    culprit between the two pins, and its later fix."""

    name: str
    pin_file: str
    pin_arg: str
    old_pin: str
    new_pin: str
    old_sha: str
    new_sha: str
    culprit: CommitRef
    culprit_parent: str
    fix: CommitRef
    fix_tag: str = Field(description="the first dependency tag that contains the fix")


class SettingsTruth(BaseModel):
    """A settings search of the case at its bad end (`bisect-npu settings --at BAD_REF`): the good
    variant `good_set` (what `--good-set KEY=VALUE` gives, in that order) holds the trigger's good
    values and differences that change nothing; the search must name exactly `trigger`.
    `reference_at`: the commit the search judges each configuration against (`--reference-at`),
    where its recipe compares with the good end's output and the trigger is the output length."""

    good_set: dict[str, Any]
    trigger: list[str]
    reference_at: str | None = None


class CaseTruth(BaseModel):
    """One seeded regression: bisecting good_ref..bad_ref with `recipe` must find `culprit`."""

    name: str
    recipe: str
    symptom: str
    good_ref: str
    bad_ref: str
    good_sha: str
    bad_sha: str
    culprit: CommitRef
    culprit_parent: str
    fixes: list[CommitRef]
    dependency: DependencyTruth | None = None
    settings: SettingsTruth | None = None


class DependencyRepo(BaseModel):
    """A generated dependency of the upstream (its own repository, next to the upstream's)."""

    name: str
    repo: str = Field(description="path of the generated repository")
    commit_count: int
    branches: dict[str, str] = Field(description="branch name -> tip sha")
    tags: dict[str, str] = Field(description="tag name -> sha")
    import_failing: list[CommitRef] = Field(description="commits at which the upstream cannot import it")
    unrelated_bugfix: CommitRef


class CompiledTouch(BaseModel):
    """A commit that changes what the image's compiled part depends on."""

    sha: str
    paths: list[str]


class Manifest(BaseModel):
    schema_version: int = MANIFEST_SCHEMA_VERSION
    generator_version: str
    seed: int
    repo: str = Field(description="path of the generated repository")
    commit_count: int
    branches: dict[str, str] = Field(description="branch name -> tip sha")
    tags: dict[str, str] = Field(description="tag name -> sha")
    default_case: str
    cases: list[CaseTruth]
    unrelated_bugfix: CommitRef
    build_failing: list[CommitRef]
    compiled_touching: list[CompiledTouch]
    build_command: list[str]
    dependencies: list[DependencyRepo] = Field(default_factory=list)

    def case(self, name: str) -> CaseTruth:
        for case in self.cases:
            if case.name == name:
                return case
        raise KeyError(f"unknown demo case {name!r}; known: {', '.join(c.name for c in self.cases)}")

    def dependency(self, name: str) -> DependencyRepo:
        for dependency in self.dependencies:
            if dependency.name == name:
                return dependency
        raise KeyError(f"unknown demo dependency {name!r}; known: {', '.join(d.name for d in self.dependencies)}")

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
