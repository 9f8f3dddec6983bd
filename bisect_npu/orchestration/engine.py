"""The one session engine of both searches: a session over a candidate space.

A session opens one way whatever it searches (`opening/session_opening.py`: its journal reopened
and checked, or new with its header; its evaluator made; the journal folded into its state once,
the retry budget going on with the host's record the journal holds); then the engine drives it.

A session answers from its journal when it has ended; else it lets its space take what the verdict
store holds, then asks the space's decide function for a round, runs the round (the reference
alone first where it is one, the rest over the slots), asks again, runs fresh what the answer rests
on where only the store judged it, and finishes. Each candidate is judged the same way (`judge`):
the store's verdict journaled where it holds one, else what must be settled before its run (a
configuration at the reference commit), else its run through `candidate.run_candidate`, every
finished trial and failed attempt journaled the moment it ends, its `JudgedRun` journaled under the
space's keys (`judged_record`), the verdict kept unless the host's failures left it unjudged.

A candidate the host's failures left unjudged is journaled with why (`host_failure`), its attempts
in its record; where the search cannot answer without it (an end: `Candidate.end`; for the
settings search also a configuration its answer rests on) the session stops there with exit 5
(`HostStop`). Run again, its space asks it again (a given-up record read from the journal is no
evidence), and its attempts are numbered on from the given-up ones, with the budget they left.

What differs lives in the space (`CandidateSpace`; the commit search's `session.Session`, the
settings search's `settings_session.SettingsSearch`): its decide function and what its answer
rests on, and, for each candidate (`Candidate`), its key, its commit and build key, its label, the
evaluator and request that run it (its step directory and recipe) and its records' keys.
A change to how a candidate is run made here reaches both searches.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from bisect_npu import interrupts
from bisect_npu.errors import InfrastructureError
from bisect_npu.orchestration.opening.verdict_reuse import Reused, SessionVerdicts
from bisect_npu.orchestration.running.candidate import CandidateJournal, run_candidate
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
from bisect_npu.orchestration.running.slots import run_in_slots
from bisect_npu.progress import Progress
from bisect_npu.records import BuildInfo, JudgedRun, RetryRun, TrialRun

Query = TypeVar("Query")  # what a round asks of one candidate: a position and its trials, a configuration's ask
Answer = TypeVar("Answer")  # the decide function's answer: found, narrowed, ends wrong, a trigger, unresolved
Result_co = TypeVar("Result_co", covariant=True)  # what the session returns
Key = TypeVar("Key", bound=Hashable)  # a candidate as the verdict store's ledger keeps it
Rec = TypeVar("Rec")  # a record of the space's journal


@dataclass(frozen=True)
class Round(Generic[Query]):
    """What the decide function asks next: `queries` over the slots, after `alone` (the reference,
    whose runs the others are judged against) where there is one; `firsts` numbers the trials of
    queries run at once where two may test one candidate (None: each query numbers its own)."""

    queries: Sequence[Query]
    alone: Query | None = None
    firsts: Callable[[Sequence[Query]], Sequence[int]] | None = None


class CandidateSpace(Protocol[Query, Answer, Result_co]):
    """What a search supplies to the engine."""

    @property
    def slots(self) -> int:
        """Candidates run at once, each on a slot's cards."""

    def answered(self) -> Result_co | None:
        """The answer of a session that ended already (from its journal), else None."""

    def open(self) -> None:
        """Before the first decision: journal what the verdict store holds of the candidates."""

    def decide(self) -> Round[Query] | Answer:
        """The next round, or the answer the evidence gives."""

    def run_query(self, query: Query, first_trial: int | None) -> None:
        """Judge one candidate of a round (`judge`)."""

    def confirm(self, answer: Answer) -> bool:
        """Run fresh what `answer` rests on where only the store judged it; True when it ran any."""

    def finish(self, answer: Answer) -> Result_co:
        """Journal how the session ended and say it."""

    def stop_runs(self) -> None:
        """An interrupt stops what the other slots run."""


def drive(space: CandidateSpace[Query, Answer, Result_co]) -> Result_co:
    """Search until the space's decide function answers, and finish."""
    answered = space.answered()
    if answered is not None:
        return answered
    space.open()
    while True:
        interrupts.raise_if_received()
        decision = space.decide()
        if isinstance(decision, Round):
            if decision.alone is not None:
                space.run_query(decision.alone, None)
            run_in_slots(decision.queries, space.slots, space.run_query, space.stop_runs, decision.firsts)
            continue
        if not space.confirm(decision):
            return space.finish(decision)


