"""Imports of nightly case files that run or say why not: the SoC's Dockerfile, the model's and
the datasets' place on this host, every benchmark listed, and a field of the wrong type refused
in one line (at import, and at one commit of a run, where it is that commit's skip)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from bisect_npu.nightly.at_commit import recipe_at
from bisect_npu.nightly.cases import CaseRef, NightlyRefused
from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.running.evaluate import EvaluationRequest
from bisect_npu.orchestration.running.nightly import NightlyEvaluator
from bisect_npu.upstream import history
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import make_linear_repo

CONFIGS = "tests/e2e/nightly/single_node/models/configs"
CASE = """\
test_cases:
  - name: "tiny"
    model: "vllm-ascend/Tiny-W8A8"
    server_cmd: ["--max-num-seqs", "4"]
    benchmarks:
      acc:
        case_type: accuracy
        dataset_path: vllm-ascend/gsm8k-lite
        request_conf: vllm_api_general_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_noncot_chat_prompt
        max_out_len: {max_out_len}
        batch_size: {batch_size}
        baseline: 90
        threshold: 5
      perf:
        case_type: performance
        dataset_path: vllm-ascend/GSM8K-in3500-bs400
        max_out_len: 48
        batch_size: 4
        baseline: 800
        threshold: 0.97
"""
SCHEDULE = {"a2": {"single_node": {"test_config": [{"name": "x", "config_file_path": "Tiny-W8A8.yaml"}]}},
            "310p": {"single_node": {"test_config": [{"name": "y", "config_file_path": "Tiny-310.yaml"}]}}}


def checkout(root: Path, name: str, max_out_len: object = 64, batch_size: object = 4) -> Path:
    """A vllm-ascend-shaped checkout: the case file and the nightly's schedule beside it."""
    case = root / CONFIGS / name
    case.parent.mkdir(parents=True, exist_ok=True)
    case.write_text(CASE.format(max_out_len=max_out_len, batch_size=batch_size))
    schedule = root / ".github" / "workflows" / "configs" / "nightly_config.yaml"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    schedule.write_text(yaml.safe_dump(SCHEDULE))
    (root / ".git").mkdir(exist_ok=True)
    return case


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`recipes import-nightly` in this process: what it prints and writes, and its exit code."""
    return cli_in_process(["recipes", "import-nightly", *args], cwd=cwd)


@pytest.mark.parametrize(("name", "dockerfile"), [("Tiny-310.yaml", "Dockerfile.310p"),
                                                  ("Tiny-W8A8.yaml", "Dockerfile"),
                                                  ("Other-A3.yaml", "Dockerfile.a3")])
def test_the_recipe_builds_from_the_dockerfile_of_the_socs_image(tmp_path: Path, name: str, dockerfile: str) -> None:
    """The schedule's SoC first (310p, a2), else the SoC the file's name ends with (-A3)."""
    case = checkout(tmp_path / "va", name)
    done = cli(str(case), "--case", "tiny", "--benchmark", "acc", "--out", str(tmp_path / "r.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    recipe = yaml.safe_load((tmp_path / "r.yaml").read_text())
    assert recipe.get("build", {}).get("dockerfile", "Dockerfile") == dockerfile
    assert "SoC" in recipe["description"]


def test_a_file_no_schedule_places_says_the_dockerfile_is_the_default(tmp_path: Path) -> None:
    case = checkout(tmp_path / "va", "Unplaced.yaml")
    done = cli(str(case), "--benchmark", "acc", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "note: SoC: neither the nightly's schedule nor the file's name says" in done.stderr


def test_the_model_and_the_dataset_are_placed_or_the_import_says_where(tmp_path: Path) -> None:
    case = checkout(tmp_path / "va", "Tiny-W8A8.yaml")
    done = cli(str(case), "--benchmark", "acc", cwd=tmp_path)
    assert "note: model vllm-ascend/Tiny-W8A8: a hub id, not a directory here; set model.host_path" in done.stderr
    assert "must lie under the directory given as --datasets (import-nightly) or --nightly-datasets" in done.stderr
    models, data = tmp_path / "models", tmp_path / "data"
    placed = cli(str(case), "--benchmark", "acc", "--model-root", str(models), "--datasets", str(data),
                 cwd=tmp_path)
    assert placed.returncode == 0 and "note: model" not in placed.stderr and "note: dataset" not in placed.stderr
    recipe = yaml.safe_load(placed.stdout)
    assert recipe["model"] == {"path": str(models / "vllm-ascend/Tiny-W8A8"),
                               "host_path": str(models / "vllm-ascend/Tiny-W8A8")}
    assert recipe["accuracy"]["dataset"] == str(data / "vllm-ascend/gsm8k-lite")


def test_list_shows_every_benchmark(tmp_path: Path) -> None:
    done = cli(str(checkout(tmp_path / "va", "Tiny-W8A8.yaml")), "--list", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["imported", "tiny-acc", "imported", "tiny-perf"]


@pytest.mark.parametrize(("field", "values"), [("max_out_len", {"max_out_len": '"abc"'}),
                                               ("batch_size", {"batch_size": '"abc"'})])
def test_a_field_of_the_wrong_type_is_one_line(tmp_path: Path, field: str, values: dict[str, str]) -> None:
    case = checkout(tmp_path / "va", "Tiny-W8A8.yaml", **values)
    listed = cli(str(case), "--list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert f"refused   {case.as_posix()}::tiny::acc: {field} 'abc' is not a whole number" in listed.stdout
    done = cli(str(case), "--benchmark", "acc", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(f"{field} 'abc' is not a whole number")


def test_out_makes_its_directory(tmp_path: Path) -> None:
    out = tmp_path / "nonexistent" / "x" / "y.yaml"
    done = cli(str(checkout(tmp_path / "va", "Tiny-W8A8.yaml")), "--benchmark", "perf", "--out", str(out),
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(out.read_text())["name"] == "tiny-perf"


def test_a_bad_field_at_one_commit_is_that_commits_skip_with_the_reason(tmp_path: Path) -> None:
    """In the middle of `run --nightly-case`: the commit whose file has `max_out_len: "abc"` is
    skipped naming the field; the commits around it import."""
    path = f"{CONFIGS}/Tiny-W8A8.yaml"

    def files(i: int) -> dict[str, str | None]:
        good = CASE.format(max_out_len=64, batch_size=4)
        return {path: good} if i in (1, 3) else {path: CASE.format(max_out_len='"abc"', batch_size=4)} \
            if i == 2 else {}

    shas = make_linear_repo(tmp_path / "up", 4, files=files)
    repo = history.open_repo(str(tmp_path / "up"))
    ref = CaseRef.parse(f"{path}::tiny::acc")
    assert recipe_at(repo, shas[1], ref).accuracy is not None
    with pytest.raises(NightlyRefused, match="max_out_len 'abc' is not a whole number"):
        recipe_at(repo, shas[2], ref)
    evaluator = NightlyEvaluator.__new__(NightlyEvaluator)  # only the case-file path runs: no build, no engine
    evaluator.repo, evaluator.case, evaluator.datasets = repo, ref, None
    result = evaluator.evaluate(EvaluationRequest(commit=shas[2], trials=1))
    assert result.verdict.kind == VerdictKind.SKIP
    assert result.verdict.reason.startswith("nightly case at this commit: ")
    assert "max_out_len 'abc' is not a whole number" in result.verdict.reason


def test_recipes_show_says_where_each_server_flag_comes_from_and_what_the_verdict_compares_with(
        tmp_path: Path) -> None:
    from bisect_npu import api
    from bisect_npu.recipe.loader import bundled_recipes

    served = [name for name in bundled_recipes() if api.recipe_plan(name)["engine"]["backend"] == "openai"]
    assert served
    for name in served:  # the parts, joined, are the line the backend starts
        engine = api.recipe_plan(name)["engine"]
        assert [w for part in engine["server_sources"] for w in part["flags"]] == engine["server_command"], name
    case = checkout(tmp_path / "va", "Tiny-W8A8.yaml")
    recipe = tmp_path / "r.yaml"
    assert cli(str(case), "--benchmark", "acc", "--out", str(recipe), cwd=tmp_path).returncode == 0
    done = cli_in_process(["recipes", "show", str(recipe)])
    assert done.returncode == 0, done.stderr
    shown = done.stdout
    assert "  vllm serve vllm-ascend/Tiny-W8A8  <- the default launcher: `vllm serve` of model.path" in shown
    assert "  --max-num-seqs 4  <- engine.server_flags" in shown
    assert "reference accuracy.reference baseline: the published 90.0 points less 5.0" in shown
    assert "harness  ais_bench '<config: models vllm_api_general_chat at the server, datasets " \
           "gsm8k/gsm8k_gen_0_shot_noncot_chat_prompt, batch_size 4, max_out_len 64>'" in shown
    seeded = api.recipe_plan("demo-accuracy")["engine"]["server_sources"]  # `--seed 0`: not the user's words
    assert {"flags": ["--seed", "0"], "from": "bisect-npu: the first trial's seed, from sampling.seed (each trial "
                                              "its own)"} in seeded
