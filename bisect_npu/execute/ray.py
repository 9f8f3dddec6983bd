"""RayExecutor: one bisection over several Ascend hosts, each candidate trial batch a Ray task.

A batch asks Ray for the recipe's engine size in `NPU` (and no CPU): Ray picks a node that has
the cards free and hands the task their ids. On that node the task builds or reuses the
candidate through the node's own builder (a named actor per node and session, holding the
worktrees or the images there) and runs the probe with the same single-host executor as
`--executor local|docker`, on the cards Ray gave it. The observations and the probe log come back
as bytes and the driver writes them into the session: only the driver writes the journal.

Locality: a candidate's later batches go to the node that ran it first (soft affinity: another
node when that one is gone). Faults: a node lost mid-batch fails the task as a system failure and
Ray reruns it elsewhere (`max_retries`); nothing of the lost attempt reaches the session, so no
trial is lost or doubled; a batch no alive node can hold any more, or one Ray could not finish,
stops the run in one line (exit 5). A candidate's image gone on its node (ImageGone) names the
node and reaches the driver's evaluator, which acquires the commit again and writes the miss into
the step's build log. `close()` cancels what runs and sweeps every node; `sweep()` stops what
a SIGKILLed earlier driver of this session left (its processes and containers, by the session's
mark), on every node.

What ran: each batch sends back its node's build (how it was made there, and for a container the
image id it started from, checked to carry the candidate's commit label), which the step's
journaled build lists (`RunResult.nodes`). Versions: joining the cluster, every node is asked
which bisect-npu its Python imports, and one with another version than the driver's is refused
(`check_versions`): it would run the probe with its own code.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_npu import __version__
from bisect_npu.builders.base import Builder, BuildFailed, Environment, ImageGone
from bisect_npu.builders.failures import BuildUnreachable, EnvironmentFailure
from bisect_npu.errors import BisectError, InfrastructureError, UsageError
from bisect_npu.execute.base import Executor, RunResult, probe_log_path, probe_stem, run_node_path
from bisect_npu.observations import SKIP_EXIT
from bisect_npu.recipe.schema import NodesSpec
from bisect_npu.records import NodeBuild

NAMESPACE = "bisect-npu"  # the driver's and its builder actors' (named actors are found per namespace)
RESOURCE = "NPU"  # the resource name Ray gives Ascend cards (ray/_private/accelerators/npu.py)
TASK_RETRIES = 3  # reruns of a batch whose node (or worker) died under it
CAPACITY_CHECK_S = 30.0  # how often a waiting batch checks that an alive node still holds its engine

# What a node makes its builder and its executors with (orchestration/opening/environments.py's, pickled by reference).
BuilderFactory = Callable[[str], Builder]  # node id -> that node's builder
ExecutorFactory = Callable[[list[int]], Executor]  # the cards of one run -> an executor on them


@dataclass(frozen=True)
class NodeEngines:
    """One node of the cluster and how many engines of one size its cards hold."""

    node_id: str
    address: str
    npus: int
    engines: int


def engines_per_node(npus: dict[str, int], per_run: int) -> dict[str, int]:
    """How many engines of `per_run` cards each node holds (an engine never spans two nodes)."""
    return {node: count // per_run for node, count in npus.items()}


def check_engines(npus: dict[str, int], per_run: int) -> int:
    """The engines the whole cluster holds; refuses a cluster where no node holds one engine."""
    if not npus:
        raise UsageError(f"the Ray cluster has no node with {RESOURCE} resources; start each Ascend host's "
                         f"Ray node so that it sees its cards (`ray start ... --resources '{{\"{RESOURCE}\": 8}}'` "
                         "where Ray cannot count them), or check `bisect-npu doctor --executor ray`")
    engines = sum(engines_per_node(npus, per_run).values())
    if not engines:
        raise UsageError(f"the recipe's engine runs on {per_run} cards (its parallel sizes multiplied) but the "
                         f"largest node of the Ray cluster has {max(npus.values())} {RESOURCE}; an engine never "
                         "spans two nodes: add a node with enough cards or shrink the engine")
    return engines


def check_nodes(npus: dict[str, int], nodes: NodesSpec) -> int:
    """Engines of `nodes.count` nodes x `nodes.cards` NPUs the cluster holds at once; a cluster
    that cannot hold one is refused, naming what is missing."""
    fit = {node: count // nodes.cards for node, count in npus.items() if count >= nodes.cards}
    if len(fit) < nodes.count:
        sizes = ", ".join(str(n) for n in sorted(npus.values(), reverse=True)) or "none"
        raise UsageError(f"the recipe's engine spans {nodes.count} nodes of {nodes.cards} NPU each, but the Ray "
                         f"cluster has {len(fit)} node(s) with {nodes.cards} NPU or more (its nodes' NPU: {sizes}); "
                         f"missing: {nodes.count - len(fit)} node(s) with {nodes.cards} NPU: start them with "
                         "`ray start --address HEAD:6379` on more hosts, or shrink the engine")
    engines = 0
    left = dict(fit)
    while len([n for n in left.values() if n]) >= nodes.count:  # each engine on the nodes with most room
        for node in sorted(left, key=lambda n: -left[n])[:nodes.count]:
            left[node] -= 1
        engines += 1
    return engines


REACH_TIMEOUT_S = 10.0  # how long the head's address may take to accept a connection
START_CLUSTER = ("start it (`ray start --head --port 6379` on one host, `ray start --address HEAD:6379` on the "
                 "others) and pass its head's HOST:PORT with --ray-address or RAY_ADDRESS")


def connect(address: str | None) -> None:
    """Join the cluster at `address` (else RAY_ADDRESS, else a local one) once per process; an
    address nothing answers on is refused at once (Ray itself would retry it for minutes)."""
    import ray

    if ray.is_initialized():
        return
    given = address or os.environ.get("RAY_ADDRESS") or None
    if given:
        check_reachable(given)
    try:
        ray.init(address=given, namespace=NAMESPACE, log_to_driver=False,
                 include_dashboard=False if not given else None)
    except ConnectionError as exc:  # "auto" with no cluster found, a head that went meanwhile
        raise InfrastructureError(f"no Ray cluster at {given or 'this host'} ({str(exc).splitlines()[0][:200]}); "
                                  f"{START_CLUSTER}") from None


def check_reachable(address: str) -> None:
    """Refuses a cluster address (`HOST:PORT` of the head) that accepts no connection within
    REACH_TIMEOUT_S, naming it; "auto", "local" and `ray://` client addresses are left to Ray."""
    import ray

    if address.startswith("ray://") or address in ("auto", "local"):
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"Ray address {address!r} is not HOST:PORT: give the head's (`--ray-address HEAD:6379`, "
                         "6379 unless its `ray start --head --port` said otherwise)")
    host = host.strip("[]")
    if host in ("localhost", "127.0.0.1", "::1"):  # as Ray connects to it: this host's own address
        node_address: Callable[[], str] = ray.util.get_node_ip_address  # untyped in Ray
        host = node_address()
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise InfrastructureError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); "
                                  f"{START_CLUSTER}") from None


def cluster_nodes(per_run: int) -> list[NodeEngines]:
    """The alive nodes with their NPUs and the engines of `per_run` cards each holds."""
    import ray

    list_nodes: Callable[[], list[dict[str, Any]]] = ray.nodes  # untyped in Ray
    nodes = []
    for node in list_nodes():
        if not node.get("Alive"):
            continue
        npus = int(node.get("Resources", {}).get(RESOURCE, 0))
        nodes.append(NodeEngines(node["NodeID"], node.get("NodeManagerAddress", ""), npus, npus // per_run))
    return nodes


def settle_slots(address: str | None, per_run: int, slots: int | None, nodes: NodesSpec | None = None) -> int:
    """Slots for `--executor ray`: by default the engines the cluster holds; never more engines
    than that, never an engine larger than every node, nor one across more nodes than the cluster
    has with its cards (refused before anything runs or builds)."""
    connect(address)
    npus = {n.node_id: n.npus for n in cluster_nodes(per_run) if n.npus}
    if nodes is not None:
        if not npus:
            check_engines(npus, per_run)
        engines = check_nodes(npus, nodes)
    else:
        engines = check_engines(npus, per_run)
    if slots and slots > engines:
        raise UsageError(f"--slots {slots} but the Ray cluster holds {engines} engine(s) of {per_run} card(s); "
                         f"use --slots {engines} or fewer")
    return slots or engines


def node_engine() -> str:
    """The Ray task that names its node's container engine (the docker SDK's DOCKER_HOST), or why
    there is none: a node runs `--executor docker`-style batches only with one."""
    import docker

    try:
        version = docker.from_env(timeout=10).version()
    except Exception as exc:  # any failure to reach it is the answer
        return f"none ({str(exc).splitlines()[0][:100] if str(exc) else type(exc).__name__})"
    name = next((c.get("Name", "") for c in version.get("Components", []) if c.get("Name")), "engine")
    return f"{name} {version.get('Version', '?')} at {os.environ.get('DOCKER_HOST', 'the default socket')}"


def _ask_every_node(question: Callable[[], str]) -> dict[str, str]:
    """``question``'s answer on each alive node, run there; "unknown (...)" where a node did not
    answer in two minutes."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(question)
    refs = {node.node_id: task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        node.node_id, soft=False)).remote() for node in cluster_nodes(1)}
    answers = {}
    for node_id, ref in refs.items():
        try:
            answers[node_id] = ray.get(ref, timeout=120)
        except ray.exceptions.RayError as exc:
            answers[node_id] = f"unknown (the node did not answer: {type(exc).__name__})"
    return answers