@dataclass(frozen=True)
class HostStop:
    """How a session stops (exit 5) on a candidate the host's failures left unjudged where it
    cannot answer without it: `name` says which and why it is needed, `resume` what runs it again."""

    name: str
    resume: str

    def error(self, host_failure: str) -> InfrastructureError:
        return InfrastructureError(f"{self.name} could not be judged, {host_failure}: free the host (cards, ports, "
                                   f"the harness's server) or raise --retries, then {self.resume}")


@dataclass(frozen=True)
class Candidate(Generic[Key, Rec]):
    """One candidate as its space gives it to `judge`: `key` in the verdict store's ledger, `commit`
    and `build_key` where it runs, `label` on the progress lines, `evaluation` the evaluator and
    request that run it (its step directory, recipe and trials), `retried` the failed attempts
    journaled since its last record, `given_up` those of its records the host left unjudged since
    it was last judged (its attempts are numbered on from them), `end` how the session stops where
    the host leaves it unjudged (None: its skip is the search's to weigh); its records under its
    space's keys: `trial`, `retry`, and `record`, the space's judged record type (a `JudgedRun` and
    its keys), made with `record_keys` (`judged_record`); `settled` a judgement without its run
    (None: run it), `started` and `said` what the progress lines say of it."""

    key: Key
    commit: str
    build_key: str
    label: str
    evaluation: Callable[[], tuple[Evaluator, EvaluationRequest]]
    retried: Sequence[RetryRun]
    trial: Callable[[TrialRun], Rec]
    retry: Callable[[RetryRun], Rec]
    record: Callable[..., Rec]
    record_keys: Mapping[str, object]
    given_up: Sequence[RetryRun] = ()
    end: HostStop | None = None
    settled: Callable[[], JudgedRun | None] = lambda: None
    started: Callable[[], None] = lambda: None
    said: Callable[[Rec], None] = lambda _record: None


def recall(candidate: Candidate[Key, Rec], append: Callable[[Rec], None],
           verdicts: SessionVerdicts[Key] | None) -> Rec | None:
    """Journal the verdict store's verdict of `candidate` instead of running it, where it holds one."""
    if verdicts is None:
        return None
    journaled: list[Rec] = []

    def journal(reused: Reused) -> None:
        journaled.append(judged_record(candidate, JudgedRun(
            verdict=reused.verdict, build=BuildInfo(how="stored", key=candidate.build_key or None),
            stored=reused.stored)))
        append(journaled[-1])

    if verdicts.recall(candidate.key, candidate.commit, candidate.build_key, journal) is None:
        return None
    candidate.said(journaled[-1])
    return journaled[-1]


def judge(candidate: Candidate[Key, Rec], append: Callable[[Rec], None], progress: Progress,
          verdicts: SessionVerdicts[Key] | None) -> Rec:
    """Judge one candidate and journal its record (`append`: the space's one way of journaling,
    which folds each record into its state); `verdicts` None where the store is not asked."""
    interrupts.raise_if_received()
    reused = recall(candidate, append, verdicts)
    if reused is not None:
        return reused
    settled = candidate.settled()
    if settled is not None:
        return _journal(candidate, append, settled)
    candidate.started()

    def on_trial(run: TrialRun) -> None:
        record = candidate.trial(run)
        append(record)
        candidate.said(record)

    evaluator, request = candidate.evaluation()
    run = run_candidate(evaluator, request, CandidateJournal(
        candidate.label, on_trial, lambda retry: append(candidate.retry(retry)), candidate.retried,
        candidate.given_up), progress)
    result = run.result
    record = _journal(candidate, append, JudgedRun(
        verdict=result.verdict, build=result.build, trials=result.trials, seconds=result.seconds,
        retries=run.retries, host_failure=run.host_failure))
    if verdicts is not None and run.host_failure is None:
        verdicts.keep(candidate.key, candidate.commit, candidate.build_key, result.verdict)
    return record


def judged_record(candidate: Candidate[Key, Rec], judged: JudgedRun) -> Rec:
    """A judged candidate's record in its space's journal: the space's record type under the
    candidate's keys, holding the judged run; the one place either search's judged record is made."""
    return candidate.record(**candidate.record_keys, **judged.judged_fields())


def _journal(candidate: Candidate[Key, Rec], append: Callable[[Rec], None], judged: JudgedRun) -> Rec:
    """Journal the candidate's record; stop the session where the host left an end unjudged."""
    record = judged_record(candidate, judged)
    append(record)
    candidate.said(record)
    if judged.host_failure is not None and candidate.end is not None:
        raise candidate.end.error(judged.host_failure)
    return record
