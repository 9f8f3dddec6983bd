"""One engine across two Ray nodes, for real: a Ray cluster made in this process (a head without
cards and three nodes of one fake NPU each), the demo upstream bisected with every candidate's
engine on two of them (the demo server as the serving node, a headless rank on another, meeting
over torch.distributed's gloo), Ctrl-C and a node removed from the cluster in the middle of a
trial, and no process of any node left after each run. Marked `ray` (`make test-ray`); without Ray they fail
under CI=true and skip elsewhere. The cluster is shut down through its API, never `ray stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest
import yaml

from bisect_npu.demo.manifest import Manifest
from bisect_npu.execute.local import OWNER_ENV
from bisect_npu.execute.ray_nodes import NODE_ENV
from tests.helpers.paths import DATA
from tests.helpers.ray_cluster import local_ray_cluster

pytestmark = pytest.mark.ray

CLI = [sys.executable, "-m", "bisect_npu"]
RECIPE = DATA / "ray" / "demo-rope-longseq-two-nodes.yaml"
CASE = "rope-longseq"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A head that holds no card and three nodes of one NPU each: a two-node engine at a time,
    and a node to spare when one is taken away."""
    with local_ray_cluster(0, (1, 1, 1), "rn") as made:
        yield made


@pytest.fixture(scope="module")
def demo_upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path_factory.mktemp("ray-nodes-demo") / "upstream"
    return repo, generate_upstream(repo, seed=0)


# The test that moves the culprit's image name bisects a demo of a seed no other test uses: image
# names are per repository and commit, so on the seed-0 demo it would move the name under another
# tier's session bisecting the same commits on the same engine.
NAME_MOVER_SEED = 61


@pytest.fixture(scope="module")
def own_demo_upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path_factory.mktemp("ray-nodes-own-demo") / "upstream"
    return repo, generate_upstream(repo, seed=NAME_MOVER_SEED)


def bisect_argv(demo_upstream: tuple[Path, Manifest], recipe: Path, session: Path, *extra: str) -> list[str]:
    repo, manifest = demo_upstream
    truth = manifest.case(CASE)
    return [*CLI, "run", "--repo", str(repo), "--good", truth.good_ref, "--bad", truth.bad_ref, "--recipe",
            str(recipe), "--session", str(session), "--executor", "ray", "--no-fix", "--json", *extra]


def cli_env(cluster: Any) -> dict[str, str]:
    return {**os.environ, "RAY_ADDRESS": cluster.address}


def journal(session: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]


