"""An accuracy step interrupted after some journaled rounds and resumed: nothing journaled runs
again, and the rest runs at the trial numbers the uninterrupted step gave it (a round's trial is
its seed). A real git history and worktree, the real Evaluator and journaled trials; the NPU
host's harness run is stood in for at the executor (tests/orchestration/running/
test_earlier_control_resume.py's HarnessStandIn)."""

from __future__ import annotations

import json
from pathlib import Path

import git
import pytest

from bisect_npu.builders.local import LocalBuilder
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator, StepResult
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.records import TrialRun
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.npu_accuracy import IDS, HarnessStandIn

FIRST = 4  # the step's first trial: trials journaled at this commit by an earlier step come before


def _setup(tmp_path: Path) -> str:
    """A one-commit history and an accuracy recipe whose good end (2 of 3 samples right, against a
    baseline line of 69 points) stays unclear for every one of its three rounds."""
    good = make_linear_repo(tmp_path / "repo", 2, culprit=1)[0]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"id": i, "question": "q", "answer": "a"}) + "\n"
                                              for i in IDS))
    (tmp_path / "recipe.yaml").write_text(json.dumps({
        "name": "acc", "model": {"path": "/models/m"}, "oracle": {"kinds": ["accuracy"]},
        "accuracy": {"harness": "command", "dataset": "d.jsonl", "command": {"argv": ["x"]},
                     "reference": "baseline", "baseline": 70.0, "max_rounds": 3}}))
    return good


def _step(tmp_path: Path, good: str, name: str, done: list[TrialRun], first_trial: int,
          ) -> tuple[StepResult, list[TrialRun], HarnessStandIn]:
    """The good end's step (`done`: its rounds journaled before an interrupt) in session `s`: its
    result, the trials it journaled and what the harness ran."""
    harness, journaled = HarnessStandIn(), list(done)
    evaluator = Evaluator(LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / f"{name}-work", ["true"]), harness,
                          tmp_path / "s", recipe=load_recipe(tmp_path / "recipe.yaml"))
    try:
        return evaluator.evaluate(EvaluationRequest(good, 1, tuple(done), on_trial=journaled.append,
                                                    first_trial=first_trial, as_reference=True)), journaled, harness
    finally:
        evaluator.close()


@pytest.mark.parametrize("interrupted_after", [1, 2])
def test_a_step_resumed_after_journaled_rounds_runs_the_rest_at_the_uninterrupted_trials(
        tmp_path: Path, interrupted_after: int) -> None:
    """Uninterrupted: three whole-dataset rounds at trials 4, 5, 6. Resumed after the first
    `interrupted_after` were journaled (the session's next trial follows them): only the rest
    runs, at the trials they had, and the journal is the uninterrupted step's."""
    good = _setup(tmp_path)
    whole, whole_journal, harness = _step(tmp_path, good, "whole", [], FIRST)
    trials = [FIRST, FIRST + 1, FIRST + 2]
    assert harness.asked == [(t, IDS) for t in trials]
    assert [t.trial for t in whole.trials] == [t.trial for t in whole_journal] == trials
    assert whole.verdict.figures["forced_at_max_rounds"]

    done = whole.trials[:interrupted_after]
    resumed, journal, again = _step(tmp_path, good, "resumed", done, done[-1].trial + 1)
    assert again.asked == [(t, IDS) for t in trials[interrupted_after:]]
    assert [t.trial for t in journal] == [t.trial for t in resumed.trials] == trials
    assert resumed.trials[:interrupted_after] == done
    assert resumed.verdict.kind == whole.verdict.kind and resumed.verdict.reason == whole.verdict.reason
