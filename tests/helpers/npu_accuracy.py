"""The NPU host's command harness over an accuracy round's samples, stood in for at the executor
(no NPU here): each asked sample's outcome written as the harness's observation, each run's trial
and samples remembered, for tests of how accuracy steps are run, resumed and journaled."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bisect_npu.builders.base import Environment
from bisect_npu.execute.base import RunResult, observation_path, probe_log_path, probe_stem
from bisect_npu.observations import Observation, SampleOutcome

IDS = [f"q{i:02d}" for i in range(40)]
ANSWERS = {i: float(n % 3 != 0) for n, i in enumerate(IDS)}  # what the good end's harness scores


def _good_end_answers(env: Environment, sample_id: str) -> SampleOutcome:
    return SampleOutcome(id=sample_id, correct=ANSWERS[sample_id])


class HarnessStandIn:
    """The executor of an NPU host running the command harness over the samples a round asks:
    each one's outcome (`outcome`, at the run's commit; `ANSWERS` by default) in the observation;
    remembers each run's (trial, sample ids) and (commit, trial)."""

    def __init__(self, outcome: Callable[[Environment, str], SampleOutcome] = _good_end_answers,
                 ids: list[str] | None = None) -> None:
        self.outcome, self.ids = outcome, ids or IDS
        self.asked: list[tuple[int, list[str]]] = []
        self.runs: list[tuple[str, int]] = []

    def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
        case, trial = str(request["case_id"]), int(request["trial"])
        ids = request["accuracy"]["sample_ids"] or self.ids
        self.asked.append((trial, list(ids)))
        self.runs.append((env.commit, trial))
        out_dir.mkdir(parents=True, exist_ok=True)
        log = probe_log_path(out_dir, probe_stem(case, trial))
        log.write_text("harness ran\n")
        path = observation_path(out_dir, case, trial)
        path.write_text(Observation(case_id=case, trial=trial, samples=[
            self.outcome(env, i) for i in ids]).model_dump_json())
        return RunResult(returncode=0, seconds=0.01, log_path=str(log), observation=str(path))

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        raise AssertionError("an accuracy recipe's harness runs in the probe")

    def close(self) -> None:
        """Nothing runs between calls."""

    def sweep(self) -> int:
        return 0