def _environ(pid: str) -> list[bytes]:
    try:
        return (Path("/proc") / pid / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def engine_node_processes() -> dict[int, str]:
    """Every live process of an engine node on this machine: pid -> its NODE_ENV ("INDEX RAY-NODE")."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            for item in _environ(entry.name):
                if item.startswith(f"{NODE_ENV}=".encode()):
                    found[int(entry.name)] = item.split(b"=", 1)[1].decode()
    return found


def owned_processes(session: Path) -> list[int]:
    mark, below = f"{OWNER_ENV}={session.resolve()}".encode(), f"{OWNER_ENV}={session.resolve()}/".encode()
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()
            and any(item == mark or item.startswith(below) for item in _environ(e.name))]


def assert_nothing_left(session: Path) -> None:
    """No process of any node of the session, no card held, no placement group left."""
    import ray
    from ray.util import placement_group_table

    total = ray.cluster_resources()["NPU"]
    deadline = time.monotonic() + 60
    while (owned_processes(session) or engine_node_processes() or ray.available_resources().get("NPU", 0) < total) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not owned_processes(session) and not engine_node_processes()
    assert ray.available_resources().get("NPU", 0) == total
    assert all(group["state"] == "REMOVED" for group in placement_group_table().values())


def probe_logs(session: Path, entries: list[dict[str, Any]]) -> list[str]:
    return [(session / e["log"]).read_text() for e in entries if e["type"] == "trial"]


def test_more_nodes_than_the_cluster_has_is_refused_before_any_build(
        cluster: Any, demo_upstream: tuple[Path, Manifest], tmp_path: Path) -> None:
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["engine"]["nodes"]["cards"] = 2
    wide = tmp_path / "two-cards.yaml"
    wide.write_text(yaml.safe_dump(recipe))
    done = subprocess.run(bisect_argv(demo_upstream, wide, tmp_path / "session"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=cli_env(cluster))
    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    assert ("spans 2 nodes of 2 NPU each, but the Ray cluster has 0 node(s) with 2 NPU or more (its nodes' NPU: "
            "1, 1, 1); missing: 2 node(s) with 2 NPU") in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "session" / "journal.jsonl").exists()
    listing = subprocess.run(["git", "-C", str(demo_upstream[0]), "worktree", "list"], capture_output=True,
                             text=True).stdout
    assert str(tmp_path) not in listing  # nothing was built


def test_demo_bisected_with_every_engine_on_two_nodes(cluster: Any, demo_upstream: tuple[Path, Manifest],
                                                     tmp_path: Path) -> None:
    _, manifest = demo_upstream
    session = tmp_path / "session"
    started = time.monotonic()
    done = subprocess.run(bisect_argv(demo_upstream, RECIPE, session), cwd=tmp_path, capture_output=True, text=True,
                          timeout=1200, env=cli_env(cluster))
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == manifest.case(CASE).culprit.sha
    entries = journal(session)
    logs = probe_logs(session, entries)
    assert logs and all("data parallel rank 1 of 2 joined" in log for log in logs)  # the headless node's log end
    served = [e for e in entries if e["type"] == "trial"]
    assert all(e["node"] for e in served)
    for step in (e for e in entries if e["type"] == "step" and e["trials"]):  # both nodes' builds journaled
        assert len({n["node"] for n in step["build"]["nodes"]}) == 2, step["build"]
    print(f"two-node bisection: {seconds:.1f} s, {sum(e['type'] == 'step' for e in entries)} steps")
    assert_nothing_left(session)


def test_a_failed_request_seen_before_its_killed_headless_node_is_the_node_lost(cluster: Any) -> None:
    """The headless rank removed under the serving one fails the request there, and the serving
    node's failed outcome may reach the driver before the headless node's end: the attempt is the
    node lost (retried), not the commit's failure. A headless node that ended on its own leaves
    the serving outcome as the commit's."""
    import ray

    from bisect_npu.execute.base import RunResult
    from bisect_npu.execute.ray import BatchOutcome
    from bisect_npu.execute.ray_nodes import NODE_LOST_EXIT, EngineAcrossNodes
    from bisect_npu.recipe.loader import load_recipe

    nodes = load_recipe(str(RECIPE)).engine.nodes
    assert nodes is not None
    failed = BatchOutcome("serving-node", [0], RunResult(returncode=1, seconds=1.0, log_path="probe.log",
                                                         log_tail="request failed: a data parallel rank is gone"),
                          {}, {"how": "reused"})
    placed = [("a" * 56, "10.0.0.1", 4000), ("b" * 56, "10.0.0.2", 4000)]

    @ray.remote(num_cpus=0)
    def ended_after(seconds: float, value: Any) -> Any:
        time.sleep(seconds)
        return value

    def outcome(headless_status: int) -> Any:
        engine = EngineAcrossNodes(nodes, "s", lambda node: None, lambda cards: None)
        return engine._outcome(ended_after.remote(0.0, failed), {ended_after.remote(2.0, headless_status): 1},
                               placed, "long-generation-t0", {"how": "reused"})

    lost = outcome(-9)
    assert lost.result.returncode == NODE_LOST_EXIT
    assert lost.result.log_tail == f"node 1 of the engine (ray node {'b' * 16}) was lost: its engine was killed by " \
                                   "signal 9"
    assert outcome(0).result.returncode == 1  # a headless rank that ended on its own: the commit's answer


def wait_for_headless(proc: subprocess.Popen[str]) -> str:
    """The Ray node of the first headless engine node that starts: "1 RAY-NODE-ID"."""
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        headless = [mark for mark in engine_node_processes().values() if mark.startswith("1 ")]
        if headless:
            return headless[0].split()[1]
        time.sleep(0.05)
    raise AssertionError("no headless node started")


def test_ctrl_c_mid_trial_tears_every_node_down(cluster: Any, demo_upstream: tuple[Path, Manifest],
                                                tmp_path: Path) -> None:
    session = tmp_path / "session"
    with subprocess.Popen(bisect_argv(demo_upstream, RECIPE, session), cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=cli_env(cluster)) as proc:
        wait_for_headless(proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-2000:]
    assert_nothing_left(session)


def test_a_node_removed_mid_trial_is_a_retried_host_failure(cluster: Any, demo_upstream: tuple[Path, Manifest],
                                                            tmp_path: Path) -> None:
    """The headless node's Ray node goes while its rank computes: the attempt is journaled as
    `node_lost` naming that node, the batch runs again on the two nodes left, the culprit is the
    same, nothing is left on any node. Last in the module: a node goes for good."""
    _, manifest = demo_upstream
    session = tmp_path / "session"
    by_id = {node.node_id: node for node in cluster.worker_nodes}
    with subprocess.Popen(bisect_argv(demo_upstream, RECIPE, session), cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=cli_env(cluster)) as proc:
        lost = by_id[wait_for_headless(proc)]
        cluster.remove_node(lost, allow_graceful=False)
        stdout, stderr = proc.communicate(timeout=1200)
    assert proc.returncode == 0, stdout + stderr[-3000:]
    assert json.loads(stdout.strip().splitlines()[-1])["culprit"] == manifest.case(CASE).culprit.sha
    entries = journal(session)
    retries = [e for e in entries if e["type"] == "retry"]
    assert retries and retries[0]["kind"] == "node_lost"
    assert f"node 1 of the engine (ray node {lost.node_id[:16]}) was lost" in retries[0]["cause"]
    trials = [(e["index"], e["case_id"], e["trial"]) for e in entries if e["type"] == "trial"]
    assert len(trials) == len(set(trials))  # the lost attempt reached no trial: none doubled
    assert_nothing_left(session)


def culprit_ends_in_containers(demo_upstream: tuple[Path, Manifest], tmp_path: Path) -> tuple[list[str], str]:
    """`run` over the culprit's parent and the culprit, each node in a container of the local
    podman on the host's network (its own free port: 8000 may be another test's); the culprit."""
    from bisect_npu.probe.ports import free_port

    repo, manifest = demo_upstream
    culprit = manifest.case(CASE).culprit.sha
    parent = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{culprit}^"], capture_output=True, text=True,
                            check=True).stdout.strip()
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["engine"]["port"] = free_port("127.0.0.1")
    on_host_network = tmp_path / "two-nodes.yaml"
    on_host_network.write_text(yaml.safe_dump(recipe))
    argv = [*CLI, "run", "--repo", str(repo), "--good", parent, "--bad", culprit, "--recipe", str(on_host_network),
            "--session", str(tmp_path / "session"), "--executor", "ray", "--node-executor", "docker", "--no-fix",
            "--json"]
    return argv, culprit


