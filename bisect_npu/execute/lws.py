"""One candidate's engine across nodes as a Kubernetes LeaderWorkerSet, for sites that schedule
their NPUs through Kubernetes instead of Ray.

LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) starts a group of `size` pods: one leader, then
`size - 1` workers from one shared template, each told the leader's address (`LWS_LEADER_ADDRESS`)
and its own index (`LWS_WORKER_INDEX`, 1 and up). The serving node is the leader; the headless
nodes are the workers, in the recipe's order. Each node's argument list is the one `recipes show`
and `plan` print, its values filled by what the pod has: `{master_ip}` the leader's address,
`{local_ip}` the pod's IP (the downward API), `{rpc_port}` a fixed port (every pod has its own
network namespace, so any port is free there). Where the headless nodes' commands or environments
differ (each its own `--data-parallel-start-rank`), the worker starts a small Python dispatcher
that execs the argument list of its `LWS_WORKER_INDEX`: still an exec of a list, never a shell.

Every string from the recipe has its `$` doubled: Kubernetes expands `$(NAME)` in a container's
command and environment, and `$$` is its escape for one literal `$`.

The NPUs come from the Ascend device plugin as an extended resource (limits = requests = the
node's cards; the plugin adds each `/dev/davinciN` and the management devices); the driver's files
are mounted read-only from the host as the docker spec mounts them (`ascend.DRIVER_MOUNTS`), and
/dev/shm is a memory-backed volume. The group restarts whole when one pod fails
(RecreateGroupOnPodRestart), and the workers start with the leader, not after it is ready
(LeaderCreated): the serving node is healthy only once every headless rank has joined.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bisect_npu.execute.ascend import DRIVER_MOUNTS, npu_run_env

API_VERSION = "leaderworkerset.x-k8s.io/v1"
NPU_RESOURCE = "huawei.com/Ascend910"  # the Ascend device plugin's resource name for Atlas 800 / A2 cards
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
POD_IP_ENV = "BISECT_NPU_POD_IP"
DEFAULT_RPC_PORT = 13389
SHM_SIZE = "16Gi"
READY_PERIOD_S = 10
READY_FAILURES = 3  # failed checks in a row before a ready serving node is marked not ready again
_PLACEHOLDER = re.compile(r"\{(local_ip|master_ip|rpc_port)\}")
_NOT_A_LABEL_CHAR = re.compile(r"[^a-z0-9-]+")
# The worker's entry when headless nodes differ: the JSON argument after it maps each
# LWS_WORKER_INDEX to its node's argument list and environment.
DISPATCH = ("import json, os, sys; node = json.loads(sys.argv[1])[os.environ['LWS_WORKER_INDEX']]; "
            "os.execvpe(node['argv'][0], node['argv'], {**os.environ, **node['env']})")


@dataclass(frozen=True)
class LwsNode:
    """One node as `plan` shows it: its command with {local_ip}, {master_ip}, {rpc_port} unfilled,
    and its own environment."""

    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)


def label(text: str) -> str:
    """`text` as a Kubernetes name (DNS-1123 label: lowercase letters, digits, '-', at most 63)."""
    return _NOT_A_LABEL_CHAR.sub("-", text.lower()).strip("-")[:63].rstrip("-") or "bisect-npu"


def escaped(text: str) -> str:
    """`text` as Kubernetes passes it on: no `$(NAME)` of it expanded."""
    return text.replace("$", "$$")


def filled(text: str, rpc_port: int) -> str:
    """One argument with LWS's values in place of bisect-npu's ({master_ip}, {local_ip}, {rpc_port})."""
    values = {"master_ip": f"$({LEADER_ADDRESS_ENV})", "local_ip": f"$({POD_IP_ENV})", "rpc_port": str(rpc_port)}
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], escaped(text))


def _env_list(environment: Mapping[str, str]) -> list[dict[str, Any]]:
    pod_ip = {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    return [pod_ip, *({"name": name, "value": escaped(value)} for name, value in environment.items())]


def _volumes(model_host_path: str | None, model_path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts of them: the driver's files, /dev/shm, the model."""
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for path in DRIVER_MOUNTS:
        name = label(path)
        volumes.append({"name": name, "hostPath": {"path": path}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    if model_host_path is not None:
        volumes.append({"name": "model", "hostPath": {"path": model_host_path, "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": model_path, "readOnly": True})
    return volumes, mounts


def leader_worker_set(name: str, image: str, serving: LwsNode, headless: Sequence[LwsNode], *, cards: int,
                      environment: Mapping[str, str], serving_port: int, model_path: str,
                      model_host_path: str | None = None, npu_resource: str = NPU_RESOURCE,
                      rpc_port: int = DEFAULT_RPC_PORT, host: str | None = None) -> dict[str, Any]:
    """The LeaderWorkerSet manifest (a dict, for YAML) of one engine on 1 + len(headless) pods.

    `environment` is every node's (the recipe's), set over the determinism switches and those of
    the `host` type as on a docker run; each node's own environment over it.
    """
    common = {**npu_run_env(host), **environment}

    def pod(container: dict[str, Any], role: str) -> dict[str, Any]:
        """A pod template around `container`: the NPUs, the volumes and their mounts (its own
        copies, so the YAML spells each pod out instead of pointing at the leader's)."""
        volumes, mounts = _volumes(model_host_path, model_path)
        resources = {"limits": {npu_resource: cards}, "requests": {npu_resource: cards}}
        return {"metadata": {"labels": {"bisect-npu/role": role}},
                "spec": {"containers": [{**container, "resources": resources, "volumeMounts": mounts}],
                         "volumes": volumes}}

    health = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{serving_port}/health', timeout=5)"
    leader = {
        "name": "serving", "image": image, "command": [filled(part, rpc_port) for part in serving.command],
        "env": _env_list({**common, **serving.environment}),
        "readinessProbe": {"exec": {"command": ["python3", "-c", health]}, "periodSeconds": READY_PERIOD_S,
                           "failureThreshold": READY_FAILURES},
    }
    workers = [([filled(part, rpc_port) for part in node.command], node.environment) for node in headless]
    if all(worker == workers[0] for worker in workers):
        command, worker_env = workers[0][0], {**common, **workers[0][1]}
    else:
        table = {str(index): {"argv": argv, "env": {key: escaped(value) for key, value in env.items()}}
                 for index, (argv, env) in enumerate(workers, start=1)}
        command, worker_env = ["python3", "-c", DISPATCH, json.dumps(table)], common
    worker = {"name": "headless", "image": image, "command": command, "env": _env_list(worker_env)}
    return {
        "apiVersion": API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": label(name), "labels": {"app.kubernetes.io/managed-by": "bisect-npu"}},
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": 1 + len(headless),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod(leader, "serving"),
                "workerTemplate": pod(worker, "headless"),
            },
        },
    }
