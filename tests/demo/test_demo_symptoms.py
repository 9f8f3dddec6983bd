"""Each seeded regression: absent at the culprit's parent, present at the culprit.

Real runs: a git worktree of the commit, its build step, then `python -m bisect_npu.probe` with the
case's recipe, judged by the recipe's oracle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle import judge, judge_observation
from bisect_npu.orchestration.running.probe_requests import probe_request
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from tests.helpers.paths import REPO_ROOT

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e



def checkout(repo: Path, sha: str, dest: Path) -> Path:
    """A built worktree of `sha` (its own build step, as LocalBuilder runs it)."""
    if not dest.exists():
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(dest), sha], check=True)
        subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=dest, check=True, capture_output=True)
    return dest


def run_probe(tree: Path, recipe: Recipe, trial: int, out: Path) -> Observation:
    request = probe_request(recipe, recipe.cases[0], commit=tree.name, trial=trial)
    request["output"] = str(out / f"obs-{tree.name}-{trial}.json")
    request_path = out / f"req-{tree.name}-{trial}.json"
    request_path.write_text(json.dumps(request))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO_ROOT)])}
    done = subprocess.run([sys.executable, "-m", "bisect_npu.probe", str(request_path)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return Observation.load(request["output"])


@pytest.fixture(scope="module")
def trees(demo_upstream, tmp_path_factory):
    repo, _ = demo_upstream
    base = tmp_path_factory.mktemp("trees")

    def tree(sha: str) -> Path:
        return checkout(repo, sha, base / sha[:12])

    return tree


@pytest.fixture(scope="module")
def probed(trees, tmp_path_factory):
    """`probed(sha, recipe name, trial)`: the observation of that probe run, each run once per module
    (a probe request's output is deterministic; two tests judge the rope case's same two runs)."""
    seen: dict[tuple[str, str, int], Observation] = {}

    def probe(sha: str, recipe_name: str, trial: int) -> Observation:
        if (sha, recipe_name, trial) not in seen:
            out = tmp_path_factory.mktemp("observations")
            seen[sha, recipe_name, trial] = run_probe(trees(sha), load_recipe(recipe_name), trial, out)
        return seen[sha, recipe_name, trial]

    return probe


@pytest.mark.parametrize("case_name", ["async-penalty", "rope-longseq", "spec-decode"])
def test_deterministic_case_flips_at_the_culprit(case_name, demo_upstream, probed):
    _, manifest = demo_upstream
    case = manifest.case(case_name)
    recipe = load_recipe(case.recipe)
    parent = probed(case.culprit_parent, case.recipe, 0)
    culprit = probed(case.culprit.sha, case.recipe, 0)
    reference = parent if recipe.reference.kind == "good_end" else None
    assert judge_observation(recipe.oracle, parent, reference).kind == VerdictKind.GOOD
    verdict = judge_observation(recipe.oracle, culprit, reference)
    assert verdict.kind == VerdictKind.BAD, verdict.reason
    if case_name == "async-penalty":
        assert culprit.stop_reason == "repetition_detected" and parent.stop_reason is None
        assert parent.sampling["repetition_penalty"] == 1.3
    if case_name == "spec-decode":
        assert culprit.extra["spec_decode"]["accepted"] == 0 < parent.extra["spec_decode"]["accepted"]


def test_rope_drift_starts_past_max_position_embeddings(demo_upstream, probed):
    _, manifest = demo_upstream
    case = manifest.case("rope-longseq")
    parent = probed(case.culprit_parent, case.recipe, 0)
    culprit = probed(case.culprit.sha, case.recipe, 0)
    first = next(i for i, (a, b) in enumerate(zip(parent.output_token_ids, culprit.output_token_ids, strict=True))
                 if a != b)
    assert len(parent.prompt_token_ids) + first >= 128  # max_position_embeddings of the demo model


@pytest.mark.slow
def test_presence_penalty_loops_only_over_trials(demo_upstream, trees, tmp_path):
    _, manifest = demo_upstream
    case = manifest.case("presence-penalty")
    recipe = load_recipe(case.recipe)
    trials = 10
    parent = [run_probe(trees(case.culprit_parent), recipe, t, tmp_path) for t in range(trials)]
    culprit = [run_probe(trees(case.culprit.sha), recipe, t, tmp_path) for t in range(trials)]
    assert {o.sampling["presence_penalty"] for o in parent} == {1.5}
    assert {o.sampling["presence_penalty"] for o in culprit} == {0.0}
    parent_loops = sum(judge_observation(recipe.oracle, o, None).kind == VerdictKind.BAD for o in parent)
    culprit_loops = sum(judge_observation(recipe.oracle, o, None).kind == VerdictKind.BAD for o in culprit)
    assert parent_loops == 0
    assert 2 <= culprit_loops < trials  # a rate, not every run
    assert judge(recipe.oracle, parent, None, trials_per_case=recipe.trials.count).kind == VerdictKind.GOOD
    assert judge(recipe.oracle, culprit, None, trials_per_case=recipe.trials.count).kind == VerdictKind.BAD
