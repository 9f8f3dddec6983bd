"""Each node of an engine across hosts under `--node-executor docker`: the exact container it
creates, field by field, as the node's executor (made as a Ray node makes it, on the cards of its
bundle) hands it to the engine (no Ray, no NPU: the engine's create call is where it stops), and
on the real container engine, how a node's container ends: its own exit, killed, removed under it,
and gone after `stop_runs`."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from bisect_npu import __version__
from bisect_npu.builders.base import Environment
from bisect_npu.execute.ascend import DETERMINISM_ENV, DRIVER_MOUNTS, HOST_ENV, MANAGEMENT_DEVICES
from bisect_npu.execute.base import RunResult
from bisect_npu.execute.docker import (
    ENV_BOOTSTRAP,
    ENV_CARRIER,
    OUT_DIR,
    PROBE_BOOTSTRAP,
    PROBE_PATH_BOOTSTRAP,
    SESSION_LABEL,
    ContainerSpec,
    DockerExecutor,
    container_create_kwargs,
    probe_source_dir,
)
from bisect_npu.execute.ray_nodes import NODE_ENV, headless_command, node_environment, node_side, serving_request
from bisect_npu.orchestration.opening.environments import container_spec_factory
from bisect_npu.orchestration.running.probe_requests import probe_request
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from tests.helpers.asked import spec_of
from tests.helpers.paths import DATA

TWO_NODES = DATA / "ray" / "demo-rope-longseq-two-nodes.yaml"
CARDS = [2, 3]  # the share of its host Ray gave the node's bundle
NODE_ID = "0fd12ed7ef7ca0bd" * 3
RECIPE_ENV = {"HCCL_BUFFSIZE": "512", "ATB_MATMUL_SHUFFLE_K_ENABLE": "1"}  # the recipe's word wins
IMAGE = "localhost/bisect-npu-candidate:0123abcd"
RUN_ENV = {"VLLM_BATCH_INVARIANT": "1"}  # what the candidate's own source offers (builders/switches.py)


class EngineCreateRecorder(DockerExecutor):
    """The real DockerExecutor up to the engine's create call (no NPU host here): the specs it
    would start, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started: list[ContainerSpec] = []

    def _run_on(self, spec: ContainerSpec, log_path: Path, timeout_s: float) -> RunResult:
        self.started.append(spec)
        return RunResult(returncode=0, seconds=0.0, log_path=str(log_path))


def recipe_with_environment(tmp_path: Path) -> Recipe:
    data = yaml.safe_load(TWO_NODES.read_text())
    data["environment"] = RECIPE_ENV
    path = tmp_path / "two-nodes.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_recipe(str(path))


def node_executor_on_npus(recipe: Recipe, cards: list[int]) -> DockerExecutor:
    """As environments.node_executor makes it on an A3 host with NPU device files, then as the
    node's actor takes it (ray_nodes.node_side)."""
    spec = spec_of(good="g", bad="b", executor="docker", devices=cards, host="A3")
    made = EngineCreateRecorder(None, container_spec_factory(spec, recipe), session_id="sess-e52")
    executor = node_side(made)
    assert isinstance(executor, EngineCreateRecorder) and executor is not made
    return executor


def candidate() -> Environment:
    return Environment(kind="image", commit="c0ffee" * 6 + "beef", image=IMAGE, run_env=RUN_ENV)


def expected_environment(node_env: dict[str, str]) -> dict[str, str]:
    return {**RUN_ENV, **DETERMINISM_ENV, **HOST_ENV["A3"], **RECIPE_ENV, **node_env, "PYTHONDONTWRITEBYTECODE": "1"}


def assert_on_the_nodes_npus(kwargs: dict[str, Any], out_dir: Path, node_env: dict[str, str]) -> None:
    """What both nodes' containers share: the image, the node's cards and the management devices,
    the driver's files read-only, the probe read-only, the output directory, the host's network,
    no privilege, the session's labels, the environment (carried past the image's entrypoint)."""
    assert kwargs["image"] == IMAGE
    assert kwargs["devices"] == ["/dev/davinci2:/dev/davinci2:rwm", "/dev/davinci3:/dev/davinci3:rwm",
                                 *[f"{path}:{path}:rwm" for path in MANAGEMENT_DEVICES]]
    assert kwargs["volumes"] == {
        **{path: {"bind": path, "mode": "ro"} for path in DRIVER_MOUNTS},
        str(out_dir.resolve()): {"bind": OUT_DIR, "mode": "rw"},
        str(probe_source_dir()): {"bind": "/opt/bisect-npu/bisect_npu_probe", "mode": "ro"},
    }
    assert kwargs["network_mode"] == "host"  # the ranks meet on the node's address and the chosen port
    assert kwargs["privileged"] is False
    assert kwargs["shm_size"] == "16g"
    assert kwargs["detach"] is True
    assert kwargs["labels"] == {SESSION_LABEL: "sess-e52", "org.bisect-npu.commit": "c0ffee" * 6 + "beef",
                                "org.bisect-npu.tool-version": __version__}
    wanted = expected_environment(node_env)
    assert json.loads(kwargs["environment"].pop(ENV_CARRIER)) == wanted
    assert kwargs["environment"] == wanted
    assert "ports" not in kwargs and "user" not in kwargs and "working_dir" not in kwargs


