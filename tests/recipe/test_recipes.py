"""Bundled recipes, the `recipes` command, and the exact Ascend run each real recipe turns into."""

from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.errors import UsageError
from bisect_npu.execute.ascend import DETERMINISM_ENV, DRIVER_MOUNTS, MANAGEMENT_DEVICES
from bisect_npu.execute.base import RunResult
from bisect_npu.execute.docker import (
    ENV_BOOTSTRAP,
    ENV_CARRIER,
    PROBE_BOOTSTRAP,
    PROBE_PARENT,
    ContainerSpec,
    DockerExecutor,
    Mount,
    container_create_kwargs,
)
from bisect_npu.orchestration.opening.environments import container_spec_factory
from bisect_npu.orchestration.opening.session_spec import earlier_runs_for_search, earlier_runs_spec
from bisect_npu.orchestration.running.probe_requests import probe_request
from bisect_npu.probe.backends.openai import override_generation_config, server_argv
from bisect_npu.probe.backends.vllm import engine_kwargs
from bisect_npu.recipe.loader import bundled_recipes, load_recipe, parse_recipe
from bisect_npu.search import EarlierRuns
from tests.helpers.asked import spec_of
from tests.helpers.cli_exit import run_cli
from tests.helpers.paths import REPO_ROOT

REAL_RECIPES = ["qwen3-repetition-penalty-async", "deepseek-r1-longseq-rope", "deepseek-r1-mtp-temperature",
                "qwen3-moe-presence-penalty-loop", "precision-alignment"]
MINIMAL = "name: t\nmodel:\n  path: /models/m\ncases:\n  - id: a\n    prompt: hi\n"




@pytest.mark.parametrize(("name", "resource"), sorted(bundled_recipes().items()), ids=sorted(bundled_recipes()))
def test_every_bundled_recipe_validates(name: str, resource: Traversable) -> None:
    recipe = load_recipe(resource)
    assert recipe.name == name  # `load_recipe(name)` finds it by the same name


def test_the_five_real_recipes_are_bundled() -> None:
    assert set(bundled_recipes()) >= set(REAL_RECIPES)


def test_the_top_level_recipes_folder_is_the_bundled_one() -> None:
    """Users look in `recipes/` of the checkout; the package ships the same files."""
    top = REPO_ROOT / "recipes"
    assert {path.stem for path in top.glob("*.yaml")} == set(bundled_recipes())
    assert top.resolve() == Path(str(resources.files("bisect_npu") / "recipes")).resolve()


@pytest.mark.parametrize(("text", "field", "line"), [
    (MINIMAL + "    sampling:\n      temprature: 0\n", "cases.0.sampling.temprature", 8),
    (MINIMAL + "    sampling:\n      max_tokens: many\n", "cases.0.sampling.max_tokens", 8),
    ("name: t\nmodel:\n  path: /models/m\ncases:\n  - id: a\n    sampling: {}\n", "cases.0", 5),
    (MINIMAL + "trials:\n  count: 0\n", "trials.count", 8),
    (MINIMAL + "engine:\n  backend: tgi\n", "engine.backend", 8),
    (MINIMAL + "trials:\n  earlier_runs:\n    bad_end: eight\n    good_end: 0/10\n", "trials.earlier_runs.bad_end", 9),
    (MINIMAL + "trials:\n  earlier_runs:\n    bad_end: 8/10\n    good_end: 11/10\n",
     "trials.earlier_runs.good_end", 10),
    (MINIMAL + "oracle:\n  kinds: [repetition]\n  penalty:\n    expectd: {}\n", "oracle.penalty.expectd", 10),
    (MINIMAL + "build:\n  dockerfile: ../Dockerfile.a3\n", "build.dockerfile", 8),
    (MINIMAL + "  - id: a\n    prompt: again\n", "cases", 4),  # `record` kept one of the two
    (MINIMAL + "oracle:\n  kinds: []\n", "oracle.kinds", 8),  # no judge: every commit good
])
def test_broken_recipe_names_field_and_line(text: str, field: str, line: int) -> None:
    with pytest.raises(UsageError) as error:
        parse_recipe(text, source="bad.yaml")
    assert f"bad.yaml:{line}:" in str(error.value)
    assert repr(field) in str(error.value)


