"""The NPU host's command harness over an accuracy round's samples, stood in for at the executor
(no NPU here): each asked sample's outcome written as the harness's observation, each run's trial
and samples remembered, for tests of how accuracy steps are run, resumed and journaled."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import git

from bisect_npu.builders.base import Environment
from bisect_npu.builders.local import LocalBuilder
from bisect_npu.execute.base import RunResult, observation_path, probe_log_path, probe_stem
from bisect_npu.observations import Observation, SampleOutcome
from bisect_npu.orchestration.session import Session
from tests.helpers.asked import spec_of

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


def accuracy_session(tmp: Path, name: str, shas: list[str], stand_in: HarnessStandIn, accuracy: dict[str, Any],
                     resume: bool = False) -> Any:
    """A real session over the history at `tmp / "repo"` (built by `true`) with the accuracy recipe
    whose `accuracy` section extends the command harness over `tmp / "d.jsonl"`, in `tmp / name`:
    started and run, or resumed from its journal there."""
    builder = LocalBuilder(git.Repo(tmp / "repo"), tmp / f"{name}-work", ["true"])
    if resume:
        return Session.resume(tmp / name, builder=builder, executor=stand_in).run()
    recipe = tmp / "recipe.yaml"
    recipe.write_text(json.dumps({
        "name": "acc", "model": {"path": "/models/m"}, "oracle": {"kinds": ["accuracy"]},
        "accuracy": {"harness": "command", "dataset": "d.jsonl", "command": {"argv": ["x"]}, **accuracy}}))
    spec = spec_of(good=shas[0], bad=shas[-1], repo=str(tmp / "repo"), recipe=str(recipe), propose_fix=False)
    return Session.start(spec, session_dir=tmp / name, builder=builder, executor=stand_in).run()


def journal_records(session: Path) -> list[dict[str, Any]]:
    """The session's journal lines, in order."""
    return [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
