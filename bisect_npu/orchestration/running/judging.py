"""A user command's verdict (its exit status, as `git bisect run` reads it, and the reason line it
may write) and noisy mode's tally of trials judged one by one: what the evaluator judges a
candidate by where no oracle reads observations."""

from __future__ import annotations

from pathlib import Path

from bisect_npu.errors import InfrastructureError
from bisect_npu.execute.base import RunResult
from bisect_npu.observations import ABORT_ABOVE, SKIP_EXIT, TimeoutIs, Verdict, VerdictKind
from bisect_npu.records import TrialRun

TIMEOUT_IS_BAD_NOTE = ", counted bad (--timeout-is bad)"


def command_verdict(result: RunResult, timeout_is: TimeoutIs = "skip", said: str = "",
                    timeout_s: float | None = None) -> Verdict:
    """Map a user command's exit status to a verdict (the `git bisect run` protocol); a run past
    --timeout is `timeout_is` (skip unless the regression is a hang). `said` is the reason line the
    command wrote, quoted when it aborts the run."""
    code = result.returncode
    figures = {"exit_code": code, "log": result.log_path}
    if result.timed_out:
        limit = f"ran past --timeout {timeout_s:g}s (stopped after {result.seconds:.0f}s)" if timeout_s else \
            f"timed out after {result.seconds:.0f}s"
        return Verdict(kind=VerdictKind(timeout_is), reason=f"command {limit}"
                       f"{TIMEOUT_IS_BAD_NOTE if timeout_is == 'bad' else ''}", figures=figures)
    if code == 0:
        return Verdict(kind=VerdictKind.GOOD, reason="command exited 0", figures=figures)
    if code == SKIP_EXIT:
        return Verdict(kind=VerdictKind.SKIP, reason="command exited 125 (skip)", figures=figures)
    if 0 < code <= ABORT_ABOVE:
        return Verdict(kind=VerdictKind.BAD, reason=f"command exited {code}", figures=figures)
    raise InfrastructureError(f"command exited {code} (above 127, or killed by a signal): aborting as "
                              f"`git bisect run` does{f' ({said})' if said else ''}; see {result.log_path}, "
                              "fix it, then `bisect-npu resume` (with --accept-changed-command where the fix "
                              "changed the command's script)")


REASON_FILE_ENV = "BISECT_NPU_REASON_FILE"  # a command may write its verdict's reason there, one line


def command_reason(reason_path: Path) -> str:
    """The first line the command wrote to `REASON_FILE_ENV`'s file ("" when it wrote none)."""
    try:
        lines = reason_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[0].strip()[:500] if lines else ""


def with_command_reason(verdict: Verdict, said: str) -> Verdict:
    """The verdict with the command's own reason line after its exit status ("command exited 1:
    tests/ut/x.py::test_y failed"); as it was when it wrote none."""
    return verdict.model_copy(update={"reason": f"{verdict.reason}: {said}"}) if said else verdict


def tally(records: list[TrialRun]) -> Verdict:
    """Trials judged one by one (noisy mode) as one step verdict: bad if any trial was bad, good if
    some were good and none bad, skip if no trial could be judged."""
    bad = sum(1 for r in records if r.outcome == VerdictKind.BAD)
    good = sum(1 for r in records if r.outcome == VerdictKind.GOOD)
    kind = VerdictKind.BAD if bad else VerdictKind.GOOD if good else VerdictKind.SKIP
    reason = f"{bad} of {bad + good} trials bad"
    if kind == VerdictKind.SKIP:  # say why: the first trial's own reason (a probe error, exit 125, ...)
        why = next((r.reason for r in records if r.reason), "")
        runs = f"{len(records)} run{'s' if len(records) != 1 else ''}"
        reason = f"no trial could be judged ({runs}): {why}" if why else reason
    return Verdict(kind=kind, reason=reason, figures={"bad": bad, "good": good}, trials=len(records))