def node_engines() -> dict[str, str]:
    """Each alive node's container engine, asked on the node itself."""
    return _ask_every_node(node_engine)


def node_versions() -> dict[str, str]:
    """Each alive node's bisect-npu version, asked on the node itself: "none" where it has none,
    "unknown (...)" where the node did not answer."""

    def installed() -> str:
        # Nested, so Ray sends it by value: a node whose bisect-npu lacks this module's names (or has
        # none) still runs it.
        try:
            import bisect_npu
        except ImportError:
            return "none"
        return str(getattr(bisect_npu, "__version__", "none"))

    return _ask_every_node(installed)


def other_versions(versions: dict[str, str], driver: str = __version__) -> dict[str, str]:
    """The nodes that run another bisect-npu than the driver (or none), by node id; a node that did
    not answer is left to its batches (they fail there as a node's failure)."""
    return {node: version for node, version in sorted(versions.items())
            if version != driver and not version.startswith("unknown")}


VERSION_RISK = "a node with another version can run a probe differently"  # why another version is refused


def version_next_step(driver: str = __version__) -> str:
    """What to do about a node of another bisect-npu version (the run's refusal and doctor's row say it)."""
    return (f"install bisect-npu {driver} in the Python that node's Ray runs "
            f"(`pip install 'bisect-npu[ray]=={driver}'`) and restart its Ray node, or run the driver with that "
            "node's version")


