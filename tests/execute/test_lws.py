"""An engine across nodes as a Kubernetes LeaderWorkerSet (`recipes lws`), checked up to the
cluster: the manifest read back from the command's YAML against the LWS fields
(tests/helpers/leaderworkerset.py), each node's command after the kubelet's expansion equal to the
one `recipes show` prints for it, the dispatcher of differing workers run for real, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bisect_npu.execute.ascend import DETERMINISM_ENV, DRIVER_MOUNTS
from bisect_npu.execute.lws import DISPATCH, LwsNode, leader_worker_set
from bisect_npu.nightly.at_commit import recipe_dump
from bisect_npu.nightly.cases import import_case, read_case_file
from bisect_npu.probe.ports import free_port
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.leaderworkerset import Container, LeaderWorkerSet, kubelet_expand
from tests.helpers.paths import DATA, REPO_ROOT

NIGHTLY = "tests/e2e/nightly/multi_node/internal_dp/config/two-nodes.yaml"
IMAGE = "registry.example/vllm-ascend:candidate-abc123"
POD = {"LWS_LEADER_ADDRESS": "lws-0.lws.ns", "BISECT_NPU_POD_IP": "10.9.8.7"}
ROLES = {"master_ip": POD["LWS_LEADER_ADDRESS"], "local_ip": POD["BISECT_NPU_POD_IP"]}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`recipes ARGS` in this process: what it prints and its exit code."""
    return cli_in_process(["recipes", *args], cwd=REPO_ROOT)


def recipe_file(tmp_path: Path, nodes: int = 2) -> Path:
    """The nightly fixture imported; with 3 nodes, a second headless rank of its own start rank.
    The recipe's environment and a flag hold `$(...)` and `$$`, which must reach the process as
    written."""
    body = yaml.safe_load(recipe_dump(import_case(read_case_file((DATA / "nightly-multi-node" / "two-nodes.yaml")
                                                                 .read_text(), NIGHTLY), NIGHTLY, benchmark="acc")))
    body["environment"]["PRICE_NOTE"] = "costs $$5, not $(HCCL_BUFFSIZE)"
    body["engine"]["nodes"]["each"][0]["flags"] += ["--served-model-name", "tiny-$(LWS_LEADER_ADDRESS)"]
    if nodes == 3:
        third = json.loads(json.dumps(body["engine"]["nodes"]["each"][1]))
        third["flags"][third["flags"].index("--data-parallel-start-rank") + 1] = "4"
        third["environment"] = {"OMP_NUM_THREADS": "3"}
        body["engine"]["nodes"]["each"].append(third)
    written = tmp_path / f"nodes-{nodes}.yaml"
    written.write_text(yaml.safe_dump(body, sort_keys=False))
    return written


def shown_nodes(recipe: Path) -> list[dict[str, Any]]:
    done = cli("show", str(recipe), "--format", "json")
    assert done.returncode == 0, done.stderr
    nodes: list[dict[str, Any]] = json.loads(done.stdout)["engine"]["nodes"]
    return nodes


def lws(recipe: Path, *extra: str) -> LeaderWorkerSet:
    done = cli("lws", str(recipe), "--image", IMAGE, *extra)
    assert done.returncode == 0, done.stderr
    assert "&id" not in done.stdout  # each pod spelt out, no YAML anchor into another's
    return LeaderWorkerSet.model_validate(yaml.safe_load(done.stdout))


def filled(command: list[str], rpc_port: int) -> list[str]:
    """`plan`'s command with the values a pod has."""
    values = {**ROLES, "rpc_port": str(rpc_port)}
    out = []
    for part in command:
        for name, value in values.items():
            part = part.replace("{" + name + "}", value)
        out.append(part)
    return out


def process_env(container: Container) -> dict[str, str]:
    """The environment the container's process starts with (values expanded in order)."""
    env = dict(POD)
    for entry in container.env:
        if entry.value is not None:
            env[entry.name] = kubelet_expand(entry.value, env)
    return env


