"""Fix proposals, what `fix` ranks and verifies: journaled by the session and shown by the report.

Beside `observations`, the other shapes that cross room boundaries (docs/design/flow.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bisect_npu.observations import Verdict


@dataclass(frozen=True)
class Reason:
    """One piece of evidence for a proposal, in words a reviewer can check."""

    signal: str
    detail: str
    weight: float


BRANCHES_SHOWN = 3  # a fix line names this many branches, then "and N more" (release branches add up)


def some_branches(names: list[str], shown: int = BRANCHES_SHOWN) -> str:
    """`a, b, c and 11 more`: a fix cherry-picked to every release branch made lines of 14-19 names."""
    if len(names) <= shown + 1:  # "and 1 more" is no shorter than the name
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


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
    confidence: float = 0.0  # P(this is the fix), from the fitted model (bisect_npu.fix.model): the order
    model_score: float = 0.0  # the model's score (log-odds scale) before the softmax over candidates
    features: dict[str, float] = field(default_factory=dict)  # the evidence the model read

    @property
    def also_on(self) -> list[str]:
        """The same change's other commits (shas[0] is the one on the user's branch), with their branches."""
        return [f"also on {', '.join(self.sha_branches.get(sha) or ['no branch'])} as {sha[:10]}"
                for sha in self.shas[1:]]


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
    confident: bool = False  # the best proposal's confidence reaches fix.model.CONFIDENT: else leads only


FixStatus = Literal["verified", "not_verified", "conflict", "already_applied", "build_failed"]


@dataclass
class FixVerification:
    proposal: FixProposal
    status: FixStatus
    verdict: Verdict | None = None
    applied_sha: str | None = None
    conflict_files: list[str] = field(default_factory=list)
    detail: str = ""
