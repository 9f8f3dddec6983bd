"""What `bisect-npu run` was asked, kept apart from the session that runs it: the journal header
stores it (as `records.HeaderOptions`), resume reads it back, and the report turns it into a
reproduce line."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, ValidationError

from bisect_npu.errors import UsageError
from bisect_npu.recipe import EarlierRunsSpec, Recipe
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
