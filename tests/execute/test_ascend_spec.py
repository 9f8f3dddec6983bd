"""The Ascend container spec, checked on the exact `containers.create(...)` kwargs it becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_npu.errors import UsageError
from bisect_npu.execute.ascend import DETERMINISM_ENV, ascend_container_spec, parse_devices
from bisect_npu.execute.docker import container_create_kwargs

MANAGEMENT = ["/dev/davinci_manager:/dev/davinci_manager:rwm", "/dev/devmm_svm:/dev/devmm_svm:rwm",
              "/dev/hisi_hdc:/dev/hisi_hdc:rwm"]
DRIVER = {
    "/usr/local/dcmi": {"bind": "/usr/local/dcmi", "mode": "ro"},
    "/usr/local/bin/npu-smi": {"bind": "/usr/local/bin/npu-smi", "mode": "ro"},
    "/usr/local/Ascend/driver/lib64/": {"bind": "/usr/local/Ascend/driver/lib64/", "mode": "ro"},
    "/usr/local/Ascend/driver/version.info": {"bind": "/usr/local/Ascend/driver/version.info", "mode": "ro"},
    "/etc/ascend_install.info": {"bind": "/etc/ascend_install.info", "mode": "ro"},
}


def test_two_cards_field_by_field(tmp_path: Path):
    spec = ascend_container_spec("bisect-npu/vllm-ascend:commit-abc", tmp_path / "out", devices=parse_devices("0,1"),
                                 model_dir=Path("/data/Qwen3-8B"), model_path="/models/Qwen3-8B",
                                 env={"VLLM_USE_V1": "1"})
    kwargs = container_create_kwargs(spec)
    assert kwargs["image"] == "bisect-npu/vllm-ascend:commit-abc"
    assert kwargs["devices"] == ["/dev/davinci0:/dev/davinci0:rwm", "/dev/davinci1:/dev/davinci1:rwm", *MANAGEMENT]
    assert kwargs["volumes"] == {**DRIVER,
                                 "/data/Qwen3-8B": {"bind": "/models/Qwen3-8B", "mode": "ro"},
                                 str(tmp_path / "out"): {"bind": "/out", "mode": "rw"}}
    assert kwargs["environment"] == {**DETERMINISM_ENV, "VLLM_USE_V1": "1"}
    assert kwargs["environment"]["LCCL_DETERMINISTIC"] == "1"
    assert kwargs["environment"]["HCCL_DETERMINISTIC"] == "true"
    assert kwargs["privileged"] is False
    assert kwargs["network_mode"] == "bridge"  # as vllm-ascend's quick start: HCCL wants a real interface
    assert "ports" not in kwargs
    assert kwargs["shm_size"] == "16g"


def test_one_card_exposes_only_that_card(tmp_path: Path):
    kwargs = container_create_kwargs(ascend_container_spec("img", tmp_path, devices=parse_devices("3")))
    cards = [d for d in kwargs["devices"] if d.split(":")[0].removeprefix("/dev/davinci").isdigit()]
    assert cards == ["/dev/davinci3:/dev/davinci3:rwm"]
    assert kwargs["devices"][1:] == MANAGEMENT


def test_determinism_switches_always_and_the_recipe_has_the_last_word(tmp_path: Path):
    kwargs = container_create_kwargs(ascend_container_spec("img", tmp_path, devices=[0]))
    assert kwargs["environment"] == DETERMINISM_ENV
    recipe_says = container_create_kwargs(ascend_container_spec("img", tmp_path, devices=[0],
                                                                env={"HCCL_DETERMINISTIC": "false"}))
    assert recipe_says["environment"] == {**DETERMINISM_ENV, "HCCL_DETERMINISTIC": "false"}


@pytest.mark.parametrize(("text", "cards"), [("0-7", list(range(8))), ("0,1", [0, 1]), ("3", [3]),
                                             ("0-1, 4", [0, 1, 4]), ("1,1", [1])])
def test_parse_devices(text, cards):
    assert parse_devices(text) == cards


@pytest.mark.parametrize("text", ["", "a", "1-", "3-1", "0,,1", "-1", "1.5", "0-64"])
def test_parse_devices_rejects(text):
    with pytest.raises(UsageError, match="--devices"):
        parse_devices(text)


def test_no_device_is_a_usage_error(tmp_path: Path):
    with pytest.raises(UsageError, match="--devices"):
        ascend_container_spec("img", tmp_path, devices=[])


@pytest.mark.parametrize(("host", "extra"), [("A3", {"HCCL_OP_EXPANSION_MODE": "AIV"}), ("A2", {}), ("310P", {}),
                                             (None, {})])
def test_an_a3_expands_collectives_on_the_vector_cores(tmp_path: Path, host: str | None,
                                                       extra: dict[str, str]) -> None:
    kwargs = container_create_kwargs(ascend_container_spec("img", tmp_path, devices=[0, 1], host=host))
    assert kwargs["environment"] == {**DETERMINISM_ENV, **extra}
    recipe_says = ascend_container_spec("img", tmp_path, devices=[0, 1], host=host,
                                        env={"HCCL_OP_EXPANSION_MODE": "AI_CPU"})
    assert recipe_says.environment["HCCL_OP_EXPANSION_MODE"] == "AI_CPU"


def test_the_run_options_host_reaches_the_container_and_the_local_runs(tmp_path: Path) -> None:
    import git

    from bisect_npu.orchestration.opening.environments import container_spec_factory, make_environment
    from tests.helpers.asked import spec_of

    options = spec_of(good="g", bad="b", executor="docker", devices=[0, 1], slots=1, host="A3")
    assert container_spec_factory(options, None)("img", tmp_path).environment == {
        **DETERMINISM_ENV, "HCCL_OP_EXPANSION_MODE": "AIV"}
    repo = git.Repo.init(tmp_path / "repo")
    local = spec_of(good="g", bad="b", executor="local", command=["true"], devices=[0, 1], slots=1, host="A3")
    _, executor = make_environment(local, repo, None, tmp_path / "s", tmp_path / "w")
    assert executor.env == {**DETERMINISM_ENV, "HCCL_OP_EXPANSION_MODE": "AIV"}  # type: ignore[attr-defined]


def test_a_candidates_own_switches_go_under_the_spec_environment(tmp_path: Path) -> None:
    import functools

    from bisect_npu.builders.base import Environment
    from bisect_npu.execute.docker import DockerExecutor

    factory = functools.partial(ascend_container_spec, devices=[0], env={"VLLM_USE_V1": "1"})
    executor = DockerExecutor(client=None, spec_factory=factory)
    candidate = Environment(kind="image", commit="c" * 40, image="img",
                            run_env={"VLLM_BATCH_INVARIANT": "1", "VLLM_USE_V1": "0"})
    spec = executor.spec_for(candidate, ["true"], tmp_path)
    assert spec.environment["VLLM_BATCH_INVARIANT"] == "1"
    assert spec.environment["VLLM_USE_V1"] == "1"  # the recipe's word wins over the candidate's
