"""The bundled accuracy recipes, checked up to the NPU: validation, the request, the container spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.execute.ascend import MANAGEMENT_DEVICES
from bisect_npu.execute.base import RunResult
from bisect_npu.execute.docker import ContainerSpec, DockerExecutor
from bisect_npu.orchestration.opening.environments import container_spec_factory
from bisect_npu.orchestration.running.probe_requests import probe_request
from bisect_npu.probe.backends.openai import server_argv
from bisect_npu.recipe.loader import load_recipe
from tests.helpers.asked import spec_of

ACCURACY_RECIPES = {"deepseek-r1-aime2024-accuracy": 16, "deepseek-r1-gpqa-accuracy": 16,
                    "math500-statistical-verification": 4, "qwen3-moe-loop-rate": 4}


class SpecOnly(DockerExecutor):
    """The real DockerExecutor up to the container start (no NPU host here): records the spec."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.specs: list[ContainerSpec] = []

    def _run(self, env: Environment, command: list[str], out_dir: Path, log_path: Path,
             timeout_s: float) -> RunResult:
        self.specs.append(self.spec_for(env, command, out_dir))
        return RunResult(returncode=0, seconds=0.0, log_path=str(log_path))


@pytest.mark.parametrize(("name", "cards"), sorted(ACCURACY_RECIPES.items()))
def test_an_accuracy_recipe_reaches_the_container_with_its_harness(name: str, cards: int, tmp_path: Path) -> None:
    recipe = load_recipe(name)
    assert recipe.accuracy is not None and recipe.oracle.kinds == ["accuracy"]
    assert recipe.cards_per_run() == cards
    request = probe_request(recipe, recipe.cases[0], commit="c0ffee", trial=0, sample_ids=["7"])
    factory = container_spec_factory(spec_of(good="g", bad="b", executor="docker", devices=list(range(cards))),
                                     recipe)
    executor = SpecOnly(client=None, spec_factory=factory, session_id="s1")
    executor.run_probe(Environment(kind="image", commit="c0ffee", image="img"), request, tmp_path, timeout_s=60.0)
    written = json.loads((tmp_path / "request-accuracy-t0.json").read_text())
    assert written["backend"] == "openai"
    assert written["accuracy"]["harness"] == recipe.accuracy.harness
    assert written["accuracy"]["sample_ids"] == ["7"]
    assert written["accuracy"]["dataset"] == recipe.accuracy.dataset  # absolute: nothing resolved elsewhere
    argv = server_argv(written, python="python3")
    assert argv[:3] == ["vllm", "serve", recipe.model.path]
    spec = executor.specs[0]
    assert spec.devices == [f"/dev/davinci{n}" for n in range(cards)] + list(MANAGEMENT_DEVICES)
    assert spec.environment["HCCL_DETERMINISTIC"] == "true"


def test_the_field_report_s_sampling_and_the_paper_s_baselines() -> None:
    aime, gpqa = load_recipe("deepseek-r1-aime2024-accuracy"), load_recipe("deepseek-r1-gpqa-accuracy")
    for recipe, baseline in ((aime, 79.8), (gpqa, 71.5)):
        assert recipe.accuracy is not None
        sampling = recipe.cases[0].sampling
        assert (sampling.temperature, sampling.top_p, sampling.max_tokens) == (0.6, 0.95, 32768)
        assert recipe.accuracy.repeats > 1  # sampled: a question's correctness is a rate
        assert not recipe.accuracy.greedy  # the oracle estimates how the samples' runs spread
        assert (recipe.accuracy.reference, recipe.accuracy.baseline, recipe.accuracy.threshold) == (
            "both", baseline, 10)


def test_statistical_verification_is_greedy_with_the_determinism_switches() -> None:
    recipe = load_recipe("math500-statistical-verification")
    assert recipe.cases[0].sampling.temperature == 0.0
    assert recipe.accuracy is not None and recipe.accuracy.greedy  # the oracle takes the spreads as known
    assert recipe.environment["LCCL_DETERMINISTIC"] == "1" and recipe.environment["HCCL_DETERMINISTIC"] == "true"


def test_the_loop_rate_recipe_repeats_the_prompt() -> None:
    recipe = load_recipe("qwen3-moe-loop-rate")
    assert recipe.accuracy is not None
    assert recipe.accuracy.metric == "loop_rate" and recipe.accuracy.repeats >= 20


@pytest.mark.parametrize("cards", [0, 2])
def test_the_dataset_and_a_task_file_reach_the_container_at_their_paths(cards: int, tmp_path: Path) -> None:
    """A local dataset and task YAML are mounted read-only where the request names them (with NPUs
    or without); a path this host lacks (the image may hold it) is not mounted."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "qa.jsonl").write_text('{"id": "1", "question": "q", "answer": "a"}\n')
    (tmp_path / "task.yaml").write_text("task: qa\n")
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(RECIPE_WITH_FILES)
    recipe = load_recipe(str(recipe_file))
    request = probe_request(recipe, recipe.cases[0], commit="c0ffee", trial=0)
    spec = container_spec_factory(spec_of(good="g", bad="b", executor="docker", devices=list(range(cards))),
                                  recipe)("img", tmp_path / "out")
    mounted = {m.target: (m.source, m.read_only) for m in spec.mounts}
    dataset, task = request["accuracy"]["dataset"], request["accuracy"]["lm_eval"]["task"]
    assert dataset == str(tmp_path / "data" / "qa.jsonl") and task == str(tmp_path / "task.yaml")
    assert mounted[dataset] == (dataset, True) and mounted[task] == (task, True)
    (tmp_path / "task.yaml").unlink()
    spec = container_spec_factory(spec_of(good="g", bad="b", executor="docker", devices=list(range(cards))),
                                  load_recipe(str(recipe_file)))("img", tmp_path / "out")
    assert task not in {m.target for m in spec.mounts} and dataset in {m.target for m in spec.mounts}


RECIPE_WITH_FILES = """
name: local-files
model: {path: /models/m}
engine: {backend: openai, launcher: [vllm, serve, "{model}"]}
accuracy:
  harness: lm_eval
  dataset: data/qa.jsonl
  lm_eval: {task: task.yaml, model: local-completions}
oracle: {kinds: [accuracy]}
"""
