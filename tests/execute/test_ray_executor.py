"""`--executor ray` on a real Ray cluster of three nodes made in this process (fake NPU resources
8, 8 and 16): the demo bisected with k-ary search over the nodes, a node removed mid-batch, the
engine sizes each node holds. Marked `ray` (`make test-ray`); without Ray they fail under CI=true
and skip elsewhere. The cluster is shut down through its API: never `ray stop`, which would kill
every Ray process on the machine.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bisect_npu.demo.manifest import Manifest
from bisect_npu.errors import UsageError
from bisect_npu.execute.local import OWNER_ENV
from tests.helpers.ray_cluster import local_ray_cluster

pytestmark = pytest.mark.ray

NODE_NPUS = (8, 8, 16)
CLI = [sys.executable, "-m", "bisect_npu"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Three Ray nodes in this process: a head and two more, each with its fake NPUs."""
    with local_ray_cluster(NODE_NPUS[0], NODE_NPUS[1:], "rt") as made:
        yield made


@pytest.fixture(scope="module")
def demo_upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path_factory.mktemp("ray-demo") / "upstream"
    return repo, generate_upstream(repo, seed=0)


def bisect_argv(demo_upstream: tuple[Path, Manifest], name: str, session: Path, *extra: str) -> list[str]:
    repo, manifest = demo_upstream
    truth = manifest.case(name)
    return [*CLI, "run", "--repo", str(repo), "--good", truth.good_ref, "--bad", truth.bad_ref, "--recipe",
            truth.recipe, "--session", str(session), "--executor", "ray", "--no-fix", "--json", *extra]


def cli_env(cluster: Any) -> dict[str, str]:
    return {**os.environ, "RAY_ADDRESS": cluster.address}


def journal(session: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]


def nodes_of_runs(session: Path, entries: list[dict[str, Any]]) -> set[str]:
    """The node of each trial as the journal records it, which its probe log's first line names too."""
    trials = [e for e in entries if e["type"] == "trial"]
    for trial in trials:
        assert trial["node"] and (session / trial["log"]).read_text().startswith(f"# ray node {trial['node']} cards ")
    return {trial["node"] for trial in trials}