def check_versions(versions: dict[str, str], addresses: dict[str, str], driver: str = __version__) -> None:
    """Refuses a cluster where a node runs another bisect-npu than the driver (or none): its
    probe, builder and executor are that version's, and could run a trial differently."""
    odd = other_versions(versions, driver)
    if not odd:
        return
    said = "; ".join(f"Ray node {node[:16]} ({addresses.get(node) or 'address unknown'}) has bisect-npu {version}"
                     for node, version in odd.items())
    raise InfrastructureError(f"{said}, this driver {driver}: {VERSION_RISK}; {version_next_step(driver)}, then run "
                              "again (`bisect-npu resume` for a session)")


def images_said(nodes: list[NodeBuild]) -> str:
    """The images a batch's containers started from, for its log's first line ("" for worktrees)."""
    said = [node.image_said() for node in nodes if node.image_id]
    return f" image {', '.join(said)}" if said else ""


@dataclass(frozen=True)
class BatchOutcome:
    """What one batch sends back to the driver: where it ran and its small output files."""

    node_id: str
    cards: list[int]
    result: RunResult
    files: dict[str, tuple[bytes, float]]  # file name -> (content, modification time)
    build: dict[str, Any]
    nodes: list[NodeBuild] = field(default_factory=list)  # each node's build the batch ran on