@pytest.mark.container
def test_the_culprit_and_its_parent_with_each_node_in_a_container(
        cluster: Any, demo_upstream: tuple[Path, Manifest], tmp_path: Path, docker_client: Any,
        demo_base_image: str) -> None:
    """--node-executor docker: each node builds (or reuses) the candidate's image through its own
    engine (here all talk to the local podman API, DOCKER_HOST) and runs its command in a container
    on the host's network, where the ranks meet over gloo. The culprit's parent and the culprit
    (the range's two ends, each judged on both nodes) keep the run short; no container is left."""
    from bisect_npu.builders.base import LABEL_COMMIT
    from bisect_npu.execute.docker import SESSION_LABEL
    from bisect_npu.journal import session_label

    argv, culprit = culprit_ends_in_containers(demo_upstream, tmp_path)
    session = tmp_path / "session"
    started = time.monotonic()
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=cli_env(cluster))
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == culprit
    entries = journal(session)
    logs = probe_logs(session, entries)
    assert len(logs) == 2 and all(log.splitlines()[1].startswith("# container ") for log in logs)  # serving node
    assert all("data parallel rank 1 of 2 joined" in log for log in logs)  # the headless container's log end
    for step in (e for e in entries if e["type"] == "step" and e["trials"]):  # each node's image, by its id
        nodes = step["build"]["nodes"]
        assert len({n["node"] for n in nodes}) == 2 and all(n["image"] for n in nodes), step["build"]
        for node in nodes:
            labels = docker_client.api.inspect_image(node["image_id"])["Config"]["Labels"]
            assert labels[LABEL_COMMIT] == step["commit"]
    print(f"two ends, each node in a container: {seconds:.1f} s")
    assert_nothing_left(session)
    label = f"{SESSION_LABEL}={session_label(session)}"
    assert docker_client.containers.list(all=True, filters={"label": label}) == []