def steps_name_their_nodes(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each step that ran journals what its nodes ran (its build's `nodes`), every node its trials
    went to among them, the step's `how` theirs (not the driver's placeholder); those builds."""
    ran = []
    for step in (e for e in entries if e["type"] == "step" and e["trials"]):
        nodes = step["build"]["nodes"]
        assert {t["node"] for t in step["trials"] if t.get("node")} <= {n["node"] for n in nodes}, step
        assert step["build"]["how"] in {n["how"] for n in nodes} <= {"built", "overlay", "reused"}
        ran += [{**n, "commit": step["commit"]} for n in nodes]
    assert ran
    return ran


def assert_no_trial_doubled(entries: list[dict[str, Any]]) -> None:
    trials = [(e["index"], e["case_id"], e["trial"]) for e in entries if e["type"] == "trial"]
    assert trials and len(trials) == len(set(trials))


def test_engines_per_node_never_span_two_nodes() -> None:
    from bisect_npu.execute.ray import check_engines, engines_per_node

    with pytest.raises(UsageError, match=r"runs on 16 cards .* largest node of the Ray cluster has 8 NPU"):
        check_engines({"a": 8, "b": 8, "c": 8}, 16)
    assert engines_per_node({"a": 16, "b": 16}, 16) == {"a": 1, "b": 1}
    assert check_engines({"a": 16, "b": 16}, 16) == 2
    assert engines_per_node({"a": 8, "b": 8, "c": 16}, 8) == {"a": 1, "b": 1, "c": 2}
    with pytest.raises(UsageError, match="no node with NPU"):
        check_engines({}, 1)


def test_a_ray_address_nothing_answers_on_is_refused_at_once(tmp_path: Path) -> None:
    """Ray's own connect retries an address with no cluster behind it for minutes, printing its
    warnings: the run says it in one line at once instead, exit 5; an address that is no
    HOST:PORT is the user's, exit 2."""
    import socket

    from bisect_npu.errors import UsageError
    from bisect_npu.execute.ray import check_reachable
    from tests.helpers.gitrepo import make_linear_repo

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    shas = make_linear_repo(tmp_path / "up", 3)
    started = time.monotonic()
    done = subprocess.run([*CLI, "run", "--repo", str(tmp_path / "up"), "--good", shas[0], "--bad", shas[-1], "--cmd",
                           "true", "--executor", "ray", "--ray-address", f"127.0.0.1:{port}", "--session",
                           str(tmp_path / "session")], capture_output=True, text=True, timeout=120, check=False,
                          env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert done.returncode == 5, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"bisect-npu: error: no Ray cluster answers at 127.0.0.1:{port} (Connection refused); start it (`ray start "
        "--head --port 6379` on one host, `ray start --address HEAD:6379` on the others) and pass its head's "
        "HOST:PORT with --ray-address or RAY_ADDRESS")
    assert "rpc_client" not in done.stderr and time.monotonic() - started < 60
    with pytest.raises(UsageError, match=r"Ray address '10\.0\.0\.1' is not HOST:PORT"):
        check_reachable("10.0.0.1")
    check_reachable("auto")  # Ray's own search for a local cluster, and its words


def test_cluster_engines_follow_each_nodes_cards(cluster: Any) -> None:
    from bisect_npu.execute.ray import cluster_nodes, settle_slots

    assert sorted(n.npus for n in cluster_nodes(16)) == sorted(NODE_NPUS)
    assert sorted(n.engines for n in cluster_nodes(16)) == [0, 0, 1]  # a TP 16 engine: only the 16-card node
    assert settle_slots(cluster.address, 16, None) == 1
    assert settle_slots(cluster.address, 1, None) == sum(NODE_NPUS)
    with pytest.raises(UsageError, match="--slots 3 but the Ray cluster holds 1 engine"):
        settle_slots(cluster.address, 16, 3)


def test_engine_larger_than_every_node_is_refused_before_anything_runs(
        cluster: Any, demo_upstream: tuple[Path, Manifest], tmp_path: Path) -> None:
    from bisect_npu.recipe.loader import load_recipe

    _, manifest = demo_upstream
    recipe = yaml.safe_load(Path(load_recipe(manifest.case("rope-longseq").recipe).source or "").read_text())
    recipe["engine"]["args"] = {"tensor_parallel_size": 32}
    wide = tmp_path / "tp32.yaml"
    wide.write_text(yaml.safe_dump(recipe))
    argv = bisect_argv(demo_upstream, "rope-longseq", tmp_path / "session")
    argv[argv.index("--recipe") + 1] = str(wide)
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env(cluster))
    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    assert "runs on 32 cards" in done.stderr and "largest node of the Ray cluster has 16 NPU" in done.stderr
    assert not (tmp_path / "session" / "journal.jsonl").exists()


def test_demo_bisected_over_the_nodes_finds_the_manifest_culprit(
        cluster: Any, demo_upstream: tuple[Path, Manifest], tmp_path: Path) -> None:
    _, manifest = demo_upstream
    session = tmp_path / "session"
    done = subprocess.run(bisect_argv(demo_upstream, "rope-longseq", session, "--slots", "3"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env=cli_env(cluster))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["culprit"] == manifest.case("rope-longseq").culprit.sha
    entries = journal(session)
    assert entries[0]["request"]["executor"]["executor"] == "ray" and entries[0]["request"]["executor"]["slots"] == 3
    assert_no_trial_doubled(entries)
    assert len(nodes_of_runs(session, entries)) >= 2  # spread over the nodes
    ran = steps_name_their_nodes(entries)
    assert all(n["image"] is None and n["image_id"] is None for n in ran)  # worktrees
    assert any(n["how"] != "reused" for n in ran)  # a fresh session's worktrees: made on the nodes
    spans = sorted((e["t"] - e["seconds"], e["t"]) for e in entries if e["type"] == "step")
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))  # k-ary: candidates at once