@contextlib.contextmanager
def seen_on(node_id: str) -> Iterator[None]:
    """A candidate's image gone or renamed on this node's engine (ImageGone) names the node: the
    driver, which acquires the commit again, writes the line into the step's build log."""
    try:
        yield
    except ImageGone as gone:
        raise ImageGone(f"Ray node {node_id[:12]}: {gone}") from gone


def build_said(env: Environment) -> dict[str, Any]:
    """What a batch says of the candidate its node built or reused (BatchOutcome.build)."""
    return {"how": env.how, "key": env.build_key, "image": env.image, "seconds": env.seconds}


def node_build(node_id: str, env: Environment, result: RunResult) -> NodeBuild:
    """What `node_id` ran the batch from: its builder's environment, and the image id its
    container started from (the one checked to carry the candidate's commit label)."""
    return NodeBuild(node=node_id, how=env.how, seconds=env.seconds, image=env.image, image_id=result.image_id)


class NodeBuilds:
    """The builder of one node for one session (a Ray actor on that node): worktrees or images
    stay on the node between the batches of a candidate."""

    def __init__(self, builder_factory: BuilderFactory, node_id: str) -> None:
        self.builder = builder_factory(node_id)
        self._building = 0
        self._closed = False
        self._idle = threading.Condition()

    def acquire(self, commit: str, log_dir: str) -> Environment:
        with self._idle:
            if self._closed:
                raise InfrastructureError("the session is closing: no more builds on this node")
            self._building += 1
        try:
            return self.builder.acquire(commit, Path(log_dir))
        finally:
            with self._idle:
                self._building -= 1
                self._idle.notify_all()

    def release(self, env: Environment) -> None:
        self.builder.release(env)

    def close(self) -> None:
        """After the builds under way (their batch was cancelled; the build is not): a worktree
        made after the close would outlive the session."""
        with self._idle:
            self._closed = True
            self._idle.wait_for(lambda: self._building == 0)
        self.builder.close()


def actor_name(session_id: str, node_id: str) -> str:
    return f"bisect-npu-{session_id}-{node_id[:16]}"