@pytest.mark.parametrize(("text", "known"), [
    (MINIMAL + "    sampling:\n      temprature: 0\n", "known here: temperature, top_p,"),
    (MINIMAL + "oracle:\n  kinds: [repetition]\n  penalty:\n    expectd: {}\n", "known here: expected"),
    (MINIMAL + "modle: x\n", "known here: name, description,"),
    (MINIMAL + "trials:\n  mode: noisy\n  earlier_runs:\n    bad_endd: 8/10\n    good_end: 0/10\n",
     "'trials.earlier_runs.bad_endd': unknown field (check the spelling; known here: bad_end, good_end)"),
])
def test_an_unknown_field_lists_the_fields_known_where_it_stands(text: str, known: str) -> None:
    with pytest.raises(UsageError, match="unknown field") as error:
        parse_recipe(text, source="bad.yaml")
    assert known in str(error.value) and "source" not in str(error.value)  # an internal field


def test_validate_exits_2_naming_field_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "    sampling:\n      temperature: hot\n")
    good = bundled_recipes()["qwen3-repetition-penalty-async"]
    code, out, err = run_cli(["recipes", "validate", str(good), str(bad)], capsys)
    assert code == 2
    assert f"ok  {good}" in out
    assert f"{bad}:8: field 'cases.0.sampling.temperature'" in err


def test_invalid_yaml_is_one_line_with_its_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncases: [\n")
    code, _, err = run_cli(["recipes", "validate", str(bad)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{bad}:3:1: not valid YAML:" in err


def test_a_recipe_that_is_not_text_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe bad")
    code, _, err = run_cli(["recipes", "validate", str(binary)], capsys)
    assert code == 2 and f"{binary}: not UTF-8 text" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["recipes", "validate", str(tmp_path)], capsys)  # a directory
    assert code == 2 and "cannot read the recipe" in err


def test_validate_all_bundled_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(resource) for resource in bundled_recipes().values()]
    code, out, _ = run_cli(["recipes", "validate", *files], capsys)
    assert code == 0
    assert out.count("ok  ") == len(files)


def test_list_shows_bundled_and_user_recipes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.yaml").write_text(MINIMAL.replace("name: t", "name: mine\ndescription: my bad case"))
    (tmp_path / "broken.yaml").write_text("name: broken\n")
    code, out, _ = run_cli(["recipes", "list", "--dir", str(tmp_path)], capsys)
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "openai" in rows["qwen3-moe-presence-penalty-loop"]
    assert "repetition,stats,penalty" in rows["qwen3-moe-presence-penalty-loop"]
    assert "acceptance,tokens" in rows["deepseek-r1-mtp-temperature"]
    assert "my bad case" in rows["mine"] and str(tmp_path) in rows["mine"]
    assert "INVALID" in rows["broken"] and "'model'" in rows["broken"]


def test_show_prints_what_will_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["recipes", "show", "qwen3-moe-presence-penalty-loop"], capsys)
    assert code == 0
    assert ("server   vllm serve /models/Qwen3-30B-A3B --host 127.0.0.1 --port 8000 --dtype bfloat16 "
            "--tensor-parallel-size 4 --enable-expert-parallel") in out
    assert "--override-generation-config '{\"presence_penalty\": 1.5}'" in out
    assert "env      HCCL_DETERMINISTIC=true" in out
    assert 'Repeat the following sentence exactly 50 times' in out
    sampling_line = next(line for line in out.splitlines() if line.strip().startswith("sampling"))
    assert '"temperature": 0.7' in sampling_line and "presence_penalty" not in sampling_line
    assert '"expected": {"presence_penalty": 1.5}' in out
    assert '"min_count": 60' in out
    assert "trials   20 (noisy" in out


