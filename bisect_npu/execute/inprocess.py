"""CallableExecutor: a Python function as the oracle, called in this process on each candidate's
checkout (a library user's `bisect_npu.api.bisect(..., oracle=function)`).

Its answer takes the path a `--cmd` exit status takes (0 good, 1 bad, 125 skip; see
orchestration/running/evaluate.py), so the journal, resume and the report work unchanged. The function
runs in this process: there is no timeout to enforce, and nothing is left running to sweep.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from bisect_npu.builders.base import Environment, tail
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.execute.base import RunResult
from bisect_npu.observations import VERDICT_EXIT, Verdict, VerdictKind

OracleAnswer = Verdict | bool | Literal["good", "bad", "skip"]


@runtime_checkable
class Oracle(Protocol):
    """Judges one candidate: `checkout` is the commit's worktree (built by the recipe's or no
    build command), `commit` its full sha. True or "good" when the commit behaves, False or "bad"
    when it shows the symptom, "skip" when it cannot be judged (or a Verdict of those kinds)."""

    def __call__(self, checkout: Path, commit: str) -> OracleAnswer: ...


def oracle_name(oracle: Oracle) -> str:
    """`module:qualname` of the callable, what the journal keeps instead of the callable itself."""
    module = getattr(oracle, "__module__", None) or type(oracle).__module__
    qualname = getattr(oracle, "__qualname__", None) or type(oracle).__qualname__
    return f"{module}:{qualname}"


def answer_kind(answer: object) -> VerdictKind:
    """The verdict an oracle's answer stands for; anything else is the oracle's error."""
    if isinstance(answer, Verdict):
        return answer.kind
    if isinstance(answer, bool):
        return VerdictKind.GOOD if answer else VerdictKind.BAD
    if isinstance(answer, str) and answer in ("good", "bad", "skip"):
        return VerdictKind(answer)
    raise UsageError(f"the oracle answered {answer!r}: it must answer True (good), False (bad), "
                     "'good', 'bad', 'skip' or a Verdict")


class CallableExecutor:
    """Runs a Python oracle where an executor would run a command; it has no probe to run."""

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle
        self.name = oracle_name(oracle)

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        """Call the oracle on the checkout; `argv` (the oracle's name), `timeout_s` and
        `extra_env` are a command's and do not apply in process. The log says what it answered."""
        log_path = log_path.resolve()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            answer = self.oracle(Path(env.path or "."), env.commit)
        except Exception as exc:
            log_path.write_text(traceback.format_exc(), encoding="utf-8")
            raise InfrastructureError(
                f"the oracle {self.name} raised {type(exc).__name__}: {exc} on {env.commit[:12]} (traceback in "
                f"{log_path}); fix it, or have it answer 'skip' for a commit it cannot judge, then call "
                "bisect_npu.api.bisect again with the same session_dir to resume") from exc
        kind = answer_kind(answer)
        reason = f": {answer.reason}" if isinstance(answer, Verdict) and answer.reason else ""
        log_path.write_text(f"oracle {self.name} answered {kind.value}{reason}\n", encoding="utf-8")
        return RunResult(returncode=VERDICT_EXIT[kind], seconds=round(time.monotonic() - started, 3),
                         log_path=str(log_path), log_tail=tail(log_path, 15))

    def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
        raise UsageError("a Python oracle judges checkouts itself; a recipe's probe needs the local or docker executor")

    def close(self) -> None:
        """Nothing outlives a call."""

    def sweep(self) -> int:
        return 0