def node_builds(session_id: str, node_id: str, builder_factory: BuilderFactory) -> Any:
    """This session's builder actor on `node_id`, made on first use (the driver makes one on
    every node it sees at the start, so they live as long as the driver, not as a task)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(NodeBuilds).options(
        name=actor_name(session_id, node_id), namespace=NAMESPACE, get_if_exists=True, num_cpus=0, max_concurrency=16,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    return actor.remote(builder_factory, node_id)


def run_batch(commit: str, request: dict[str, Any], timeout_s: float, session_id: str,
              builder_factory: BuilderFactory, executor_factory: ExecutorFactory) -> BatchOutcome:
    """The Ray task: build or reuse `commit` on this node, run the probe on the cards Ray gave
    this task, send the output files back. Runs on the node, never on the driver."""
    import ray

    context = ray.get_runtime_context()
    node_id = context.get_node_id()
    cards = sorted(int(card) for card in context.get_accelerator_ids().get(RESOURCE, []))
    builds = node_builds(session_id, node_id, builder_factory)
    with tempfile.TemporaryDirectory(prefix="bisect-npu-") as scratch:
        out_dir = Path(scratch)
        try:
            env = ray.get(builds.acquire.remote(commit, str(out_dir / "build")))
        except BuildUnreachable as unreachable:
            return unreachable_outcome(node_id, cards, unreachable)
        except BuildFailed as failure:
            log = probe_log_path(out_dir, probe_stem(request.get("case_id", "default"), request.get("trial", 0)))
            log.write_text(f"build failed on this node: {failure}\n{failure.log_tail}\n", encoding="utf-8")
            # A candidate its node could not build: every trial of the batch is a skip.
            result = RunResult(returncode=SKIP_EXIT, seconds=0.0, log_path=str(log),
                               log_tail=f"build failed: {failure}")
            return BatchOutcome(node_id, cards, result, small_files(out_dir), {"how": "failed", "error": str(failure)})
        try:
            with seen_on(node_id):
                result = executor_factory(cards).run_probe(env, request, out_dir, timeout_s)
        finally:
            builds.release.remote(env)
        return BatchOutcome(node_id, cards, result, small_files(out_dir), build_said(env),
                            [node_build(node_id, env, result)])


def run_command_batch(commit: str, argv: list[str], timeout_s: float, extra_env: dict[str, str], session_id: str,
                      builder_factory: BuilderFactory, executor_factory: ExecutorFactory) -> BatchOutcome:
    """The Ray task of a command (`--cmd`, `--unit-test`): build or reuse `commit` on this node
    (a `--unit-test` venv is made here, in the node's own cache), run the command there, send its
    log and its reason line back."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    builds = node_builds(session_id, node_id, builder_factory)
    with tempfile.TemporaryDirectory(prefix="bisect-npu-") as scratch:
        out_dir = Path(scratch)
        log = out_dir / COMMAND_LOG
        try:
            env = ray.get(builds.acquire.remote(commit, str(out_dir / "build")))
        except BuildUnreachable as unreachable:
            return unreachable_outcome(node_id, [], unreachable)
        except BuildFailed as failure:
            log.write_text(f"build failed on this node: {failure}\n{failure.log_tail}\n", encoding="utf-8")
            result = RunResult(returncode=SKIP_EXIT, seconds=0.0, log_path=str(log),
                               log_tail=f"build failed: {failure}")
            return BatchOutcome(node_id, [], result, _command_files(out_dir), {"how": "failed", "error": str(failure)})
        here = {**extra_env, **({REASON_FILE: str(out_dir / COMMAND_REASON)} if REASON_FILE in extra_env else {})}
        try:
            with seen_on(node_id):
                result = executor_factory([]).run_command(env, argv, log, timeout_s, here)
        finally:
            builds.release.remote(env)
        return BatchOutcome(node_id, [], result, _command_files(out_dir), build_said(env),
                            [node_build(node_id, env, result)])


def innermost(exc: BaseException) -> BaseException:
    """What a Ray task raised on its node, inside any nesting of Ray's task wrappers."""
    import ray

    while isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None:
        exc = exc.cause
    return exc


def ended_without_result(commit: str, exc: BaseException) -> InfrastructureError:
    """A batch Ray could not finish (its node or worker gone past the task's retries, an actor
    of the session lost, the task cancelled): the host's failure, one line."""
    said = (str(exc).strip().splitlines() or [""])[0][:200]
    return InfrastructureError(f"the Ray task of {commit[:12]} ended without a result ({type(exc).__name__}"
                               f"{': ' + said if said else ''}); check the cluster (`ray status`), then run again "
                               "(`bisect-npu resume`)")


def own_error(exc: BaseException) -> BisectError | None:
    """bisect-npu's own error that a Ray task raised on its node (inside any nesting of Ray's
    wrappers: a task's error of an actor's call), or None for anything else."""
    cause = innermost(exc)
    return cause if isinstance(cause, BisectError) else None


UNREACHABLE = "unreachable"  # a BatchOutcome's build "how" when the node's build failed on the network
BUILD_LOG = "build.log"


def unreachable_outcome(node_id: str, cards: list[int], unreachable: BuildUnreachable) -> BatchOutcome:
    """A build that failed on the network on this node, sent back whole (its log with it: the
    node's scratch directory goes) so the driver raises it where the evaluator retries builds."""
    log = b""
    if unreachable.log_path is not None:
        with contextlib.suppress(OSError):
            log = unreachable.log_path.read_bytes()[-200_000:]
    failure = unreachable.failure
    result = RunResult(returncode=SKIP_EXIT, seconds=0.0, log_path=BUILD_LOG, log_tail=failure.cause)
    return BatchOutcome(node_id, cards, result, {BUILD_LOG: (log, 0.0)},
                        {"how": UNREACHABLE, "cause": failure.cause, "next_step": failure.next_step})


def raise_if_unreachable(outcome: BatchOutcome, log_dir: Path) -> None:
    """The node's build failed on the network: BuildUnreachable, its log kept in `log_dir`, for
    the evaluator's retries (builds on the nodes are retried as local ones are)."""
    if outcome.build.get("how") != UNREACHABLE:
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"build-{outcome.node_id[:12]}.log"
    log.write_bytes(outcome.files.get(BUILD_LOG, (b"", 0.0))[0])
    failure = EnvironmentFailure(f"{outcome.build['cause']} (on Ray node {outcome.node_id[:12]})",
                                 str(outcome.build["next_step"]), network=True)
    raise BuildUnreachable(failure, log)


COMMAND_LOG = "command.log"
COMMAND_REASON = "command.reason"
REASON_FILE = "BISECT_NPU_REASON_FILE"  # orchestration/running/judging.py's REASON_FILE_ENV


def _command_files(out_dir: Path) -> dict[str, tuple[bytes, float]]:
    return {name: ((out_dir / name).read_bytes(), (out_dir / name).stat().st_mtime)
            for name in (COMMAND_LOG, COMMAND_REASON) if (out_dir / name).is_file()}


def sweep_node(executor_factory: ExecutorFactory) -> int:
    """The Ray task that stops, on its node, what this session left running there."""
    return executor_factory([]).sweep()


def small_files(out_dir: Path) -> dict[str, tuple[bytes, float]]:
    """The observations and logs of a batch (the request is the driver's own)."""
    return {path.name: (path.read_bytes(), path.stat().st_mtime) for path in sorted(out_dir.glob("*"))
            if path.is_file() and path.name.startswith(("obs-", "probe-"))}


class RemoteBuilds:
    """The driver's side of building: the candidate is built on the node that runs it, so
    `acquire` only names it (the step's journaled build is what the nodes ran: `RunResult.nodes`);
    build keys (what the search weighs) are read here, from the repository."""

    def __init__(self, keys: Builder) -> None:
        self.keys = keys

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        return Environment(kind="worktree", commit=commit, build_key=self.keys.build_key(commit) or "", how="reused")

    def release(self, env: Environment) -> None:
        """Nothing held here: each node's builder keeps its own worktrees or images."""

    def close(self) -> None:
        self.keys.close()

    def build_key(self, commit: str) -> str | None:
        return self.keys.build_key(commit)

    def built_keys(self) -> frozenset[str]:
        return frozenset()


class RayExecutor:
    """Runs each batch as a Ray task on a node with `per_run` NPUs free (see the module text)."""

    def __init__(self, address: str | None, per_run: int, session_id: str, builder_factory: BuilderFactory,
                 executor_factory: ExecutorFactory, across_nodes: Callable[[], Any] | None = None) -> None:
        connect(address)
        check_versions(node_versions(), {node.node_id: node.address for node in cluster_nodes(1)})
        self.per_run = per_run
        # An engine across nodes: each batch's (execute/ray_nodes.py's EngineAcrossNodes), else one node a batch.
        self.across_nodes = across_nodes
        self._engines: set[Any] = set()  # EngineAcrossNodes
        self.session_id = session_id
        self.builder_factory = builder_factory
        self.executor_factory = executor_factory
        self._home: dict[str, str] = {}  # commit -> the node that holds its build
        self._running: set[Any] = set()
        self._lock = threading.Lock()
        self._builders = [node_builds(session_id, node.node_id, builder_factory)  # held: they live as we do
                          for node in cluster_nodes(per_run) if node.engines]

    def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
        import ray

        out_dir = out_dir.resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.across_nodes is not None:
            outcome = self._across_nodes(env.commit, request, timeout_s)
            raise_if_unreachable(outcome, out_dir)
            return self._land(outcome, request, out_dir)
        task = ray.remote(run_batch).options(num_cpus=0, resources={RESOURCE: self.per_run},
                                             max_retries=TASK_RETRIES, retry_exceptions=False,
                                             scheduling_strategy=self._placement(env.commit))
        ref = task.remote(env.commit, request, timeout_s, self.session_id, self.builder_factory,
                          self.executor_factory)
        outcome = self._outcome(env.commit, ref, self.per_run)
        raise_if_unreachable(outcome, out_dir)
        return self._land(outcome, request, out_dir)

    def _outcome(self, commit: str, ref: Any, per_run: int = 0) -> BatchOutcome:
        """The task's outcome (a task of `per_run` NPUs: see `_wait`), its node kept as the
        commit's home (its build is there)."""
        import ray

        with self._tracked(ref):
            try:
                self._wait(commit, ref, per_run)
                outcome: BatchOutcome = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = own_error(exc)
                if cause is not None:
                    raise cause from None  # its own one line (a pin venv that cannot be built: exit 5), no traceback
                if not isinstance(innermost(exc), ray.exceptions.RayError):
                    raise  # a bug of ours on the node: its traceback
                raise ended_without_result(commit, innermost(exc)) from exc  # Ray's own failure inside the task
            except ray.exceptions.RayError as exc:  # its node or worker gone past the task's retries, cancelled
                raise ended_without_result(commit, exc) from exc
            except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) while this thread waits: stop the batch
                ray.cancel(ref, force=True)
                raise
        with self._lock:
            self._home.setdefault(commit, outcome.node_id)
        return outcome

    def _wait(self, commit: str, ref: Any, per_run: int) -> None:
        """Until the task of `per_run` NPUs is done; refused (and cancelled) once no alive node
        holds such an engine any more (those that did were lost: Ray would wait for one forever)."""
        import ray

        while not ray.wait([ref], timeout=CAPACITY_CHECK_S)[0]:
            if per_run and not any(node.engines for node in cluster_nodes(per_run)):
                ray.cancel(ref, force=True)
                raise InfrastructureError(f"the batch of {commit[:12]} waits for a Ray node with {per_run} {RESOURCE} "
                                          "and no alive node of the cluster has that many now (those that had were "
                                          "lost); bring them back (`ray status` lists the nodes), then run again "
                                          "(`bisect-npu resume`)")

    def _across_nodes(self, commit: str, request: dict[str, Any], timeout_s: float) -> BatchOutcome:
        """One batch with every node of the engine (execute/ray_nodes.py), torn down at its end."""
        assert self.across_nodes is not None
        engine = self.across_nodes()
        with self._lock:
            self._engines.add(engine)
        try:
            outcome: BatchOutcome = engine.run(commit, request, timeout_s)
            return outcome
        finally:
            with self._lock:
                self._engines.discard(engine)

    def _placement(self, commit: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._lock:
            home = self._home.get(commit)
        return NodeAffinitySchedulingStrategy(home, soft=True) if home else "SPREAD"

    @contextlib.contextmanager
    def _tracked(self, ref: Any) -> Iterator[None]:
        with self._lock:
            self._running.add(ref)
        try:
            yield
        finally:
            with self._lock:
                self._running.discard(ref)

    def _land(self, outcome: BatchOutcome, request: dict[str, Any], out_dir: Path) -> RunResult:
        """Write the batch's files into the session (keeping their times: the evaluator measures
        trials by them); the probe log starts with the node and cards it ran on."""
        stem = probe_stem(request.get("case_id", "default"), request.get("trial", 0))
        log = probe_log_path(out_dir, stem)
        header = (f"# ray node {outcome.node_id} cards {','.join(map(str, outcome.cards))} "
                  f"build {outcome.build.get('how')}{images_said(outcome.nodes)}\n").encode()
        run_node_path(out_dir, stem).write_text(outcome.node_id + "\n", encoding="utf-8")  # before the observations
        files = dict(outcome.files)
        content, _ = files.pop(log.name, (b"", 0.0))
        log.write_bytes(header + content)
        observations = []
        for name, (data, written) in files.items():  # each whole, then renamed: never seen half-written
            staged = out_dir / f".{name}.part"
            staged.write_bytes(data)
            os.utime(staged, (written, written))
            observations.append((staged, out_dir / name))
        for staged, final in sorted(observations, key=lambda pair: pair[1].name):
            staged.replace(final)
        observation = None
        if outcome.result.observation:
            landed = out_dir / Path(outcome.result.observation).name
            observation = str(landed) if landed.exists() else None
        return outcome.result.model_copy(update={"log_path": str(log), "observation": observation,
                                                 "nodes": outcome.nodes})

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        """A command's run as a Ray task on one CPU of some node (it needs no card); its log and
        reason line land where the driver's evaluator reads them."""
        import ray

        task = ray.remote(run_command_batch).options(num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False,
                                                     scheduling_strategy=self._placement(env.commit))
        ref = task.remote(env.commit, argv, timeout_s, dict(extra_env or {}), self.session_id, self.builder_factory,
                          self.executor_factory)
        outcome = self._outcome(env.commit, ref)
        raise_if_unreachable(outcome, log_path.parent)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        content, _ = outcome.files.get(COMMAND_LOG, (b"", 0.0))
        log_path.write_bytes(f"# ray node {outcome.node_id} build {outcome.build.get('how')}"
                             f"{images_said(outcome.nodes)}\n".encode() + content)
        reason = (extra_env or {}).get(REASON_FILE)
        if reason and COMMAND_REASON in outcome.files:
            Path(reason).write_bytes(outcome.files[COMMAND_REASON][0])
        return outcome.result.model_copy(update={"log_path": str(log_path), "nodes": outcome.nodes})

    def close(self) -> None:
        """Cancel every batch still running, stop what it started on its node, drop the builders."""
        import ray

        with self._lock:
            running, self._running = list(self._running), set()
            engines, self._engines = list(self._engines), set()
        for ref in running:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        for engine in engines:  # another slot's engine across nodes: each of its nodes stopped
            with contextlib.suppress(Exception):
                engine.teardown()
        self.sweep()
        for node in cluster_nodes(self.per_run):
            with contextlib.suppress(Exception):  # no builder there, or its node went
                actor = ray.get_actor(actor_name(self.session_id, node.node_id), namespace=NAMESPACE)
                ray.get(actor.close.remote(), timeout=120)
                ray.kill(actor)

    def sweep(self) -> int:
        """On every alive node: stop this session's probe processes and containers (a killed
        earlier driver's included, by the session's mark)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(sweep_node)
        refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False))
                .remote(self.executor_factory) for node in cluster_nodes(self.per_run)]
        stopped = 0
        for ref in refs:
            with contextlib.suppress(ray.exceptions.RayError):
                stopped += ray.get(ref, timeout=120)
        return stopped
