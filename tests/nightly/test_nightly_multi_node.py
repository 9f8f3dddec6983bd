"""Multi-node nightly case files as recipes whose engine spans hosts: the deployment entries as
nodes, env_common as the recipe's environment, each refusal one line naming what cannot be mapped.
The fixture is written for these tests in the nightly's shape (tests/data/nightly-multi-node)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bisect_npu.nightly.at_commit import recipe_dump
from bisect_npu.nightly.cases import NightlyRefused, import_case, read_case_file, survey
from bisect_npu.recipe.loader import parse_recipe
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import DATA, REPO_ROOT

PATH = "tests/e2e/nightly/multi_node/internal_dp/config/two-nodes.yaml"
TEXT = (DATA / "nightly-multi-node" / "two-nodes.yaml").read_text()


def raw_with(**changes: object) -> dict[str, object]:
    raw = read_case_file(TEXT, PATH)
    raw.update(changes)
    return raw


def test_each_deployment_entry_is_a_node_node_0_serving() -> None:
    recipe = import_case(read_case_file(TEXT, PATH), PATH, benchmark="acc")
    nodes = recipe.engine.nodes
    assert nodes is not None and nodes.cards == 8 and nodes.serving == 0 and nodes.count == 2
    serving, headless = nodes.each
    assert serving.flags == ["--data-parallel-size", "4", "--data-parallel-size-local", "2",
                             "--data-parallel-address", "{local_ip}", "--data-parallel-rpc-port", "{rpc_port}",
                             "--tensor-parallel-size", "4", "--additional-config",
                             '{"ascend_scheduler_config": {"enabled": true}}']
    assert headless.flags[:1] == ["--headless"] and "{master_ip}" in headless.flags
    assert headless.flags[headless.flags.index("--data-parallel-rpc-port") + 1] == "{rpc_port}"
    assert "13389" not in serving.flags + headless.flags  # the port is chosen free at each start
    assert recipe.environment == {"HCCL_BUFFSIZE": "512", "OMP_NUM_THREADS": "1"}  # env_common, less the port
    assert serving.environment == {} and headless.environment == {"OMP_NUM_THREADS": "2",
                                                                  "TINY_RANK_NOTE": "headless"}
    assert recipe.cards_per_run() == 8 and recipe.accuracy is not None and recipe.accuracy.baseline == 80
    assert parse_recipe(recipe_dump(recipe)).digest() == recipe.digest()  # written out, read back the same


def test_each_benchmark_of_a_multi_node_file_is_a_recipe() -> None:
    found = survey(TEXT, PATH)
    assert found.imported == ["tiny-two-node-data-parallel-acc", "tiny-two-node-data-parallel-perf"]
    assert found.refused == []
    perf = import_case(read_case_file(TEXT, PATH), PATH, benchmark="perf")
    assert perf.oracle.kinds == ["throughput"] and perf.engine.nodes is not None


def _second_node(command: str) -> dict[str, object]:
    raw = read_case_file(TEXT, PATH)
    deployment = list(raw["deployment"])  # type: ignore[call-overload]
    deployment[1] = {**deployment[1], "server_cmd": command}
    return {**raw, "deployment": deployment}


@pytest.mark.parametrize(("raw", "says"), [
    (_second_node("vllm serve m --headless --data-parallel-address $MASTER_IP --nic $NIC_NAME"),
     r"deployment\[1\]: its command needs \$NIC_NAME, which bisect-npu cannot supply"),
    (_second_node("vllm serve m --data-parallel-address $MASTER_IP"),
     r"deployment\[1\]: not --headless, so a second API server"),
    (raw_with(disaggregated_prefill={"enabled": True, "prefiller_host_index": [0], "decoder_host_index": [1]}),
     r"disaggregated prefill: prefill nodes \[0\], decode nodes \[1\]\).*missing: a launcher for a proxy"),
    (raw_with(deployment=None, templates={"a": 1}, routing={"b": 2}),
     r"no `deployment` entries \(its nodes are made from templates, routing: external data parallel"),
    (raw_with(num_nodes=3), r"num_nodes 3 but 2 `deployment` entries"),
    (raw_with(npu_per_node="many"), r"no whole npu_per_node"),
])
def test_what_cannot_be_mapped_is_refused_in_one_line(raw: dict[str, object], says: str) -> None:
    with pytest.raises(NightlyRefused, match=says) as refused:
        import_case(raw, PATH)
    assert "\n" not in str(refused.value)


def test_show_prints_each_nodes_command_and_container(tmp_path: Path) -> None:
    recipe = import_case(read_case_file(TEXT, PATH), PATH, benchmark="acc")
    written = tmp_path / "two-nodes.yaml"
    written.write_text(recipe_dump(recipe))
    shown = cli_in_process(["recipes", "show", str(written), "--format", "json"], cwd=REPO_ROOT)
    assert shown.returncode == 0, shown.stderr
    nodes = json.loads(shown.stdout)["engine"]["nodes"]
    assert [node["role"] for node in nodes] == ["serving", "headless"]
    assert nodes[0]["command"][:6] == ["vllm", "serve", "Org/Tiny-MoE", "--host", "127.0.0.1", "--port"]
    assert nodes[0]["command"][7:] == recipe.engine.nodes.each[0].flags  # type: ignore[union-attr]
    assert nodes[1]["command"] == ["vllm", "serve", "Org/Tiny-MoE", *recipe.engine.nodes.each[1].flags]  # type: ignore[union-attr]
    assert nodes[1]["environment"] == {"OMP_NUM_THREADS": "2", "TINY_RANK_NOTE": "headless"}
    assert all("worktree" in node["container"] for node in nodes)
    shown = cli_in_process(["recipes", "show", str(written)], cwd=REPO_ROOT)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "node 1   headless, 8 NPU: vllm serve Org/Tiny-MoE --headless" in text
    assert "\nserver " not in text  # no single-host server line for an engine across hosts


def test_a_nodes_recipe_outside_ray_is_refused_before_anything_runs(tmp_path: Path) -> None:
    recipe = import_case(read_case_file(TEXT, PATH), PATH, benchmark="acc")
    written = tmp_path / "two-nodes.yaml"
    body = yaml.safe_load(recipe_dump(recipe))
    written.write_text(yaml.safe_dump(body))
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(tmp_path), "--good", "a",
                           "--bad", "b", "--recipe", str(written), "--session", str(tmp_path / "s")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "engine spans 2 hosts (engine.nodes): run it with --executor ray" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "s" / "journal.jsonl").exists()


def test_plan_prints_each_nodes_command(tmp_path: Path) -> None:
    recipe = import_case(read_case_file(TEXT, PATH), PATH, benchmark="acc")
    written = tmp_path / "two-nodes.yaml"
    written.write_text(recipe_dump(recipe))
    shas = make_linear_repo(tmp_path / "repo", 6, culprit=3)
    done = cli_in_process(["plan", "--repo", str(tmp_path / "repo"), "--good", shas[0], "--bad", shas[-1], "--recipe",
                           str(written)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "node 0   serving, 8 NPU: vllm serve Org/Tiny-MoE --host 127.0.0.1 --port 8000 --data-parallel-size 4" \
        in done.stdout
    assert "node 1   headless, 8 NPU: vllm serve Org/Tiny-MoE --headless" in done.stdout