def test_show_json_for_a_file_lists_engine_kwargs(capsys: pytest.CaptureFixture[str]) -> None:
    path = bundled_recipes()["deepseek-r1-longseq-rope"]
    code, out, _ = run_cli(["recipes", "show", str(path), "--format", "json"], capsys)
    plan = json.loads(out)
    assert code == 0
    kwargs = plan["engine"]["llm_kwargs"]
    assert kwargs["tensor_parallel_size"] == 16
    assert kwargs["additional_config"]["torchair_graph_config"]["enabled"] is True
    assert plan["cases"][0]["sampling"] == {"temperature": 0.6, "top_p": 0.95, "max_tokens": 32768,
                                            "seed": 2024, "logprobs": 5}


def test_show_unknown_recipe_lists_bundled(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["recipes", "show", "no-such-recipe"], capsys)
    assert code == 2
    assert "qwen3-repetition-penalty-async" in err


# --- the Ascend path: request -> engine call / server command -> container spec, field by field ---

class NoNpuDockerExecutor(DockerExecutor):
    """The real DockerExecutor up to the container start: no NPU host here, so it records the spec."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.specs: list[ContainerSpec] = []

    def _run(self, env: Environment, command: list[str], out_dir: Path, log_path: Path,
             timeout_s: float) -> RunResult:
        self.specs.append(self.spec_for(env, command, out_dir))
        return RunResult(returncode=0, seconds=0.0, log_path=str(log_path))


def _spec(recipe_name: str, tmp_path: Path, cards: list[int]) -> tuple[dict, ContainerSpec]:
    """Run a bundled recipe's first case through the real executor path; return the request file and spec."""
    recipe = load_recipe(recipe_name)
    request = probe_request(recipe, recipe.cases[0], commit="c0ffee", trial=0)
    factory = container_spec_factory(spec_of(good="g", bad="b", executor="docker", devices=cards), recipe)
    executor = NoNpuDockerExecutor(client=None, spec_factory=factory, session_id="s1")
    env = Environment(kind="image", commit="c0ffee", image="bisect-npu/vllm-ascend:c0ffee")
    executor.run_probe(env, request, tmp_path, timeout_s=60.0)
    written = json.loads((tmp_path / f"request-{recipe.cases[0].id}-t0.json").read_text())
    return written, executor.specs[0]


def _parallel_size(kwargs: dict) -> int:
    return (kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1)
            * kwargs.get("data_parallel_size", 1))


@pytest.mark.parametrize("name", ["qwen3-repetition-penalty-async", "deepseek-r1-longseq-rope",
                                  "deepseek-r1-mtp-temperature", "precision-alignment"])
def test_offline_recipes_on_ascend_field_by_field(name: str, tmp_path: Path) -> None:
    recipe = load_recipe(name)
    kwargs = engine_kwargs(probe_request(recipe, recipe.cases[0], commit="c0ffee", trial=0))
    cards = list(range(_parallel_size(kwargs)))
    request, spec = _spec(name, tmp_path, cards)
    assert request["backend"] == "vllm"
    assert request["model"] == {"path": recipe.model.path, "dtype": "bfloat16", "tokenizer": None}
    assert spec.image == "bisect-npu/vllm-ascend:c0ffee"
    assert spec.command == ["python3", "-c", ENV_BOOTSTRAP,  # puts back what the CANN entrypoint overwrites
                            "python3", "-c", PROBE_BOOTSTRAP, f"/out/request-{recipe.cases[0].id}-t0.json"]
    assert request["output"] == f"/out/obs-{recipe.cases[0].id}-t0.json"  # the path inside the container
    assert spec.devices == [f"/dev/davinci{n}" for n in cards] + list(MANAGEMENT_DEVICES)
    assert spec.privileged is False and spec.network_mode == "bridge"
    assert spec.mounts == [
        *[Mount(source=p, target=p, read_only=True) for p in DRIVER_MOUNTS],
        Mount(source=recipe.model.host_path, target=recipe.model.path, read_only=True),
        Mount(source=str(tmp_path), target="/out", read_only=False),
        Mount(source=str(REPO_ROOT / "bisect_npu" / "probe"),
              target=f"{PROBE_PARENT}/bisect_npu_probe", read_only=True),
    ]
    wanted = {**DETERMINISM_ENV, **recipe.environment, "PYTHONDONTWRITEBYTECODE": "1"}
    assert spec.environment == {**wanted, ENV_CARRIER: json.dumps(wanted)}
    assert kwargs == {"model": recipe.model.path, "dtype": "bfloat16", "seed": recipe.cases[0].sampling.seed,
                      **recipe.engine.args, **({"disable_log_stats": False}
                                               if "speculative_config" in recipe.engine.args else {}),
                      **({"max_logprobs": -1, "enforce_eager": True} if name == "precision-alignment" else {})}