def headless_container(docker_client: Any, label: str, commit: str) -> Any:
    """The running container of the engine's headless node (node 1) for `commit`, once its rank
    has joined the serving one; None before."""
    for container in docker_client.containers.list(filters={"label": [label, f"org.bisect-npu.commit={commit}"]}):
        env = container.attrs.get("Config", {}).get("Env") or []
        if any(item.startswith(f"{NODE_ENV}=1 ") for item in env) and \
                b"data parallel rank 1 of 2 joined" in container.logs():
            return container
    return None


@contextlib.contextmanager
def session_at_the_bad_end_s_node(argv: list[str], tmp_path: Path, cluster: Any, docker_client: Any, label: str,
                                  culprit: str) -> Iterator[tuple[subprocess.Popen[str], Any]]:
    """The session started, held once the bad end's headless node has joined: its process and
    that node's container."""
    with subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=cli_env(cluster)) as proc:
        deadline = time.monotonic() + 480
        while (victim := headless_container(docker_client, label, culprit)) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "the bad end's headless node never joined"
            time.sleep(0.2)
        yield proc, victim


@pytest.mark.container
def test_a_node_container_removed_during_the_bad_end_never_judges_it(
        cluster: Any, demo_upstream: tuple[Path, Manifest], tmp_path: Path, docker_client: Any,
        demo_base_image: str) -> None:
    """What another session's sweep or prune on the same engine does (`podman rm -f`): the headless
    node's container goes while the bad end's ranks compute. The attempt is the host's failure:
    the session either judges the bad end again on a whole engine of the culprit (its culprit
    named, the lost attempt journaled `node_lost`) or stops with exit 5; never a verdict from the
    broken attempt, never the bad end judged good (exit 4)."""
    from bisect_npu.execute.docker import SESSION_LABEL
    from bisect_npu.journal import session_label

    argv, culprit = culprit_ends_in_containers(demo_upstream, tmp_path)
    session = tmp_path / "session"
    label = f"{SESSION_LABEL}={session_label(session)}"
    with session_at_the_bad_end_s_node(argv, tmp_path, cluster, docker_client, label, culprit) as (proc, victim):
        victim.remove(force=True)
        stdout, stderr = proc.communicate(timeout=600)
    entries = journal(session)
    assert proc.returncode in (0, 5), stdout + stderr[-3000:]
    bad_end = [e for e in entries if e["type"] == "step" and e["commit"] == culprit]
    assert all(e["verdict"]["kind"] != "good" for e in bad_end), bad_end
    if proc.returncode == 0:
        assert json.loads(stdout.strip().splitlines()[-1])["culprit"] == culprit
        retries = [e for e in entries if e["type"] == "retry"]
        assert retries and retries[0]["kind"] == "node_lost", retries
        # The retry ran the culprit's own image on both ranks, not whatever its name held.
        retried = (session / bad_end[0]["trials"][0]["log"]).read_text()
        container = next(line for line in retried.splitlines() if line.startswith("# container "))
        assert f":commit-{culprit[:12]} (image " in container, container
        image = container.rsplit("(image ", 1)[1].rstrip(")")
        assert docker_client.images.get(image).labels["org.bisect-npu.commit"] == culprit
        assert "data parallel rank 1 of 2 joined" in retried
    assert_nothing_left(session)
    assert docker_client.containers.list(all=True, filters={"label": label}) == []


