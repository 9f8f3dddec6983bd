"""`run --nightly-case`: each candidate runs the nightly case as its own commit has the file
(the case file changes along history: flags, baselines and benchmarks move with the code)."""

from __future__ import annotations

import copy
import time

import git

from bisect_npu.errors import UsageError
from bisect_npu.nightly.at_commit import newest_recipe_at
from bisect_npu.nightly.cases import CaseRef
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator, StepResult
from bisect_npu.records import BuildInfo


class NightlyEvaluator(Evaluator):
    """An Evaluator whose recipe is imported from the case file at each candidate's commit (at
    HEAD's where the commit predates the case); a case the file cannot give is a skip naming why."""

    def __init__(self, base: Evaluator, repo: git.Repo, case: CaseRef, datasets: str | None = None) -> None:
        self.__dict__.update(base.__dict__)
        self.repo = repo
        self.case = case
        self.datasets = datasets

    def evaluate(self, request: EvaluationRequest) -> StepResult:
        started = time.monotonic()
        try:
            recipe, read_at = newest_recipe_at(self.repo, request.commit, self.case, self.datasets)
        except UsageError as exc:
            verdict = Verdict(kind=VerdictKind.SKIP, reason=f"nightly case at this commit: {exc}", trials=0)
            return StepResult(request.commit, verdict, BuildInfo(how="failed", error=str(exc)), list(request.done),
                              round(time.monotonic() - started, 3))
        view = copy.copy(self)  # this commit's recipe, the session's builder, executor and reference
        view.recipe = recipe
        result = Evaluator.evaluate(view, request)
        self.reference = view.reference
        if read_at != request.commit:  # the commit predates the case: say whose file it ran
            note = f" (the case as HEAD {read_at[:12]} has it: this commit predates it)"
            result.verdict = result.verdict.model_copy(update={"reason": result.verdict.reason + note})
        return result
