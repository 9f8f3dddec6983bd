"""Commit-level judging and `bisect-npu judge` through the real command line."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu import oracle
from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.recipe.loader import parse_recipe
from tests.helpers.cli_exit import run_cli

BIN = Path(sys.executable).parent / "bisect-npu"

RECIPE = """
name: judge-test
model: {path: /models/tiny}
cases: [{id: loop, prompt: "repeat this 50 times"}]
oracle:
  kinds: [repetition, tokens]
"""

STATS_RECIPE = """
name: judge-stats
model: {path: /models/tiny}
cases: [{id: loop, prompt: "repeat this 50 times"}]
trials: {count: 5}
oracle:
  kinds: [repetition, stats]
  stats: {confidence: 0.95, good_rate: 0.0, bad_rate: 0.2}
"""


def looping(trial: int = 0) -> Observation:
    rng = random.Random(trial)
    return Observation(case_id="loop", trial=trial, finish_reason="length",
                       output_token_ids=[rng.randrange(900) for _ in range(300)] + [1, 2, 3, 4, 5, 6, 7] * 60)


def clean(trial: int = 0) -> Observation:
    rng = random.Random(100 + trial)
    return Observation(case_id="loop", trial=trial, finish_reason="stop",
                       output_token_ids=[rng.randrange(900) for _ in range(700)])


def write(tmp_path: Path, name: str, obs: Observation) -> str:
    path = tmp_path / name
    path.write_text(obs.model_dump_json(), encoding="utf-8")
    return str(path)


def test_judge_observation_needs_every_kind_and_pairs_references_by_case() -> None:
    recipe = parse_recipe(RECIPE)
    verdict = oracle.judge_observation(recipe.oracle, looping(), None)
    assert verdict.kind == VerdictKind.BAD and verdict.figures["oracles"] == {"repetition": "bad", "tokens": "skip"}
    assert verdict.figures["loop_tokens"] == 420
    good = oracle.judge(recipe.oracle, [clean()], [clean(), Observation(case_id="other")],
                        trials_per_case=recipe.trials.count)
    assert good.kind == VerdictKind.GOOD and good.figures["match_rate"] == 1.0


def test_stats_over_trials_one_in_five() -> None:
    recipe = parse_recipe(STATS_RECIPE)
    trials = [clean(0), clean(1), looping(2), clean(3), clean(4)]
    verdict = oracle.judge(recipe.oracle, trials, [clean(i) for i in range(20)], trials_per_case=recipe.trials.count)
    assert verdict.kind == VerdictKind.BAD and verdict.trials == 5
    assert verdict.figures["bad_trials"] == 1 and verdict.figures["reference_rate"] == 0.001
    unsure = oracle.judge(recipe.oracle, [clean(i) for i in range(5)], None, trials_per_case=recipe.trials.count)
    assert unsure.kind == VerdictKind.GOOD and unsure.figures["forced_at_max_trials"] is True
    assert "not significant" in unsure.reason




def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    bad, good = write(tmp_path, "bad.json", looping()), write(tmp_path, "good.json", clean())
    code, out, _ = run_cli(["judge", "--recipe", str(recipe), bad], capsys)
    assert code == 1 and out.startswith("verdict: bad") and "loop_period: 7" in out
    code, out, _ = run_cli(["judge", "--recipe", str(recipe), "--reference", good, good, "--json"], capsys)
    assert code == 0 and json.loads(out)["kind"] == "good"
    empty = write(tmp_path, "empty.json", Observation(case_id="loop"))
    assert run_cli(["judge", "--recipe", str(recipe), empty], capsys)[0] == 125
    truncated = tmp_path / "cut.json"
    truncated.write_text(Path(bad).read_text()[:50], encoding="utf-8")
    code, out, err = run_cli(["judge", "--recipe", str(recipe), str(truncated)], capsys)
    assert code == 128 and "cut.json: not valid JSON" in err and len(err.strip().splitlines()) == 1


@pytest.mark.e2e  # the installed console script in a subprocess
def test_real_console_script(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(STATS_RECIPE, encoding="utf-8")
    files = [write(tmp_path, f"t{i}.json", obs) for i, obs in enumerate([clean(0), looping(1), looping(2)])]
    done = subprocess.run([str(BIN), "judge", "--recipe", str(recipe), *files], capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "2 of 3 trials bad" in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("trials:")] == ["trials: 3"]
