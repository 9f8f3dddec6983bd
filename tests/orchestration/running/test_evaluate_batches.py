"""A case's trials at one commit share one engine start: one probe run, each trial journaled as
its observation appears, so an interrupted batch keeps the trials it finished.

Real demo upstream, real worktree build, real tinyvllm forward passes in the probe subprocess.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import git
import pytest

from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.opening.environments import make_environment
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.records import TrialRun
from tests.helpers.asked import spec_of

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e


def _evaluator(demo_upstream, tmp_path: Path, **trials: object) -> tuple[Evaluator, str]:
    repo_path, manifest = demo_upstream
    truth = manifest.case("presence-penalty")
    recipe = load_recipe(truth.recipe)
    recipe = recipe.model_copy(update={"trials": recipe.trials.model_copy(update=trials)})
    options = spec_of(good=truth.good_ref, bad=truth.bad_ref, repo=str(repo_path))
    builder, executor = make_environment(options, git.Repo(repo_path), recipe, tmp_path, tmp_path / "worktrees")
    return Evaluator(builder, executor, tmp_path, recipe=recipe), truth.culprit.sha


def test_trials_share_one_engine_start_and_are_judged_one_by_one(demo_upstream, tmp_path: Path) -> None:
    evaluator, culprit = _evaluator(demo_upstream, tmp_path)
    seen: list[TrialRun] = []
    try:
        result = evaluator.evaluate(EvaluationRequest(culprit, 4, on_trial=seen.append, judge_each=True, first_trial=3))
    finally:
        evaluator.close()
    assert [r.trial for r in seen] == [3, 4, 5, 6] and result.trials == seen
    assert len({r.log for r in seen}) == 1  # one probe run
    assert all(r.outcome in (VerdictKind.GOOD, VerdictKind.BAD) for r in seen)
    assert seen[0].startup_s > 0 and all(r.startup_s == 0.0 for r in seen[1:])
    logs = list((tmp_path / "steps" / culprit[:12]).glob("probe-*.log"))
    assert [p.name for p in logs] == ["probe-server-default-t3.log"]


def test_without_batches_every_trial_starts_its_engine(demo_upstream, tmp_path: Path) -> None:
    evaluator, culprit = _evaluator(demo_upstream, tmp_path, batch=False)
    seen: list[TrialRun] = []
    try:
        evaluator.evaluate(EvaluationRequest(culprit, 2, on_trial=seen.append, judge_each=True))
    finally:
        evaluator.close()
    assert len({r.log for r in seen}) == 2 and all(r.startup_s > 0 for r in seen)


def test_an_interrupted_batch_keeps_the_trials_it_finished(demo_upstream, tmp_path: Path) -> None:
    evaluator, culprit = _evaluator(demo_upstream, tmp_path)
    seen: list[TrialRun] = []

    def on_trial(record: TrialRun) -> None:
        seen.append(record)
        if len(seen) == 1:  # Ctrl-C while the probe is still on the next trials
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started under nohup
    try:
        with pytest.raises(KeyboardInterrupt):
            evaluator.evaluate(EvaluationRequest(culprit, 30, on_trial=on_trial, judge_each=True))
    finally:
        signal.signal(signal.SIGINT, previous)
        evaluator.close()
    written = {p.name for p in (tmp_path / "steps" / culprit[:12]).glob("obs-*.json")}
    assert 1 <= len(seen) < 30, "the batch was not interrupted"
    assert {Path(r.observation or "").name for r in seen} == written  # nothing finished is lost
    assert [r.trial for r in seen] == list(range(len(seen)))


def test_a_stale_observation_is_never_taken_for_a_new_trial(demo_upstream, tmp_path: Path) -> None:
    """A run killed after the probe wrote a file but before the journal took it leaves the file;
    the resumed run asks that trial number again and must judge its own output."""
    evaluator, culprit = _evaluator(demo_upstream, tmp_path)
    step = tmp_path / "steps" / culprit[:12]
    step.mkdir(parents=True)
    (step / "obs-server-default-t0.json").write_text("half a file from a killed run")
    seen: list[TrialRun] = []
    try:
        evaluator.evaluate(EvaluationRequest(culprit, 2, on_trial=seen.append, judge_each=True))
    finally:
        evaluator.close()
    assert [r.trial for r in seen] == [0, 1]
    assert all(r.outcome in (VerdictKind.GOOD, VerdictKind.BAD) for r in seen)
