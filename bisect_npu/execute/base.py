"""The executor interface: run one probe request, or one user command, in an environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from bisect_npu.builders.base import Environment
from bisect_npu.records import NodeBuild


class RunResult(BaseModel):
    """How one run went; `observation` is set when the probe wrote one."""

    returncode: int
    seconds: float
    log_path: str
    observation: str | None = None
    timed_out: bool = False
    log_tail: str = ""
    # A container's run: the id of the image it started from (checked to carry the candidate's commit label).
    image_id: str | None = None
    # A run on other machines (--executor ray): each node's build it ran on, for the step's journaled build.
    nodes: list[NodeBuild] = Field(default_factory=list)


def observation_path(out_dir: Path, case_id: str, trial: int) -> Path:
    """Where the probe writes the observation of one trial: the host watches these paths, so a
    trial of a batch is journaled as soon as its file appears."""
    return out_dir / f"obs-{case_id}-t{trial}.json"


def probe_log_path(out_dir: Path, stem: str) -> Path:
    """The log of one probe run (all trials of a batch share it)."""
    return out_dir / f"probe-{stem}.log"


def run_node_path(out_dir: Path, stem: str) -> Path:
    """Where an executor that runs probes on other machines names the machine of one probe run
    (one line); written before the run's observations land, so each trial's record can carry it."""
    return out_dir / f"node-{stem}.txt"


def probe_stem(case_id: str, trial: int) -> str:
    """Names a probe run's request and log files after its case and first trial."""
    return f"{case_id}-t{trial}"


def with_outputs(request: dict[str, Any], out_dir: Path) -> tuple[dict[str, Any], str]:
    """The request with its observation paths under `out_dir` (each batch entry's, the first
    also at the top), and the stem that names its request and log files."""
    case_id = request.get("case_id", "default")
    stem = probe_stem(case_id, request.get("trial", 0))
    filled = {**request, "output": str(observation_path(out_dir, case_id, request.get("trial", 0)))}
    if request.get("batch"):
        filled["batch"] = [{**entry, "output": str(observation_path(out_dir, case_id, entry["trial"]))}
                           for entry in request["batch"]]
    return filled, stem


class Executor(Protocol):
    def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
        """Write `request` under `out_dir`, run the probe on it (one engine start for all trials of
        a batch request), return how it went; observations land at `observation_path`."""

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        """Run a user command (the `git bisect run` protocol) in the environment, with `extra_env`
        (BISECT_NPU_COMMIT, BISECT_NPU_TRIAL) so a command can tell repeated trials apart."""

    def close(self) -> None:
        """Stop and remove whatever this executor still runs (containers, servers)."""

    def sweep(self) -> int:
        """Stop what an earlier, killed process of this session left running (its containers, its
        probe or command processes), before this one runs anything: a resumed run on an NPU host
        would otherwise share the cards with them. Returns how many went."""
