"""An end's earlier results checked by a control share in two stages (running/earlier_results.py),
its step interrupted mid-check and resumed: nothing journaled runs again, the rest runs at the
trial numbers the uninterrupted step gave it. A real git history and worktree, the real Evaluator
and journaled trials; the NPU host's harness run is stood in for at the executor (each asked
sample's outcome written as the command harness's observation)."""

from __future__ import annotations

import json
from pathlib import Path

import git

from bisect_npu.builders.local import LocalBuilder
from bisect_npu.observations import Observation, SampleOutcome
from bisect_npu.orchestration.running.earlier_results import control_ids, control_stages
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator, StepResult
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import EarlierEndSpec
from bisect_npu.records import TrialRun
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.npu_accuracy import ANSWERS, IDS, HarnessStandIn

SHARE = 0.25  # 10 control samples: 5 in the first stage, 5 in the second


def _setup(tmp_path: Path) -> tuple[str, list[list[str]]]:
    """A one-commit history, an accuracy recipe over a 40-sample dataset, and the good end's
    earlier results with one sample of the control's first stage flipped (the second stage runs)."""
    shas = make_linear_repo(tmp_path / "repo", 2, culprit=1)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"id": i, "question": "q", "answer": "a"}) + "\n"
                                              for i in IDS))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"name": "acc", "model": {"path": "/models/m"}, "oracle": {"kinds": ["accuracy"]},
                                  "accuracy": {"harness": "command", "dataset": "d.jsonl", "command": {"argv": ["x"]},
                                               "earlier_results": {"control_share": SHARE}}}))
    stages = control_stages(IDS, SHARE, shas[0])
    flip = stages[0][0]
    (tmp_path / "good.jsonl").write_text("".join(json.dumps({"id": i, "correct": 1 - c if i == flip else c}) + "\n"
                                                 for i, c in ANSWERS.items()))
    return shas[0], stages


def _step(tmp_path: Path, good: str, name: str, done: list[TrialRun], first_trial: int,
          ) -> tuple[StepResult, HarnessStandIn]:
    """The good end's step (`done`: its trials journaled before an interrupt), in session `s`."""
    harness = HarnessStandIn()
    evaluator = Evaluator(LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / f"{name}-work", ["true"]), harness,
                          tmp_path / "s", recipe=load_recipe(tmp_path / "recipe.yaml"),
                          earlier={"good_end": EarlierEndSpec(path=str(tmp_path / "good.jsonl"), commit=good)})
    try:
        return evaluator.evaluate(EvaluationRequest(good, 1, tuple(done), first_trial=first_trial,
                                                    as_reference=True)), harness
    finally:
        evaluator.close()


def test_a_step_resumed_mid_control_check_runs_only_the_stage_left(tmp_path: Path) -> None:
    """Uninterrupted: the first stage (a sample differs), the second, the earlier results kept, at
    trials 0, 1, 2. Resumed after the first stage was journaled: only the second runs, at trial 1,
    and the step ends as the uninterrupted one did."""
    good, stages = _setup(tmp_path)
    whole, harness = _step(tmp_path, good, "whole", [], 0)
    assert harness.asked == [(0, stages[0]), (1, stages[1])]
    assert [t.trial for t in whole.trials] == [0, 1, 2]
    assert whole.verdict.reason.startswith(f"from the earlier results {tmp_path / 'good.jsonl'} (1 of 10 ")

    resumed, again = _step(tmp_path, good, "resumed", whole.trials[:1], 1)
    assert again.asked == [(1, stages[1])]
    assert [t.trial for t in resumed.trials] == [0, 1, 2] and resumed.trials[0] == whole.trials[0]
    assert resumed.verdict.reason == whole.verdict.reason


def test_a_step_an_older_version_began_with_one_control_round_runs_nothing_again(tmp_path: Path) -> None:
    """An older version ran the whole control share in one round: journaled before the step was, it
    is that step's control check on resume (no first stage run again), judged by the whole
    share's rule, and the earlier results stand."""
    good, _stages = _setup(tmp_path)
    share = control_ids(IDS, SHARE, good)
    path = tmp_path / "s" / "older-control.json"
    path.parent.mkdir(parents=True)
    path.write_text(Observation(case_id="accuracy", trial=0, samples=[
        SampleOutcome(id=i, correct=ANSWERS[i]) for i in share]).model_dump_json())
    older = TrialRun(case_id="accuracy", trial=0, observation=str(path))
    resumed, harness = _step(tmp_path, good, "older", [older], 1)
    assert harness.asked == []
    assert [t.trial for t in resumed.trials] == [0, 1] and resumed.trials[0] == older
    assert resumed.verdict.reason.startswith(f"from the earlier results {tmp_path / 'good.jsonl'} (1 of 10 ")
