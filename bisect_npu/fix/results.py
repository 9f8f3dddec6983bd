"""What proposing and verifying a fix return: proposals with the reasons behind them, the report, and the
outcome of applying and evaluating each proposal."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bisect_npu.contracts import Verdict


@dataclass(frozen=True)
class Reason:
    """One piece of evidence for a proposal, in words a reviewer can check."""

    signal: str
    detail: str
    weight: float


@dataclass
class FixProposal:
    """One fix, possibly cherry-picked to several branches (all its shas and branches listed)."""

    shas: list[str]
    branches: list[str]
    title: str
    pr: int | None
    score: float
    reasons: list[Reason]
    pr_url: str | None = None
    date: int = 0  # commit time (epoch seconds) of the earliest sha: the tie-breaker
    missing_on: list[str] = field(default_factory=list)  # branches with the culprit but not this fix
    sha_branches: dict[str, list[str]] = field(default_factory=dict)  # each twin sha -> branches holding it


@dataclass(frozen=True)
class DependencyNote:
    """The culprit only bumps a dependency: the regression lives in that dependency's range."""

    package: str
    old: str
    new: str
    files: list[str]

    @property
    def message(self) -> str:
        return (f"the regression comes from the dependency: bisect {self.package} "
                f"between {self.old} and {self.new} next")


@dataclass(frozen=True)
class CulpritTwin:
    """A cherry-pick of the culprit on a branch that does not hold the culprit itself."""

    sha: str
    branches: list[str]
    fixed: bool  # some proposal reaches this twin's branches


@dataclass
class FixReport:
    culprit: str
    proposals: list[FixProposal]
    dependency: DependencyNote | None
    note: str
    twins: list[CulpritTwin] = field(default_factory=list)
    tips: dict[str, str] = field(default_factory=dict)  # branch -> sha searched


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
FixStatus = Literal["verified", "not_verified", "conflict", "already_applied", "build_failed"]


@dataclass
class FixVerification:
    proposal: FixProposal
    status: FixStatus
    verdict: Verdict | None = None
    applied_sha: str | None = None
    conflict_files: list[str] = field(default_factory=list)
    detail: str = ""
