"""A regression that hangs: with --timeout-is bad a run past --timeout is a bad verdict, so the
hang is bisected; by default it is a skip (a timeout is more often a slow host)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.opening.environments import make_environment
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
from bisect_npu.recipe.loader import load_recipe
from tests.helpers.asked import spec_of
from tests.helpers.gitrepo import make_linear_repo

# Each test runs bisect-npu end to end (a hang bisected through the command line).
pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "bisect_npu"]
HANGS_FROM_THE_CULPRIT = "sh -c 'grep -qx good state || sleep 60'"  # exits 0 before the culprit, hangs from it on


@pytest.fixture(scope="module")
def hanging_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("hang") / "repo"
    return path, make_linear_repo(path, 33, culprit=21, tags={0: "good", 32: "bad"})


def bisect(repo: Path, session: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad",
                           "--cmd", HANGS_FROM_THE_CULPRIT, "--timeout", "1", "--no-fix", "--session", str(session),
                           "--json", *extra], capture_output=True, text=True, timeout=300, check=False)


def test_a_hang_is_bisected_with_timeout_is_bad(hanging_repo: tuple[Path, list[str]], tmp_path: Path) -> None:
    repo, shas = hanging_repo
    done = bisect(repo, tmp_path / "s", "--timeout-is", "bad")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (done.returncode, summary["culprit"]) == (0, shas[21]), done.stderr
    assert summary["steps"] <= 7  # log2(32) = 5, plus the two end checks
    steps = [json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    reasons = {e["commit"]: e["verdict"]["reason"] for e in steps if e["type"] == "step"}
    assert "ran past --timeout 1s (stopped after" in reasons[shas[32]]
    assert reasons[shas[32]].endswith("s), counted bad (--timeout-is bad)")
    assert "--timeout-is bad" in Path(summary["report"]).read_text()  # the reproduce line keeps it


def test_by_default_a_hang_is_a_skip(hanging_repo: tuple[Path, list[str]], tmp_path: Path) -> None:
    repo, _ = hanging_repo
    done = bisect(repo, tmp_path / "s")
    assert done.returncode == 4 and json.loads(done.stdout.strip().splitlines()[-1])["status"] == "ends_wrong"


def test_a_probe_past_the_timeout_follows_the_recipe(demo_upstream, tmp_path: Path) -> None:
    """The recipe path: a real probe killed at a timeout it cannot meet is bad under the recipe's
    `trials.timeout_is: bad`, and the option overrides it."""
    repo_path, manifest = demo_upstream
    truth = manifest.case("presence-penalty")
    recipe = load_recipe(truth.recipe)
    recipe = recipe.model_copy(update={"trials": recipe.trials.model_copy(update={"timeout_is": "bad"})})
    options = spec_of(good=truth.good_ref, bad=truth.bad_ref, repo=str(repo_path))
    verdicts = []
    for timeout_is in (None, "skip"):
        builder, executor = make_environment(options, git.Repo(repo_path), recipe, tmp_path, tmp_path / "worktrees")
        evaluator = Evaluator(builder, executor, tmp_path, recipe=recipe, timeout_s=0.05, timeout_is=timeout_is)
        try:
            verdicts.append(evaluator.evaluate(EvaluationRequest(truth.good_ref, 1)).verdict)
        finally:
            evaluator.close()
    assert verdicts[0].kind == VerdictKind.BAD and "timed out, counted bad (--timeout-is bad)" in verdicts[0].reason
    assert verdicts[1].kind == VerdictKind.SKIP and "timed out" in verdicts[1].reason