@pytest.mark.container
def test_the_bad_end_s_name_moved_to_another_commit_s_image_during_the_retry_never_judges_it(
        cluster: Any, own_demo_upstream: tuple[Path, Manifest], tmp_path: Path, docker_client: Any,
        demo_base_image: str) -> None:
    """The collision as it was met: a node's container removed under the bad end's run, and the
    bad end's image name (`bisect-npu/<repo>:commit-<sha>`, shared by every session on the engine)
    pointed at another commit's image while the retry starts (here the parent's, named again and
    again as a racing build of the same key would). Started by that name, both ranks run the
    parent and agree with the reference: the bad end judged good, exit 4. The retry must run the
    culprit's own image or stop with exit 5."""
    import threading

    from bisect_npu.builders.docker import image_repository
    from bisect_npu.execute.docker import SESSION_LABEL
    from bisect_npu.journal import session_label

    argv, culprit = culprit_ends_in_containers(own_demo_upstream, tmp_path)
    repository = image_repository(git.Repo(own_demo_upstream[0]))
    parent = git.Repo(own_demo_upstream[0]).commit(culprit).parents[0].hexsha
    session = tmp_path / "session"
    label = f"{SESSION_LABEL}={session_label(session)}"
    stop = threading.Event()

    def name_the_parent() -> None:
        while not stop.wait(0.02):
            with contextlib.suppress(Exception):
                docker_client.api.tag(parent_image, repository, f"commit-{culprit[:12]}")

    with session_at_the_bad_end_s_node(argv, tmp_path, cluster, docker_client, label, culprit) as (proc, victim):
        own_image = victim.attrs["Image"]
        parent_image = docker_client.images.get(f"{repository}:commit-{parent[:12]}").id
        mover = threading.Thread(target=name_the_parent, daemon=True)
        mover.start()
        victim.remove(force=True)
        try:
            stdout, stderr = proc.communicate(timeout=600)
        finally:
            stop.set()
            mover.join()
            with contextlib.suppress(Exception):  # the name back on the culprit's image, for whoever comes next
                docker_client.api.tag(own_image, repository, f"commit-{culprit[:12]}")
    entries = journal(session)
    bad_end = [e for e in entries if e["type"] == "step" and e["commit"] == culprit]
    assert proc.returncode in (0, 5), stdout + stderr[-3000:]
    assert all(e["verdict"]["kind"] != "good" for e in bad_end), bad_end
    if proc.returncode == 5:
        assert f"now holds commit {parent[:12]}, not the candidate {culprit[:12]}" in stderr, stderr[-3000:]
    else:
        assert json.loads(stdout.strip().splitlines()[-1])["culprit"] == culprit
    assert_nothing_left(session)
    assert docker_client.containers.list(all=True, filters={"label": label}) == []


