"""Run one candidate, a commit of a range or a configuration at one commit, the same way for both
searches: every finished trial and every attempt that failed on the host journaled the moment it
ends, the attempts journaled before an interrupt counted against the retry budget (the
evaluator's `RetryPolicy` decides when it is spent), each failed attempt said on the progress
lines, and the host failure that left trials unjudged once the budget was spent told apart from a
verdict. A candidate run again after the host left it unjudged numbers its attempts on from the
given-up ones, which count against its budget as the journaled ones do (a budget they spent
starts anew: `RetryPolicy.spent`) but belong to the record that gave up. What a search journals
for its candidate (its record types and keys) comes in as the two callbacks of `CandidateJournal`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator, StepResult
from bisect_npu.progress import Progress
from bisect_npu.records import RetryRun, TrialRun


@dataclass(frozen=True)
class CandidateJournal:
    """How a search journals its candidate: `label` names it on the progress lines, `trial` and
    `retry` journal a finished trial and a failed attempt under the candidate's key, `retried`:
    the attempts journaled since its last record (an interrupted run's), `given_up`: those of its
    records the host's failures left unjudged since it was last judged."""

    label: str
    trial: Callable[[TrialRun], None]
    retry: Callable[[RetryRun], None]
    retried: Sequence[RetryRun] = ()
    given_up: Sequence[RetryRun] = ()


@dataclass
class CandidateRun:
    """A candidate's evaluation, its failed attempts since its last record (the journaled ones
    first), and why the host left it unjudged once they spent the budget (None where it did not)."""

    result: StepResult
    retries: list[RetryRun] = field(default_factory=list)
    host_failure: str | None = None


def run_candidate(evaluator: Evaluator, request: EvaluationRequest, journal: CandidateJournal,
                  progress: Progress) -> CandidateRun:
    """Evaluate `request` (its callbacks are this function's: `journal`'s)."""
    retries = list(journal.retried)
    unjudged: list[str] = []

    def on_retry(retry: RetryRun) -> None:
        journal.retry(retry)
        retries.append(retry)
        progress.note(f"{journal.label}: attempt {retry.attempt} failed on the host ({retry.cause}); retrying")

    result = evaluator.evaluate(replace(request, on_trial=journal.trial, on_retry=on_retry,
                                        retried=(*journal.given_up, *journal.retried),
                                        on_unjudged=unjudged.append))
    host_failure = unjudged[-1] if unjudged and result.verdict.kind == VerdictKind.SKIP else None
    return CandidateRun(result, retries, host_failure)