def test_a_headless_nodes_container_field_by_field(tmp_path: Path) -> None:
    recipe = recipe_with_environment(tmp_path)
    assert recipe.engine.nodes is not None
    request = probe_request(recipe, recipe.cases[0], commit="c0ffee", trial=0)
    executor = node_executor_on_npus(recipe, CARDS)
    node = recipe.engine.nodes.each[1]
    argv = headless_command(executor, candidate(), request, node.filled("10.0.0.2", "10.0.0.1", 29555))
    node_env = node_environment(node.environment, 1, NODE_ID)
    spec = executor.spec_for(candidate(), argv, tmp_path / "node", None, node_env)
    kwargs = container_create_kwargs(spec)
    assert set(kwargs) == {"image", "command", "environment", "devices", "volumes", "network_mode", "labels",
                           "privileged", "detach", "shm_size"}
    # The image's interpreter and the probe's package as the container names it; the rank's flags
    # with the serving node's address and port; one argument list, no shell.
    assert kwargs["command"] == ["python3", "-c", ENV_BOOTSTRAP, "python3", "-c", PROBE_PATH_BOOTSTRAP,
                                 "python3", "-m", "bisect_npu_probe.serve_mini", "seed:0",
                                 "--headless", "--data-parallel-size", "2", "--data-parallel-start-rank", "1",
                                 "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "29555"]
    assert_on_the_nodes_npus(kwargs, tmp_path / "node", {"TINYVLLM_LOGGING_LEVEL": "WARNING",
                                                         NODE_ENV: f"1 {NODE_ID}"})


def test_the_serving_nodes_container_field_by_field(tmp_path: Path) -> None:
    """The serving node runs the probe in its container; the probe's server is the node's command
    with its own address and the chosen port, and the node's environment."""
    recipe = recipe_with_environment(tmp_path)
    assert recipe.engine.nodes is not None
    request = probe_request(recipe, recipe.cases[0], commit="c0ffee", trial=0)
    executor = node_executor_on_npus(recipe, CARDS)
    node = recipe.engine.nodes.each[0]
    out_dir = tmp_path / "serve"
    executor.run_probe(candidate(), serving_request(request, node.filled("10.0.0.1", "10.0.0.1", 29555),
                                                    node.environment, 0, NODE_ID), out_dir, 600.0)
    [spec] = executor.started
    kwargs = container_create_kwargs(spec)
    [written] = list(out_dir.glob("request-*.json"))
    assert kwargs["command"] == ["python3", "-c", ENV_BOOTSTRAP, "python3", "-c", PROBE_BOOTSTRAP,
                                 f"{OUT_DIR}/{written.name}"]
    assert_on_the_nodes_npus(kwargs, out_dir, {})
    engine = json.loads(written.read_text())["engine"]
    assert engine["server_flags"] == ["--data-parallel-size", "2", "--data-parallel-address", "10.0.0.1",
                                      "--data-parallel-rpc-port", "29555"]
    assert engine["server_env"] == {NODE_ENV: f"0 {NODE_ID}"}


def test_a_node_without_npu_device_files_runs_a_plain_container_on_the_hosts_network(tmp_path: Path) -> None:
    """The fake-NPU Ray nodes of the tests: no devices, still the host's network (a plain
    container's own is none, where no rank could reach another)."""
    recipe = load_recipe(str(TWO_NODES))
    spec = spec_of(good="g", bad="b", executor="docker")
    made = DockerExecutor(None, container_spec_factory(spec, recipe), session_id="sess-e52")
    assert made.spec_for(candidate(), ["true"], tmp_path).network_mode == "none"
    kwargs = container_create_kwargs(node_side(made).spec_for(candidate(), ["true"], tmp_path))
    assert kwargs["network_mode"] == "host"
    assert kwargs["devices"] == []


@pytest.mark.container
def test_how_a_nodes_container_ends_on_the_engine(docker_client: Any, demo_base_image: str, tmp_path: Path) -> None:
    """Its own exit status as it is; killed by the host: -9; removed under it: -9 (the node lost);
    `stop_runs` removes what still runs, and `stop` leaves nothing of it."""
    executor = DockerExecutor(docker_client, session_id="e52-node-ends").on_host_network()
    env = Environment(kind="image", commit="c0ffee" * 6 + "beef", image=demo_base_image)
    try:
        exits = executor.spawn(env, ["python3", "-c", "print('rank up'); raise SystemExit(3)"],
                               tmp_path / "exits.log")
        assert exits.wait() == 3
        exits.stop()
        assert "rank up" in (tmp_path / "exits.log").read_text()

        killed = executor.spawn(env, ["sleep", "600"], tmp_path / "killed.log")
        threading.Timer(1.0, killed.container.kill).start()
        assert killed.wait() == -signal.SIGKILL
        killed.stop()

        removed = executor.spawn(env, ["sleep", "600"], tmp_path / "removed.log")
        threading.Timer(1.0, executor.stop_runs).start()
        assert removed.wait() == -signal.SIGKILL
        removed.stop()
        label = f"{SESSION_LABEL}=e52-node-ends"
        assert docker_client.containers.list(all=True, filters={"label": label}) == []
    finally:
        executor.sweep()