@pytest.mark.container
def test_an_image_gone_at_a_headless_nodes_start_is_acquired_again_on_every_node(
        cluster: Any, one_commit_upstream: tuple[Path, str], docker_client: Any, tmp_path: Path) -> None:
    """The candidate's image removed between the nodes' acquires and the headless node's container
    start (another session's prune on that node's engine): the node's ImageGone reaches the
    driver's evaluator through Ray's wrapping and the actor's, the evaluator acquires the commit
    again, and the retry is a new engine that acquires it anew on every node and runs from an
    image of the commit, not the one removed (the nodes share one engine here: built again, or a
    build of the same commit by the other node named again); the step's build log says why,
    naming the node. The serving node's probe is a `true` in the candidate's container and the
    headless rank a sleep: the test is about the images, not the model."""
    import functools
    import uuid

    from bisect_npu.builders.base import LABEL_COMMIT
    from bisect_npu.builders.docker import DockerBuilder
    from bisect_npu.execute.base import RunResult, probe_log_path, probe_stem
    from bisect_npu.execute.docker import SESSION_LABEL, DockerExecutor
    from bisect_npu.execute.ray import RayExecutor, RemoteBuilds, cluster_nodes
    from bisect_npu.execute.ray_nodes import EngineAcrossNodes
    from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
    from bisect_npu.recipe.loader import load_recipe

    path, commit = one_commit_upstream
    once = tmp_path / "removed"  # every node is on this machine: the first headless start on any of them removes
    session = f"test-{uuid.uuid4().hex[:8]}"
    recipe_data = yaml.safe_load(RECIPE.read_text())
    recipe_data["engine"]["launcher"] = ["sleep", "300"]  # then the node's flags: a rank that never ends on its own
    recipe_file = tmp_path / "two-nodes.yaml"
    recipe_file.write_text(yaml.safe_dump(recipe_data))
    recipe = load_recipe(str(recipe_file))
    assert recipe.engine.nodes is not None

    class RemovedBeforeItsStart(DockerExecutor):  # local, so Ray sends it by value to the nodes
        def spawn(self, env: Any, argv: list[str], log_path: Path, extra_env: dict[str, str] | None = None) -> Any:
            try:
                made = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return super().spawn(env, argv, log_path, extra_env)
            removed = self.client.api.inspect_image(env.image)["Id"]
            os.write(made, removed.encode())
            os.close(made)
            self.client.api.remove_image(removed, force=True)
            return super().spawn(env, argv, log_path, extra_env)

        def run_probe(self, env: Any, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
            stem = probe_stem(request.get("case_id", "default"), request.get("trial", 0))
            return self.run_command(env, ["true"], probe_log_path(out_dir, stem), timeout_s)

    def builder(node_id: str) -> DockerBuilder:
        import docker

        return DockerBuilder(git.Repo(path), docker.from_env())

    def executor(cards: list[int]) -> DockerExecutor:
        import docker

        return RemovedBeforeItsStart(docker.from_env(), session_id=session)

    across = functools.partial(EngineAcrossNodes, recipe.engine.nodes, session, builder, executor)
    ray_executor = RayExecutor(cluster.address, 1, session, builder, executor, across)
    started = time.monotonic()
    try:
        step = Evaluator(RemoteBuilds(DockerBuilder(git.Repo(path), docker_client)), ray_executor,
                         tmp_path / "session", recipe=recipe).evaluate(EvaluationRequest(commit, trials=1))
    finally:
        ray_executor.close()
    print(f"an engine on two nodes, its image gone once: {time.monotonic() - started:.1f} s")
    removed = once.read_text()
    nodes = step.build.nodes
    assert len({n.node for n in nodes}) == 2, step.build
    for node in nodes:  # each node's container from an image of the commit made again, not the one removed
        assert node.image_id != removed and node.how in {"built", "reused"}, step.build
        assert docker_client.api.inspect_image(node.image_id)["Config"]["Labels"][LABEL_COMMIT] == commit
    log = Path(step.build.log or "").read_text()
    assert log.startswith("# acquired again (where it runs next) before its run: Ray node "), log
    seen = log.removeprefix("# acquired again (where it runs next) before its run: Ray node ")[:12]
    assert seen in {node.node_id[:12] for node in cluster_nodes(1)}, log  # the headless node of the first engine
    assert f"image {DockerBuilder(git.Repo(path), docker_client).tag(commit)} is gone from the engine" in log, log
    label = f"{SESSION_LABEL}={session}"
    assert docker_client.containers.list(all=True, filters={"label": label}) == []