def test_async_recipe_asks_for_async_scheduling_and_the_penalty() -> None:
    recipe = load_recipe("qwen3-repetition-penalty-async")
    request = probe_request(recipe, recipe.cases[0], commit="c", trial=0)
    assert engine_kwargs(request)["async_scheduling"] is True
    assert request["case"]["sampling"]["repetition_penalty"] == 1.3
    assert request["case"]["sampling"]["temperature"] == 0.0
    assert request["loop_guard"] == {"min_pattern_size": 1, "max_pattern_size": 64, "min_count": 4,
                                     "min_covered_tokens": 48}


def test_mtp_recipe_runs_sampled_and_greedy_with_mtp() -> None:
    recipe = load_recipe("deepseek-r1-mtp-temperature")
    temperatures = {case.id: case.sampling.temperature for case in recipe.cases}
    assert temperatures == {"sampled-t0.6": 0.6, "greedy-t0": 0.0}
    assert recipe.cases[0].messages == recipe.cases[1].messages
    kwargs = engine_kwargs(probe_request(recipe, recipe.cases[0], commit="c", trial=0))
    assert kwargs["speculative_config"] == {"method": "deepseek_mtp", "num_speculative_tokens": 1}
    assert kwargs["disable_log_stats"] is False  # the acceptance counters come from vLLM's stats


def test_a_recipe_without_determinism_switches_still_gets_them_on_ascend(tmp_path: Path) -> None:
    recipe = parse_recipe(MINIMAL + "environment:\n  VLLM_USE_V1: '1'\n")
    factory = container_spec_factory(spec_of(good="g", bad="b", executor="docker", devices=[2]), recipe)
    spec = factory("img", tmp_path)
    assert spec.environment == {**DETERMINISM_ENV, "VLLM_USE_V1": "1"}
    assert spec.devices[0] == "/dev/davinci2"
    cpu = container_spec_factory(spec_of(good="g", bad="b", executor="docker"), recipe)("img", tmp_path)
    assert cpu.devices == [] and cpu.environment == {"VLLM_USE_V1": "1"}  # the CPU demo: no NPU switches


def test_presence_penalty_recipe_server_on_ascend(tmp_path: Path) -> None:
    request, spec = _spec("qwen3-moe-presence-penalty-loop", tmp_path, [0, 1, 2, 3])
    argv = server_argv(request, python="python3")
    assert argv == ["vllm", "serve", "/models/Qwen3-30B-A3B", "--host", "127.0.0.1", "--port", "8000",
                    "--dtype", "bfloat16", "--tensor-parallel-size", "4", "--enable-expert-parallel",
                    "--max-model-len", "16384", "--max-num-seqs", "16", "--gpu-memory-utilization", "0.9",
                    "--served-model-name", "qwen3-moe", "--override-generation-config", '{"presence_penalty": 1.5}']
    assert override_generation_config(argv) == {"presence_penalty": 1.5}
    assert "presence_penalty" not in request["case"]["sampling"]  # the server default must carry it
    assert request["engine"]["startup_timeout_s"] == 1200
    assert spec.devices == [f"/dev/davinci{n}" for n in range(4)] + list(MANAGEMENT_DEVICES)
    assert spec.network_mode == "bridge" and "ports" not in container_create_kwargs(spec)  # nothing published
    assert spec.environment["HCCL_DETERMINISTIC"] == "true"


def test_launcher_placeholders_for_the_cpu_wheel() -> None:
    request = {"model": {"path": "/m", "dtype": "auto"}, "seed": None,
               "engine": {"launcher": ["{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}"],
                          "port": 9001, "args": {"enforce_eager": True, "enable_prefix_caching": False,
                                                 "additional_config": {"a": 1}}}}
    assert server_argv(request, python="/venv/bin/python") == [
        "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--host", "127.0.0.1",
        "--port", "9001", "--enforce-eager", "--no-enable-prefix-caching", "--additional-config", '{"a": 1}']