def test_two_nodes_leader_serves_worker_runs_headless_field_by_field(tmp_path: Path) -> None:
    recipe = recipe_file(tmp_path)
    manifest = lws(recipe)
    shown = shown_nodes(recipe)
    template = manifest.spec.leaderWorkerTemplate
    assert manifest.metadata.name == "tiny-two-node-data-parallel-acc"  # the recipe's name, as a Kubernetes name
    assert template.size == 2 and manifest.spec.replicas == 1
    assert manifest.spec.startupPolicy == "LeaderCreated"  # serving is healthy only once the workers joined
    assert template.restartPolicy == "RecreateGroupOnPodRestart"  # one node lost: the whole group again
    assert template.leaderTemplate is not None
    leader, worker = template.leaderTemplate.spec.containers[0], template.workerTemplate.spec.containers[0]
    for container, node in ((leader, shown[0]), (worker, shown[1])):
        assert container.image == IMAGE
        assert container.resources.limits == container.resources.requests == {"huawei.com/Ascend910": 8}
        env = process_env(container)
        assert [kubelet_expand(part, env) for part in container.command] == filled(node["command"], 13389)
        assert env["PRICE_NOTE"] == "costs $$5, not $(HCCL_BUFFSIZE)" and env["HCCL_BUFFSIZE"] == "512"
        assert all(env[name] == value for name, value in DETERMINISM_ENV.items())
        assert {entry.name: entry.valueFrom.fieldRef.fieldPath for entry in container.env if entry.valueFrom} == {
            "BISECT_NPU_POD_IP": "status.podIP"}
        mounts = {mount.mountPath: mount.readOnly for mount in container.volumeMounts}
        assert all(mounts[path] for path in DRIVER_MOUNTS) and mounts["/dev/shm"] is False
    assert process_env(worker)["OMP_NUM_THREADS"] == "2" and process_env(leader)["OMP_NUM_THREADS"] == "1"
    assert "--data-parallel-address" in worker.command and \
        worker.command[worker.command.index("--data-parallel-address") + 1] == "$(LWS_LEADER_ADDRESS)"
    assert leader.readinessProbe is not None and worker.readinessProbe is None
    probe = leader.readinessProbe.exec.command
    assert probe[:2] == ["python3", "-c"] and "http://127.0.0.1:8000/health" in probe[2]
    volumes = {volume.name: volume for volume in template.workerTemplate.spec.volumes}
    assert {volume.hostPath.path for volume in volumes.values() if volume.hostPath} == set(DRIVER_MOUNTS)
    assert volumes["dshm"].emptyDir is not None and volumes["dshm"].emptyDir.medium == "Memory"


def test_the_npu_resource_name_and_rpc_port_are_the_users(tmp_path: Path) -> None:
    recipe = recipe_file(tmp_path)
    manifest = lws(recipe, "--npu-resource", "huawei.com/ascend-1980", "--rpc-port", "20001", "--name", "My Case",
                   "--host-type", "A3")
    worker = manifest.spec.leaderWorkerTemplate.workerTemplate.spec.containers[0]
    assert process_env(worker)["HCCL_OP_EXPANSION_MODE"] == "AIV"  # A3's switch, as on a docker run there
    assert "HCCL_OP_EXPANSION_MODE" not in process_env(lws(recipe).spec.leaderWorkerTemplate.workerTemplate.spec
                                                       .containers[0])
    assert worker.resources.limits == {"huawei.com/ascend-1980": 8} == worker.resources.requests
    assert worker.command == [*worker.command[:worker.command.index("--data-parallel-rpc-port") + 1], "20001",
                              *worker.command[worker.command.index("--data-parallel-rpc-port") + 2:]]
    assert manifest.metadata.name == "my-case"


