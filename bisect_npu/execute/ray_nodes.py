"""An engine across several Ray nodes: one candidate's batch with every node of its engine.

A recipe's `engine.nodes` names the nodes. For each batch the driver reserves them together: a
placement group of one bundle per node, `cards` NPUs each, STRICT_SPREAD (two nodes of one engine
never share a host). On each bundle an `EngineNode` actor builds or reuses the candidate through
its node's builder, then the headless nodes start with the serving node's address (`{master_ip}`)
and a port chosen free there (`{rpc_port}`), and the serving node runs the probe, whose server is
the serving node's command (`{local_ip}` its own address). Every process is started from an
argument list, never a shell. With `--node-executor docker` each node builds or reuses the
candidate's image through its own container engine and runs its command (the headless one, or
the probe with the serving one) in a container of it, as `--executor docker` does on the node's
cards, but on the host's network: the ranks meet on the node's address and the chosen port.

A node that dies (its process, its actor, its Ray node) ends the attempt: every node is torn down
and the batch comes back failed with a line naming the node (`node 1 of the engine (ray node
ab12...) was lost: ...`), which the evaluator's retry policy reads as the host's failure, not the
commit's, and journals before it runs the batch again on a fresh placement. Success, failure,
timeout and Ctrl-C all end in the same teardown: the actors stop their processes (remove their
containers), are killed, and the placement group is removed. A node's container that exits
killed, or is removed under it, is that node lost, also where the serving node's failed request
(its rank gone) is seen first. The retry is a new engine: new actors, the candidate acquired
again on each node, each container started from the image id that carries the candidate's commit
label (execute/docker.py's `candidate_image`), so no node runs another commit's build.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from bisect_npu.builders.base import BuildFailed, Environment
from bisect_npu.builders.failures import BuildUnreachable
from bisect_npu.errors import UsageError
from bisect_npu.execute.base import RunResult, probe_log_path, probe_stem
from bisect_npu.execute.docker import PROBE_PACKAGE as DOCKER_PROBE_PACKAGE
from bisect_npu.execute.docker import PROBE_PATH_BOOTSTRAP, DockerExecutor, NodeContainer
from bisect_npu.execute.local import LocalExecutor, stop_run
from bisect_npu.execute.ray import (
    BUILD_LOG,
    RESOURCE,
    UNREACHABLE,
    BatchOutcome,
    build_said,
    node_build,
    node_builds,
    own_error,
    seen_on,
    small_files,
)
from bisect_npu.observations import SKIP_EXIT
from bisect_npu.recipe.schema import NodesSpec
from bisect_npu.records import NodeBuild

PLACE_TIMEOUT_S = 300.0  # how long a placement of every node may wait for cards to free up
STOP_TIMEOUT_S = 60.0
LOST_GRACE_S = 10.0  # how long a failed serving node's outcome waits for a headless node's end to be seen
NODE_LOST_EXIT = 75  # a batch whose engine lost a node: the host's failure (EX_TEMPFAIL)
NODE_ENV = "BISECT_NPU_ENGINE_NODE"  # in each node's processes: "INDEX RAY-NODE-ID", so a test can find them
DEFAULT_LAUNCHER = ["vllm", "serve", "{model}"]
PROBE_PACKAGE = "bisect_npu.probe"


def node_lost_line(index: int, node_id: str, what: str) -> str:
    """The line the retry policy reads (orchestration/running/infrastructure.py's `node_lost`)."""
    return f"node {index} of the engine (ray node {node_id[:16]}) was lost: {what}"


def launcher_argv(request: dict[str, Any], python: str, probe: str = PROBE_PACKAGE) -> list[str]:
    """The engine's launcher as a node runs it ({model}, {python}, {probe} filled: the probe's
    package as the node imports it, another name in a container)."""
    engine = request.get("engine", {})
    launcher = engine.get("launcher") or DEFAULT_LAUNCHER
    return [part.format(model=request["model"]["path"], python=python, port="", probe=probe)
            for part in launcher]


def headless_command(executor: LocalExecutor | DockerExecutor, env: Environment, request: dict[str, Any],
                     flags: list[str]) -> list[str]:
    """A headless node's argument list: the launcher ({python} the worktree's interpreter, or the
    image's with the probe's package under its container name, found through PROBE_PATH_BOOTSTRAP),
    then the node's filled flags."""
    if isinstance(executor, DockerExecutor):
        argv = [*launcher_argv(request, executor.python, DOCKER_PROBE_PACKAGE), *flags]
        launcher = request.get("engine", {}).get("launcher") or DEFAULT_LAUNCHER
        if any("{probe}" in part for part in launcher):
            return [executor.python, "-c", PROBE_PATH_BOOTSTRAP, *argv]
        return argv
    return [*launcher_argv(request, env.python or sys.executable), *flags]


def node_environment(environment: dict[str, str], index: int, node_id: str) -> dict[str, str]:
    """A node's own environment (over the recipe's) and its mark (NODE_ENV)."""
    return {**environment, NODE_ENV: f"{index} {node_id}"}


def serving_request(request: dict[str, Any], flags: list[str], environment: dict[str, str], index: int,
                    node_id: str) -> dict[str, Any]:
    """The probe's request on the serving node: its server started with the node's filled flags
    and environment."""
    engine = {**request.get("engine", {}), "server_flags": flags,
              "server_env": node_environment(environment, index, node_id)}
    return {**request, "engine": engine}


def node_side(executor: Any) -> LocalExecutor | DockerExecutor:
    """The executor a node of an engine across hosts runs on: the node's worktree as it is, or
    its container engine on the host's network (the ranks meet on the node's own address)."""
    if isinstance(executor, DockerExecutor):
        return executor.on_host_network()
    if isinstance(executor, LocalExecutor):
        return executor
    raise UsageError(f"an engine across nodes runs with --node-executor local or docker, not {type(executor).__name__}")


class LocalNode:
    """A headless node's process in the node's worktree (LocalExecutor.spawn's), as a container is one."""

    def __init__(self, executor: LocalExecutor, process: subprocess.Popen[bytes], mark: str) -> None:
        self.executor = executor
        self.process = process
        self.mark = mark

    def wait(self) -> int:
        return self.process.wait()

    def stop(self) -> None:
        stop_run(self.process, self.mark, self.executor.stop_grace_s)


class EngineNode:
    """One node of one engine start (a Ray actor in its bundle, holding the bundle's cards)."""

    def __init__(self, index: int, session_id: str, builder_factory: Callable[[str], Any],
                 executor_factory: Callable[[list[int]], Any]) -> None:
        import ray

        context = ray.get_runtime_context()
        self.index = index
        self.node_id = context.get_node_id()
        self.cards = sorted(int(card) for card in context.get_accelerator_ids().get(RESOURCE, []))
        self.builds = node_builds(session_id, self.node_id, builder_factory)
        self.executor = node_side(executor_factory(self.cards))
        self.scratch = Path(tempfile.mkdtemp(prefix="bisect-npu-node-"))
        self.env: Environment | None = None
        self.headless: LocalNode | NodeContainer | None = None
        self.log_path = self.scratch / "node.log"

    def place(self) -> tuple[str, str, int]:
        """This node's Ray id, its address, and a port free on it now."""
        import ray

        from bisect_npu.probe.ports import free_port

        node_address: Callable[[], str] = ray.util.get_node_ip_address  # untyped in Ray
        address = node_address()
        return self.node_id, address, free_port(address)

    def prepare(self, commit: str) -> dict[str, Any]:
        """Build or reuse the candidate here; what became of it ("how": built, reused, failed, ...)."""
        import ray

        try:
            self.env = ray.get(self.builds.acquire.remote(commit, str(self.scratch / "build")))
        except BuildUnreachable as unreachable:
            return {"how": UNREACHABLE, "cause": unreachable.failure.cause,
                    "next_step": unreachable.failure.next_step}
        except BuildFailed as failure:
            return {"how": "failed", "error": str(failure), "log_tail": failure.log_tail}
        return build_said(self.env)

    def start(self, request: dict[str, Any], flags: list[str], environment: dict[str, str]) -> str | None:
        """Start this node's engine process headless (its rank waits for the serving node); the id
        of the image its container started from (None: a process in the node's worktree)."""
        assert self.env is not None
        here = node_environment(environment, self.index, self.node_id)
        argv = headless_command(self.executor, self.env, request, flags)
        with self.log_path.open("w", encoding="utf-8") as log:
            log.write(f"# node {self.index} headless on ray node {self.node_id} cards "
                      f"{','.join(map(str, self.cards))}: {argv}\n")
            log.flush()
            if isinstance(self.executor, LocalExecutor):
                self.headless = LocalNode(self.executor, *self.executor.spawn(self.env, argv, log, here))
        if isinstance(self.executor, DockerExecutor):
            with seen_on(self.node_id):
                self.headless = self.executor.spawn(self.env, argv, self.log_path, here)
            return self.headless.image_id
        return None

    def wait(self) -> int:
        """Until the headless process (or container) ends: its exit status, negative when the
        host's doing ended it (a signal, its container removed)."""
        assert self.headless is not None
        return self.headless.wait()

    def serve(self, request: dict[str, Any], flags: list[str], environment: dict[str, str],
              timeout_s: float) -> Any:
        """The probe on this node, its server the serving node's command; the batch's outcome."""
        assert self.env is not None
        out_dir = self.scratch / "serve"
        with seen_on(self.node_id):
            result = self.executor.run_probe(self.env, serving_request(request, flags, environment, self.index,
                                                                       self.node_id), out_dir, timeout_s)
        return BatchOutcome(self.node_id, self.cards, result, small_files(out_dir), build_said(self.env),
                            [node_build(self.node_id, self.env, result)])

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> str:
        """Stop every process this node started (the probe and its server, the headless engine);
        give the candidate back to the node's builder. The headless log's end, for the driver."""
        self.executor.stop_runs()
        if self.headless is not None:
            self.headless.stop()
        if self.env is not None:
            with contextlib.suppress(Exception):
                self.builds.release.remote(self.env)
            self.env = None
        tail = self.log_tail()
        shutil.rmtree(self.scratch, ignore_errors=True)
        return tail


class EngineAcrossNodes:
    """The driver's side of one batch on every node of the engine (see the module text)."""

    def __init__(self, nodes: NodesSpec, session_id: str, builder_factory: Callable[[str], Any],
                 executor_factory: Callable[[list[int]], Any]) -> None:
        self.nodes = nodes
        self.session_id = session_id
        self.builder_factory = builder_factory
        self.executor_factory = executor_factory
        self.actors: list[Any] = []
        self.group: Any = None

    def run(self, commit: str, request: dict[str, Any], timeout_s: float) -> Any:
        """The batch's outcome (a BatchOutcome); a lost node is a failed outcome naming it. Every
        node is torn down before this returns or raises; the headless nodes' log ends follow the
        probe log."""
        stem = probe_stem(request.get("case_id", "default"), request.get("trial", 0))
        try:
            outcome = self._attempt(commit, request, timeout_s, stem)
        except BaseException:
            self.teardown()
            raise
        tails = self.teardown()
        log = probe_log_path(Path("."), stem).name
        if tails and log in outcome.files:
            content, written = outcome.files[log]
            outcome.files[log] = (content + "".join(f"\n# the end of a headless node's log\n{tail}\n"
                                                    for tail in tails).encode(), written)
        return outcome

    def _attempt(self, commit: str, request: dict[str, Any], timeout_s: float, stem: str) -> Any:
        import ray

        placed = self._place()
        if isinstance(placed, str):
            return self._failed(stem, "", f"the engine did not start: {placed}", NODE_LOST_EXIT)
        master = placed[self.nodes.serving]
        builds = ray.get([actor.prepare.remote(commit) for actor in self.actors])
        for index, build in enumerate(builds):
            if build["how"] == UNREACHABLE:  # the driver raises it where builds are retried
                return BatchOutcome(placed[index][0], [], RunResult(returncode=SKIP_EXIT, seconds=0.0,
                                    log_path=BUILD_LOG, log_tail=build["cause"]), {BUILD_LOG: (b"", 0.0)}, build)
            if build["how"] == "failed":  # the commit's own build: every trial a skip
                return self._failed(stem, master[0], f"build failed on node {index}: {build['error']}\n"
                                    f"{build.get('log_tail', '')}", SKIP_EXIT, build)
        waits = {}
        images: dict[int, str | None] = {}  # headless node -> the image id its container started from
        for index in self.nodes.headless():
            node = self.nodes.each[index]
            try:
                images[index] = ray.get(self.actors[index].start.remote(
                    request, node.filled(placed[index][1], master[1], master[2]), node.environment))
            except ray.exceptions.RayTaskError as exc:
                if (cause := own_error(exc)) is not None:
                    raise cause from None  # its own one line (the candidate's image gone or renamed: exit 5)
                raise
            except ray.exceptions.RayError as exc:  # its actor or its node died
                return self._lost(index, placed, f"its Ray actor or node died ({type(exc).__name__})", stem,
                                  builds[self.nodes.serving])
            waits[self.actors[index].wait.remote()] = index
        serving = self.nodes.each[self.nodes.serving]
        serve_ref = self.actors[self.nodes.serving].serve.remote(
            request, serving.filled(master[1], master[1], master[2]), serving.environment, timeout_s)
        outcome = self._outcome(serve_ref, waits, placed, stem, builds[self.nodes.serving])
        return replace(outcome, nodes=[
            *(NodeBuild(node=placed[index][0], how=builds[index]["how"], seconds=builds[index]["seconds"],
                        image=builds[index]["image"], image_id=image) for index, image in images.items()),
            *outcome.nodes])  # the serving node's own, where it ran the probe

    def _place(self) -> list[tuple[str, str, int]] | str:
        """Reserve every node and start its actor: each node's (ray id, address, free port), or
        why the cluster did not place them in time."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = [{RESOURCE: float(self.nodes.cards)} for _ in self.nodes.each]
        self.group = placement_group(bundles, strategy="STRICT_SPREAD")
        try:
            ray.get(self.group.ready(), timeout=PLACE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            return (f"the Ray cluster did not place its {self.nodes.count} nodes of {self.nodes.cards} "
                    f"{RESOURCE} within {PLACE_TIMEOUT_S:.0f}s (a node gone, or its cards still held)")
        actor = ray.remote(EngineNode)
        self.actors = [actor.options(num_cpus=0, resources={RESOURCE: float(self.nodes.cards)},
                                     max_concurrency=4, max_restarts=0,
                                     scheduling_strategy=PlacementGroupSchedulingStrategy(
                                         self.group, placement_group_bundle_index=index))
                       .remote(index, self.session_id, self.builder_factory, self.executor_factory)
                       for index in range(self.nodes.count)]
        places: list[tuple[str, str, int]] = ray.get([actor.place.remote() for actor in self.actors])
        return places

    def _outcome(self, serve_ref: Any, waits: dict[Any, int], placed: list[tuple[str, str, int]], stem: str,
                 build: dict[str, Any]) -> BatchOutcome:
        """The serving node's outcome, unless a node is lost first (then a failed one naming it)."""
        import ray

        pending = [serve_ref, *waits]
        while True:
            done, pending = ray.wait(pending, num_returns=1)
            ref = done[0]
            if ref is serve_ref or ref == serve_ref:
                try:
                    outcome: BatchOutcome = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    if (cause := own_error(exc)) is not None:
                        raise cause from None
                    return self._lost(self.nodes.serving, placed, str(exc).splitlines()[0], stem, build)
                except ray.exceptions.RayError as exc:  # its actor or its node died
                    return self._lost(self.nodes.serving, placed, type(exc).__name__, stem, build)
                if outcome.result.returncode != 0 and (lost := self._lost_meanwhile(waits, placed, stem, build)):
                    return lost
                return outcome
            index = waits[ref]
            try:
                returncode = ray.get(ref)
            except ray.exceptions.RayError as exc:
                return self._lost(index, placed, f"its Ray actor or node died ({type(exc).__name__})", stem, build)
            if returncode < 0:  # killed: the host's doing (the engine's own crash exits > 0, as the serving
                return self._lost(index, placed, f"its engine was killed by signal {-returncode}", stem, build)
            # A headless rank that ended on its own (rank 0 went, or its own code failed): the serving
            # node's outcome, whatever it is, is the commit's.

    def _lost_meanwhile(self, waits: dict[Any, int], placed: list[tuple[str, str, int]], stem: str,
                        build: dict[str, Any]) -> BatchOutcome | None:
        """A failed serving outcome whose engine lost a node first: the node lost (the host's
        failure, retried), not the commit's failure. A headless rank removed under the serving
        one fails the request there, and the serving node may report before the headless node's
        end is seen: each headless node gets LOST_GRACE_S to say how it ended."""
        import ray

        ended, _ = ray.wait(list(waits), num_returns=len(waits), timeout=LOST_GRACE_S)
        for ref in ended:
            try:
                returncode = ray.get(ref)
            except ray.exceptions.RayError as exc:
                return self._lost(waits[ref], placed, f"its Ray actor or node died ({type(exc).__name__})", stem,
                                  build)
            if returncode < 0:
                return self._lost(waits[ref], placed, f"its engine was killed by signal {-returncode}", stem, build)
        return None

    def _lost(self, index: int, placed: list[tuple[str, str, int]], what: str, stem: str,
              build: dict[str, Any]) -> BatchOutcome:
        node_id = placed[index][0]
        return self._failed(stem, placed[self.nodes.serving][0], node_lost_line(index, node_id, what),
                            NODE_LOST_EXIT, build)

    def _failed(self, stem: str, node_id: str, text: str, returncode: int,
                build: dict[str, Any] | None = None) -> BatchOutcome:
        log = probe_log_path(Path("."), stem).name
        result = RunResult(returncode=returncode, seconds=0.0, log_path=log, log_tail=text.splitlines()[0])
        return BatchOutcome(node_id, [], result, {log: (text.encode() + b"\n", time.time())},
                            build or {"how": "none"})

    def teardown(self) -> list[str]:
        """Every node's processes stopped, its actor killed, the placement removed; the headless
        nodes' log ends (for the probe log)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        tails = []
        stops = [actor.stop.remote() for actor in self.actors]
        for index, ref in enumerate(stops):
            try:
                tail = ray.get(ref, timeout=STOP_TIMEOUT_S)
                if tail and index != self.nodes.serving:
                    tails.append(tail)
            except ray.exceptions.RayError:
                pass  # its node is gone, with its processes
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
        self.actors, self.group = [], None
        return tails