def test_earlier_runs_in_the_search_s_terms() -> None:
    recipe = parse_recipe(MINIMAL + "trials:\n  mode: noisy\n  earlier_runs:\n    bad_end: 8/10\n    good_end: 1/20\n")
    spec = recipe.trials.earlier_runs
    assert spec is not None
    assert earlier_runs_for_search(spec, find_fix=False) == EarlierRuns(bad_failed=8, bad_runs=10, good_failed=1,
                                                                        good_runs=20)
    # --find-fix hunts for the side without the symptom: the symptom-free runs of the fixed end count as "bad".
    assert earlier_runs_for_search(spec, find_fix=True) == EarlierRuns(bad_failed=19, bad_runs=20, good_failed=2,
                                                                       good_runs=10)


def test_earlier_runs_come_from_the_recipe_unless_given_on_the_command_line() -> None:
    recipe = parse_recipe(MINIMAL + "trials:\n  mode: noisy\n  earlier_runs:\n    bad_end: 8/10\n    good_end: 0/10\n")
    from_recipe = earlier_runs_spec(spec_of(good="g", bad="b"), recipe)
    assert from_recipe is not None and from_recipe.counts("bad_end") == (8, 10)
    overridden = earlier_runs_spec(spec_of(good="g", bad="b", earlier_runs=["3/4", "1/9"]), recipe)
    assert overridden is not None and overridden.counts("good_end") == (1, 9)
    assert earlier_runs_spec(spec_of(good="g", bad="b"), parse_recipe(MINIMAL)) is None
    with pytest.raises(UsageError, match="--earlier-runs 3/4 x: 'x' is not 'shown/runs'"):
        earlier_runs_spec(spec_of(good="g", bad="b", earlier_runs=["3/4", "x"]), recipe)
    with pytest.raises(UsageError, match=r"--earlier-runs 0/10 8/10: .*shows the symptom no more often.*swap"):
        earlier_runs_spec(spec_of(good="g", bad="b", earlier_runs=["0/10", "8/10"]), recipe)
    with pytest.raises(UsageError, match="no more often"):
        parse_recipe(MINIMAL + "trials:\n  mode: noisy\n  earlier_runs:\n    bad_end: 2/10\n    good_end: 4/20\n")
    assert earlier_runs_spec(spec_of(good="g", bad="b", earlier_runs=["1/10", "0/0"]), recipe) is not None


# Digests bisect-npu 0.1.0 recorded for the bundled recipes that have not changed since: sessions
# it started must resume under this version (tests/data/journals/demo-0.1.0 is one of them).
DIGESTS_OF_0_1_0 = {"demo-async-penalty": "65c77bcf4d6e7cbf", "demo-presence-penalty": "88eed1135e55bf5e",
                    "demo-rope-longseq": "7c3c318e04e88f84", "demo-spec-decode": "7a0163c2f1e28b4a",
                    "precision-alignment": "55d9f1e83221fd20"}


@pytest.mark.parametrize("name", sorted(DIGESTS_OF_0_1_0))
def test_a_recipe_unchanged_since_0_1_0_keeps_its_digest(name: str) -> None:
    assert load_recipe(name).digest() == DIGESTS_OF_0_1_0[name]


def test_a_field_added_since_0_1_0_changes_the_digest_only_when_set() -> None:
    recipe = load_recipe("demo-async-penalty")
    at_default = recipe.model_copy(update={"build": recipe.build.model_copy(update={"base_image_map": {}})})
    mapped = recipe.model_copy(update={"build": recipe.build.model_copy(
        update={"base_image_map": {"quay.io": "mirror.example/quay.io"}})})
    assert at_default.digest() == recipe.digest()
    assert mapped.digest() != recipe.digest()
    older_field = recipe.model_copy(update={"build": recipe.build.model_copy(update={"reuse_outputs": False})})
    assert older_field.digest() != recipe.digest()