def test_headless_nodes_that_differ_each_get_their_own_command_through_the_worker_index(tmp_path: Path) -> None:
    recipe = recipe_file(tmp_path, nodes=3)
    manifest = lws(recipe)
    shown = shown_nodes(recipe)
    assert manifest.spec.leaderWorkerTemplate.size == 3
    worker = manifest.spec.leaderWorkerTemplate.workerTemplate.spec.containers[0]
    env = process_env(worker)
    argv = [kubelet_expand(part, env) for part in worker.command]
    assert argv[:3] == ["python3", "-c", DISPATCH]
    table = json.loads(argv[3])
    assert sorted(table) == ["1", "2"]
    for index in ("1", "2"):
        assert table[index]["argv"] == filled(shown[int(index)]["command"], 13389)
    assert table["1"]["env"]["OMP_NUM_THREADS"] == "2" and table["2"]["env"] == {"OMP_NUM_THREADS": "3"}


def test_the_dispatcher_execs_the_argument_list_of_its_worker_index() -> None:
    """The worker's entry run for real, as the kubelet would start it in pod 2 of the group."""
    show = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['WHO']]))"
    nodes = [LwsNode([sys.executable, "-c", show, "one", "{master_ip}"], {"WHO": "first"}),
             LwsNode([sys.executable, "-c", show, "two words; rm -rf /", "$(LWS_LEADER_ADDRESS) $$",
                      "--port={rpc_port}"],
                     {"WHO": "second $x"})]
    manifest = leader_worker_set("t", IMAGE, LwsNode(["serve"]), nodes, cards=1, environment={}, serving_port=8000,
                                 model_path="/m", rpc_port=4242)
    container = manifest["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    argv = [kubelet_expand(part, POD) for part in container["command"]]
    argv[0] = sys.executable
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True,
                          env={"LWS_WORKER_INDEX": "2", "PATH": "/usr/bin:/bin"})
    assert json.loads(done.stdout) == [["two words; rm -rf /", "$(LWS_LEADER_ADDRESS) $$", "--port=4242"],
                                       "second $x"]


def test_a_model_on_the_host_is_mounted_read_only_where_the_recipe_reads_it(tmp_path: Path) -> None:
    recipe = recipe_file(tmp_path)
    body = yaml.safe_load(recipe.read_text())
    body["model"] = {**body["model"], "path": "/models/tiny", "host_path": "/data/weights/tiny"}
    recipe.write_text(yaml.safe_dump(body))
    spec = lws(recipe).spec.leaderWorkerTemplate.leaderTemplate
    assert spec is not None
    volume = next(volume for volume in spec.spec.volumes if volume.name == "model")
    assert volume.hostPath is not None and volume.hostPath.path == "/data/weights/tiny"
    mount = next(mount for mount in spec.spec.containers[0].volumeMounts if mount.name == "model")
    assert mount.mountPath == "/models/tiny" and mount.readOnly


@pytest.mark.parametrize(("recipe", "says"), [
    ("demo-rope-longseq", "runs its engine on one host (no engine.nodes): a LeaderWorkerSet is for an engine "
                          "across nodes"),
    (str(DATA / "ray" / "demo-rope-longseq-two-nodes.yaml"), "launcher needs {probe}, bisect-npu's own package, "
                                                             "which a candidate's image does not hold"),
])
def test_what_a_leader_worker_set_cannot_run_is_refused_in_one_line(recipe: str, says: str) -> None:
    done = cli("lws", recipe, "--image", IMAGE)
    assert done.returncode == 2 and done.stdout == ""
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_readiness_probe_passes_only_once_health_answers() -> None:
    """The serving node's probe run for real against a server on loopback: not ready while
    nothing listens or /health fails, ready once it answers 200."""
    import http.server
    import threading

    healthy = threading.Event()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" and healthy.is_set() else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    port = free_port("127.0.0.1")
    manifest = leader_worker_set("t", IMAGE, LwsNode(["serve"]), [LwsNode(["rank"])], cards=1, environment={},
                                 serving_port=port, model_path="/m")
    probe = manifest["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["readinessProbe"]
    argv = [sys.executable, *probe["exec"]["command"][1:]]
    assert subprocess.run(argv, capture_output=True, timeout=30).returncode != 0  # nothing listens yet
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert subprocess.run(argv, capture_output=True, timeout=30).returncode != 0  # up, not healthy
        healthy.set()
        assert subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    finally:
        server.shutdown()
        server.server_close()
