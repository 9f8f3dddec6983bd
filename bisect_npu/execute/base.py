"""The executor interface: run one probe request, or one user command, in an environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from bisect_npu.build.base import Environment


class RunResult(BaseModel):
    """How one run went; `observation` is set when the probe wrote one."""

    returncode: int
    seconds: float
    log_path: str
    observation: str | None = None
    timed_out: bool = False
    log_tail: str = ""


class Executor(Protocol):
    def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
        """Write `request` under `out_dir`, run the probe on it, return where the observation is."""

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        """Run a user command (the `git bisect run` protocol) in the environment, with `extra_env`
        (BISECT_NPU_COMMIT, BISECT_NPU_TRIAL) so a command can tell repeated trials apart."""

    def close(self) -> None:
        """Stop and remove whatever this executor still runs (containers, servers)."""