def test_doctor_lists_the_nodes_their_npus_engines_and_container_engines(cluster: Any, tmp_path: Path) -> None:
    from bisect_npu.recipe.loader import bundled_recipes, load_recipe

    done = subprocess.run([*CLI, "doctor", "--executor", "ray"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=cli_env(cluster))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert f"ray cluster: 3 node(s), {sum(NODE_NPUS)} NPU(s)" in done.stdout
    nodes = [line for line in done.stdout.splitlines() if "engines per recipe" in line]
    assert sorted(int(line.split("NPU(s)")[0].split()[-1]) for line in nodes) == sorted(NODE_NPUS)
    size = load_recipe(bundled_recipes()["demo-rope-longseq"]).cards_per_run()
    assert all(f"demo-rope-longseq {int(line.split('NPU(s)')[0].split()[-1]) // size}" in line for line in nodes)
    assert sum("container engine:" in line for line in done.stdout.splitlines()) == 3
    from bisect_npu import __version__

    assert sum(line.startswith("OK") and line.endswith(f" bisect-npu: {__version__}")
               for line in done.stdout.splitlines()) == 3  # each node's own version, asked there
    assert "ready for --executor ray" in done.stdout


@pytest.mark.container
def test_demo_bisected_in_each_nodes_containers(cluster: Any, demo_upstream: tuple[Path, Manifest], tmp_path: Path,
                                                docker_client: Any, demo_base_image: str) -> None:
    """--node-executor docker: each node builds the candidate's image with its own engine (here
    all talk to the local podman API, DOCKER_HOST) and runs the probe in a container of it."""
    from bisect_npu.builders.base import LABEL_COMMIT
    from bisect_npu.execute.docker import SESSION_LABEL
    from bisect_npu.journal import session_label

    _, manifest = demo_upstream
    session = tmp_path / "session"
    done = subprocess.run(bisect_argv(demo_upstream, "rope-longseq", session, "--slots", "3", "--node-executor",
                                      "docker"), cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env=cli_env(cluster))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == manifest.case("rope-longseq").culprit.sha
    entries = journal(session)
    assert_no_trial_doubled(entries)
    assert len(nodes_of_runs(session, entries)) >= 2
    logs = {(session / e["log"]).read_text().splitlines()[1] for e in entries if e["type"] == "trial"}
    assert all(line.startswith("# container ") for line in logs)  # DockerExecutor's own first line
    for built in steps_name_their_nodes(entries):  # each node's image: the id its containers started from
        labels = docker_client.api.inspect_image(built["image_id"])["Config"]["Labels"]
        assert labels[LABEL_COMMIT] == built["commit"] and built["image"]
    label = f"{SESSION_LABEL}={session_label(session)}"
    assert docker_client.containers.list(all=True, filters={"label": label}) == []


def _probe_node(owner: str, raylets: dict[int, Any]) -> tuple[Any, dict[str, Any]] | None:
    """A running probe of session `owner` on a worker node: that node and the probe's request."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"{OWNER_ENV}={owner}".encode() not in environ or b"bisect_npu.probe" not in cmdline:
            continue
        pid = int(entry.name)
        while pid > 1:
            if pid in raylets:
                try:
                    return raylets[pid], json.loads(Path(cmdline.split(b"\0")[3].decode()).read_text())
                except (OSError, IndexError, ValueError):
                    return None
            try:
                pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                break
    return None


def _owned_pids(owner: str) -> list[int]:
    """The processes a session marked as its own (probes, and builds: under the session), on any
    node of this machine."""
    mark, below = f"{OWNER_ENV}={owner}".encode(), f"{OWNER_ENV}={owner}/".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(item == mark or item.startswith(below) for item in environ):
                pids.append(int(entry.name))
    return pids


def _start_and_wait_for_a_probe(argv: list[str], cwd: Path, cluster: Any, session: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(cluster))
    deadline = time.monotonic() + 600
    while not _owned_pids(str(session.resolve())):
        assert proc.poll() is None and time.monotonic() < deadline, "no probe started"
        time.sleep(0.05)
    return proc


def _assert_nothing_left(session: Path, repo: Path) -> None:
    """No process of the session, no task holding cards, no builder actor, no worktree."""
    import ray

    total = ray.cluster_resources()["NPU"]
    deadline = time.monotonic() + 60
    while (_owned_pids(str(session.resolve())) or ray.available_resources().get("NPU", 0) < total) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _owned_pids(str(session.resolve()))
    assert ray.available_resources().get("NPU", 0) == total
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if "bisect-npu" in str(a)]
    listing = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert str(session.resolve()) not in listing


def test_ctrl_c_cancels_the_tasks_and_leaves_nothing(cluster: Any, demo_upstream: tuple[Path, Manifest],
                                                   tmp_path: Path) -> None:
    session = tmp_path / "session"
    proc = _start_and_wait_for_a_probe(bisect_argv(demo_upstream, "rope-longseq", session, "--slots", "3"),
                                       tmp_path, cluster, session)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    _assert_nothing_left(session, demo_upstream[0])


def test_sigkilled_driver_then_resume_finds_the_culprit(cluster: Any, demo_upstream: tuple[Path, Manifest],
                                                        tmp_path: Path) -> None:
    """The killed driver's probes outlive it on their nodes; resume stops them, then finishes."""
    _, manifest = demo_upstream
    session = tmp_path / "session"
    proc = _start_and_wait_for_a_probe(bisect_argv(demo_upstream, "rope-longseq", session, "--slots", "3"),
                                       tmp_path, cluster, session)
    proc.kill()
    proc.communicate(timeout=60)
    done = subprocess.run([*CLI, "resume", "--session", str(session), "--json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900, env=cli_env(cluster))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == manifest.case("rope-longseq").culprit.sha
    assert_no_trial_doubled(journal(session))
    _assert_nothing_left(session, demo_upstream[0])


def test_a_node_with_another_bisect_npu_is_refused_before_anything_runs(
        cluster: Any, demo_upstream: tuple[Path, Manifest], tmp_path: Path) -> None:
    """A node whose Python imports another bisect-npu (a 0.0.1 first on its PYTHONPATH) joins the
    cluster: the run stops as the host's failure (exit 5) naming that node, both versions and what
    to do, before any trial runs."""
    from bisect_npu import __version__

    other = tmp_path / "other" / "bisect_npu"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text('__version__ = "0.0.1"\n')
    odd = cluster.add_node(num_cpus=1, object_store_memory=80 << 20, resources={"NPU": 8},
                           env_vars={"PYTHONPATH": str(other.parent)})
    session = tmp_path / "session"
    try:
        cluster.wait_for_nodes()
        done = subprocess.run(bisect_argv(demo_upstream, "rope-longseq", session), cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, env=cli_env(cluster))
        doctor = subprocess.run([*CLI, "doctor", "--executor", "ray"], cwd=tmp_path, capture_output=True, text=True,
                                timeout=300, env=cli_env(cluster))
    finally:
        cluster.remove_node(odd)
    # doctor shows the same node as the problem, with the run's next step
    assert doctor.returncode == 5, doctor.stdout + doctor.stderr[-2000:]
    assert (f"MISSING               node {odd.node_id[:12]} bisect-npu: 0.0.1, this driver {__version__}: a node "
            "with another version can run a probe differently") in doctor.stdout
    assert f"fix: install bisect-npu {__version__} in the Python that node's Ray runs" in doctor.stdout
    assert f"not ready for --executor ray: node {odd.node_id[:12]} bisect-npu" in doctor.stdout
    assert done.returncode == 5, done.stdout + done.stderr[-3000:]
    assert f"Ray node {odd.node_id[:16]} " in done.stderr
    assert f"has bisect-npu 0.0.1, this driver {__version__}" in done.stderr and "bisect-npu resume" in done.stderr
    assert not (session / "journal.jsonl").exists() or not [e for e in journal(session) if e["type"] == "trial"]


def test_node_lost_mid_batch_reruns_elsewhere(cluster: Any, demo_upstream: tuple[Path, Manifest],
                                              tmp_path: Path) -> None:
    """Last in the module: it takes a node away for good."""
    _, manifest = demo_upstream
    session = tmp_path / "session"
    raylets = {node.all_processes["raylet"][0].process.pid: node for node in cluster.worker_nodes}
    with subprocess.Popen(bisect_argv(demo_upstream, "rope-longseq", session, "--slots", "3"), cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(cluster)) as proc:
        found = None
        deadline = time.monotonic() + 600
        while found is None and proc.poll() is None and time.monotonic() < deadline:
            found = _probe_node(str(session.resolve()), raylets)
            if found is None:
                time.sleep(0.05)
        assert found is not None, "no probe ran on a worker node"
        lost, request = found
        cluster.remove_node(lost, allow_graceful=False)
        stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stdout + stderr[-3000:]
    assert json.loads(stdout.strip().splitlines()[-1])["culprit"] == manifest.case("rope-longseq").culprit.sha
    entries = journal(session)
    assert_no_trial_doubled(entries)
    rerun = [e for e in entries if e["type"] == "trial" and e["case_id"] == request["case_id"]
             and e["trial"] == request["trial"] and e["log"].startswith(f"steps/{request['commit'][:12]}/")]
    assert len(rerun) == 1 and rerun[0]["observation"]  # the interrupted batch ran again, once, to the end
    assert nodes_of_runs(session, rerun) != {lost.node_id}


def test_a_command_oracle_runs_on_the_nodes(cluster: Any, tmp_path: Path) -> None:
    """`--cmd` over the cluster: each run a one-CPU task on some node, its worktree made there;
    the log comes back with the node named, the verdicts give git bisect's culprit."""
    from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo

    shas = make_linear_repo(tmp_path / "up", 12, culprit=7)
    session = tmp_path / "session"
    done = subprocess.run([*CLI, "run", "--repo", str(tmp_path / "up"), "--good", shas[0], "--bad", shas[-1],
                           "--cmd", " ".join(GOOD_CMD), "--executor", "ray", "--session", str(session), "--no-fix",
                           "--json"], env=cli_env(cluster), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[7]
    trials = [e for e in journal(session) if e["type"] == "trial"]
    assert trials and all((session / t["log"]).read_text().startswith("# ray node ") for t in trials)
    steps_name_their_nodes(journal(session))



def test_a_build_on_a_node_that_fails_on_the_network_is_retried_and_journaled(
        cluster: Any, demo_upstream: tuple[Path, Manifest], tmp_path: Path) -> None:
    """The nodes' build first fetches a package from an index that is down: the node sends the
    failure back, the driver's evaluator journals a build retry and builds again once it answers."""
    import functools
    import http.server
    import threading

    from tests.builders.test_build_retries import QuietHandler, free_port, package_index, session_recipe

    port = free_port()
    repo, manifest = demo_upstream
    truth = manifest.case("rope-longseq")
    session = tmp_path / "session"
    argv = [*CLI, "run", "--repo", str(repo), "--good", truth.good_ref, "--bad", truth.bad_ref, "--recipe",
            str(session_recipe(tmp_path, truth.recipe, port)), "--session", str(session), "--executor", "ray",
            "--no-fix", "--no-verdict-store", "--json"]
    run = subprocess.Popen(argv, cwd=tmp_path, env=cli_env(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    deadline = time.monotonic() + 300
    while not _retry_journaled(session):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.2)
    handler = functools.partial(QuietHandler, directory=str(package_index(tmp_path / "index")))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)  # the outage ends
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out, err = run.communicate(timeout=600)
    finally:
        server.shutdown()
        server.server_close()
    assert run.returncode == 0, out[-2000:] + err[-3000:]
    summary = next(line for line in reversed(out.splitlines()) if line.startswith("{"))  # after Ray's own lines
    assert json.loads(summary)["culprit"] == truth.culprit.sha
    retries = [e for e in journal(session) if e["type"] == "retry"]
    assert retries and {(r["stage"], r["kind"]) for r in retries} == {("build", "network")}
    assert all(f"could not reach 127.0.0.1:{port}" in r["cause"] and "(on Ray node " in r["cause"] for r in retries)
    assert all((session / r["log"]).is_file() for r in retries)  # the node's build log came back


def test_a_node_s_own_error_reaches_the_driver_as_its_one_line(cluster: Any) -> None:
    """bisect-npu's own error raised in a task on a node (a pin venv that cannot be built there:
    exit 5), also one raised through a call inside the task, is that error on the driver, not
    Ray's traceback around it; anything else is left to Ray."""
    import ray

    from bisect_npu.execute.ray import check_engines, own_error

    with pytest.raises(UsageError) as here:
        check_engines({"node": 8}, 16)
    direct = ray.remote(check_engines).options(num_cpus=0).remote({"node": 8}, 16)
    nested = ray.remote(lambda refs: ray.get(refs[0])).options(num_cpus=0).remote([direct])
    for ref in (direct, nested):
        with pytest.raises(ray.exceptions.RayTaskError) as raised:
            ray.get(ref)
        found = own_error(raised.value)
        assert type(found) is UsageError and str(found) == str(here.value)
    with pytest.raises(ray.exceptions.RayTaskError) as other:
        ray.get(ray.remote(lambda: 1 / 0).options(num_cpus=0).remote())
    assert own_error(other.value) is None


def test_ray_s_own_failure_inside_a_batch_is_one_line_not_a_traceback(cluster: Any) -> None:
    """A batch that Ray itself could not finish (here an actor it called is gone: a builder's
    actor killed, or its node lost past the task's retries) is the host's failure: one line that
    names it and what to do (exit 5), where it was a traceback (exit 1, "a bug"). A bug of ours on
    the node stays a traceback."""
    import uuid

    import ray

    from bisect_npu.errors import InfrastructureError
    from bisect_npu.execute.ray import RayExecutor

    class Nothing:  # local, so Ray sends it by value to the nodes
        def sweep(self) -> int:
            return 0

        def close(self) -> None:
            """Nothing held."""

    def nothing(_: Any) -> Nothing:
        return Nothing()

    class Gone:
        def ping(self) -> int:
            return 1

    actor = ray.remote(Gone).options(num_cpus=0).remote()
    ray.kill(actor)
    calls_it = ray.remote(lambda handle: ray.get(handle.ping.remote())).options(num_cpus=0, max_retries=0)
    executor = RayExecutor(cluster.address, 1, f"test-{uuid.uuid4().hex[:8]}", nothing, nothing)
    try:
        with pytest.raises(InfrastructureError, match=r"^the Ray task of c0ffeec0ffee ended without a result "
                                                      r"\(ActorDiedError: .*`ray status`.*`bisect-npu resume`"):
            executor._outcome("c0ffee" * 6 + "beef", calls_it.remote(actor))
        with pytest.raises(ray.exceptions.RayTaskError, match="ZeroDivisionError"):
            executor._outcome("c0ffee" * 6 + "beef", ray.remote(lambda: 1 / 0).options(num_cpus=0).remote())
    finally:
        executor.close()


def test_a_batch_no_alive_node_can_hold_any_more_is_refused_not_waited_for(
        cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The nodes that held the recipe's engine lost mid-run, the next batch would wait for one
    forever (Ray keeps an infeasible task pending, silently): the run says so in one line, exit 5,
    and the task is cancelled. Here an engine of 32 NPUs, more than any node of the cluster has."""
    import uuid

    import ray

    from bisect_npu.builders.base import Environment
    from bisect_npu.errors import InfrastructureError
    from bisect_npu.execute import ray as ray_executor_module
    from bisect_npu.execute.ray import RayExecutor

    class Nothing:  # local, so Ray sends it by value to the nodes
        def sweep(self) -> int:
            return 0

    def nothing(_: Any) -> Nothing:
        return Nothing()

    monkeypatch.setattr(ray_executor_module, "CAPACITY_CHECK_S", 0.5)
    executor = RayExecutor(cluster.address, 32, f"test-{uuid.uuid4().hex[:8]}", nothing, nothing)
    started = time.monotonic()
    try:
        with pytest.raises(InfrastructureError, match=r"^the batch of c0ffeec0ffee waits for a Ray node with 32 NPU "
                                                      r"and no alive node .*`bisect-npu resume`"):
            executor.run_probe(Environment(kind="worktree", commit="c0ffee" * 6 + "beef"), {}, tmp_path / "out", 60)
    finally:
        executor.close()
    assert time.monotonic() - started < 30
    assert ray.available_resources().get("NPU", 0) == ray.cluster_resources()["NPU"]  # nothing holds a card


def _retry_journaled(session: Path) -> bool:
    """Whether the journal, as far as it is written, holds a retry (its last line may be half done)."""
    path = session / "journal.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            if json.loads(line).get("type") == "retry":
                return True
        except json.JSONDecodeError:
            continue
    return False


@pytest.mark.container
def test_an_image_removed_on_its_node_before_its_run_is_built_again(
        cluster: Any, one_commit_upstream: tuple[Path, str], docker_client: Any, tmp_path: Path) -> None:
    """A candidate's image removed on its node between the node's acquire and its run (another
    session's prune there): the ImageGone raised in the Ray task reaches the driver's evaluator as
    ImageGone through Ray's wrapping, which acquires the commit again, and the next batch builds it
    again on its node and runs: a cache miss, not exit 5, in the step's build log as on one host,
    with the node that saw it."""
    import uuid

    import git

    from bisect_npu.builders.docker import DockerBuilder
    from bisect_npu.execute.docker import DockerExecutor
    from bisect_npu.execute.ray import RayExecutor, RemoteBuilds, cluster_nodes
    from bisect_npu.observations import VerdictKind
    from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator

    path, commit = one_commit_upstream
    once = tmp_path / "removed"  # every node is on this machine: the first acquire on any of them removes
    session = f"test-{uuid.uuid4().hex[:8]}"

    class RemovedOnce(DockerBuilder):  # local, so Ray sends it by value to the nodes
        def acquire(self, commit: str, log_dir: Path) -> Any:
            env = super().acquire(commit, log_dir)
            try:
                os.close(os.open(once, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return env
            self.client.api.remove_image(self.client.api.inspect_image(env.image)["Id"], force=True)
            return env

    def builder(node_id: str) -> RemovedOnce:
        import docker

        return RemovedOnce(git.Repo(path), docker.from_env())

    def executor(cards: list[int]) -> DockerExecutor:
        import docker

        return DockerExecutor(docker.from_env(), session_id=session)

    ray_executor = RayExecutor(cluster.address, 1, session, builder, executor)
    try:
        step = Evaluator(RemoteBuilds(DockerBuilder(git.Repo(path), docker_client)), ray_executor,
                         tmp_path / "session", command=["true"]).evaluate(EvaluationRequest(commit, trials=1))
    finally:
        ray_executor.close()
    assert once.exists()
    assert step.verdict.kind == VerdictKind.GOOD, step.verdict.reason
    assert [node.how for node in step.build.nodes] == ["built"]
    # The step's build log says why it was built again, naming the node that found the image gone.
    log = (tmp_path / "session" / "steps" / commit[:12] / f"build-{commit[:12]}.log").read_text()
    assert step.build.log and Path(step.build.log).read_text() == log
    seen = log.removeprefix("# acquired again (where it runs next) before its run: Ray node ")[:12]
    assert seen in {node.node_id[:12] for node in cluster_nodes(1)}, log
    assert log.endswith("is gone from the engine; a cache miss\n"), log
