"""What applying a fix returns. The proposals, the report and the verifications are shared data
(`bisect_npu.fix_proposals`): the session journals them and the report reads them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AppliedFix:
    """The fix cherry-picked onto the bad end: `sha` is a new commit the pipeline can evaluate."""

    sha: str
    bad: str
    fix_shas: list[str]


@dataclass(frozen=True)
class ApplyConflict:
    fix_shas: list[str]
    files: list[str]

    @property
    def message(self) -> str:
        return f"does not apply cleanly: conflicts in {', '.join(self.files) or 'the index'}"


@dataclass(frozen=True)
class AlreadyApplied:
    fix_shas: list[str]
    bad: str

    @property
    def message(self) -> str:
        return "already in the bad end"


ApplyResult = AppliedFix | ApplyConflict | AlreadyApplied  # what apply_fix returns
