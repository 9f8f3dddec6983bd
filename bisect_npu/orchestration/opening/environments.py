"""What a session evaluates candidates with, made from its options and recipe: the builder,
executor and Evaluator (also outside a bisection, for `fix --verify`, with the scratch that run
works in) and a golden reference. The one place that makes them from a session's spec: the builders
and executors take plain arguments."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import git

from bisect_npu.alignment.record import load_observation
from bisect_npu.builders.base import Builder, BuildFailed
from bisect_npu.builders.cache import ImageCache
from bisect_npu.builders.dependency import DependencyBuilder, Layers, PinnedCommit, open_dependency_clone
from bisect_npu.builders.docker import DockerBuilder, connect_engine
from bisect_npu.builders.local import LocalBuilder, sweep_worktrees, sweep_worktrees_of_any_repo
from bisect_npu.builders.pin_venv import PinVenvs, default_pin_venv_cache
from bisect_npu.builders.prefetch import Prefetcher
from bisect_npu.builders.registry import BaseImageMap
from bisect_npu.builders.release_overlay import ReleaseOverlayBuilder, package_paths, parse_release, release_part
from bisect_npu.builders.switches import SwitchingBuilder
from bisect_npu.builders.unit_tests import TestsFrom, UnitTestBuilder, file_of
from bisect_npu.builders.venv import VenvBuilder, default_venv_cache
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.execute.ascend import ascend_container_spec, npu_run_env
from bisect_npu.execute.base import Executor
from bisect_npu.execute.card_memory import CardWait, host_card_memory
from bisect_npu.execute.devices import device_pool
from bisect_npu.execute.docker import (
    ContainerSpec,
    DockerExecutor,
    Mount,
    plain_container_spec,
    remove_session_containers,
)
from bisect_npu.execute.host import recipe_for_host
from bisect_npu.execute.host_devices import host_cards
from bisect_npu.execute.inprocess import CallableExecutor, Oracle
from bisect_npu.execute.local import OWNER_ENV, LocalExecutor, kill_owned_processes
from bisect_npu.execute.ray import RayExecutor, RemoteBuilds
from bisect_npu.execute.ray_nodes import EngineAcrossNodes
from bisect_npu.fix import APPLY_NAME
from bisect_npu.journal import DEFAULT_ROOT, new_session_dir, session_label
from bisect_npu.level import held_of, overlay_of
from bisect_npu.nightly.cases import CaseRef
from bisect_npu.observations import Observation, Verdict
from bisect_npu.orchestration.opening.preflight import settle_devices
from bisect_npu.orchestration.opening.session_spec import SessionSpec, declared_dependencies, dep_repo_of
from bisect_npu.orchestration.running.earlier_results import given_ends
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
from bisect_npu.orchestration.running.nightly import NightlyEvaluator
from bisect_npu.orchestration.running.probe_requests import accuracy_inputs
from bisect_npu.paths import cache_root
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import InstallPlan, Recipe
from bisect_npu.request import RunRequest
from bisect_npu.upstream import history


def session_evaluator(spec: SessionSpec, repo: git.Repo | None, recipe: Recipe | None, session_dir: Path,
                      builder: Builder | None, executor: Executor | None, oracle: Oracle | None = None) -> Evaluator:
    """A session's Evaluator: the builder and executor given (tests, the demo) or made for the
    options, the builder wrapped to give runs on the NPUs their candidate's own switches
    (builders/switches.py) and to prefetch where that is asked or --devices are given. `oracle`
    is the Python callable a session started through bisect_npu.api judges with."""
    recipe = recipe_for_host(recipe, spec.context.host) if recipe else None  # the host's image variant and dtype
    workdir = (Path(spec.executor.workdir) / session_label(session_dir) if spec.executor.workdir
               else session_dir / "worktrees")
    if builder is None or executor is None:
        # A dependency-level session builds the held upstream commit; its candidates are the dependency's.
        held = held_of(spec.level)
        build_repo = history.open_repo(held.repo) if held else repo
        made_builder, made_executor = make_environment(spec, build_repo, recipe, session_dir, workdir, oracle)
        builder = builder or made_builder
        executor = executor or made_executor
    builder = with_dependencies(spec, repo, recipe, builder)
    if spec.executor.devices and repo is not None and spec.range.package is None:
        builder = SwitchingBuilder(builder, repo, spec.context.host, recipe.environment if recipe else None)
    if spec.executor.prefetch if spec.executor.prefetch is not None else bool(spec.executor.devices):
        builder = Prefetcher(builder, session_dir / "prefetch")
    # A Python oracle goes the way of a command; its executor logs the name given as the argv.
    command = [spec.context.python_oracle] if spec.context.python_oracle else spec.judge.command
    evaluator = Evaluator(builder, executor, session_dir, recipe=recipe, command=command,
                          timeout_s=spec.judge.timeout_s, timeout_is=spec.judge.timeout_is,
                          retries=spec.judge.retries, cards=card_wait(spec),
                          earlier=given_ends(spec.judge.earlier_results) if spec.level.takes_earlier_runs else None)
    if spec.judge.nightly_case and repo is not None and held_of(spec.level) is None:
        return NightlyEvaluator(evaluator, repo, CaseRef.parse(spec.judge.nightly_case), spec.judge.nightly_datasets)
    return evaluator


def card_wait(spec: SessionSpec) -> CardWait | None:
    """The wait for the cards' memory before each probe run, on a host with npu-smi that runs one
    candidate at a time (with slots, the other slots' engines hold their cards on purpose)."""
    memory = host_card_memory()
    if memory is None or (spec.executor.slots or 1) > 1:
        return None
    return CardWait(memory, cards=spec.executor.devices or None)


def with_dependencies(spec: SessionSpec, repo: git.Repo | None, recipe: Recipe | None, builder: Builder) -> Builder:
    """`builder` with the declared dependencies' trees laid in (builders/dependency.py): at a
    dependency level, the candidate's tree into the held upstream commit's build; at an upstream
    level, each candidate's pinned tree for a dependency its build does not install."""
    declared = declared_dependencies(spec, recipe)
    layers = builder if isinstance(builder, Layers) else None  # a DockerBuilder: a layer on the upstream's image
    trees = cache_root() / "dependency-trees"
    if (held := held_of(spec.level)) is not None:
        dependency = next((d for d in declared if d.name == held.dependency), None)
        if dependency is None or repo is None:
            raise UsageError(f"session of dependency {held.dependency}: the recipe no longer declares it; resume "
                             "with the recipe the session started with")
        commit = held.commit
        return DependencyBuilder(builder, dependency, repo, lambda _: commit, lambda candidate: candidate,
                                 trees / dependency.name, layers)
    if repo is None or spec.range.package:
        return builder
    dockerfile = recipe.build.dockerfile if recipe else "Dockerfile"
    build_args = recipe.build.docker_args if recipe else {}
    for dependency in declared:
        if not dependency.installed_by_image:
            clone = open_dependency_clone(dependency, dep_repo_of(spec, dependency.name))
            builder = DependencyBuilder(builder, dependency, clone, lambda commit: commit,
                                        PinnedCommit(repo, clone, dependency, dockerfile, build_args),
                                        trees / dependency.name, layers)
    return builder


def make_environment(spec: SessionSpec, repo: git.Repo | None, recipe: Recipe | None, session_dir: Path,
                     workdir: Path, oracle: Oracle | None = None) -> tuple[Builder, Executor]:
    """The builder and executor for `--executor local|docker`, or for a Python oracle."""
    if spec.context.python_oracle:
        return _python_oracle_environment(spec, repo, session_dir, workdir, oracle)
    env = dict(recipe.environment) if recipe else {}
    if spec.range.package:
        return release_venvs(spec.range.package, spec, recipe), _local_executor(spec, env, [], session_dir)
    assert repo is not None
    if overlay_of(spec.level):
        return (release_overlay_builder(spec, repo, recipe, workdir),
                _local_executor(spec, env, ["."], session_dir))  # "." is the overlay: first on PYTHONPATH
    if spec.executor.executor == "ray":
        return ray_environment(spec, repo, recipe, session_dir, workdir)
    if spec.judge.unit_tests:
        return unit_test_builder(spec, repo, workdir), _local_executor(spec, {}, ["."], session_dir)
    if spec.executor.executor == "local":
        build_command = recipe.build.local_command if recipe else []
        python_paths = recipe.build.python_paths if recipe else ["."]
        reuse = recipe.build.reuse_outputs if recipe else True
        owner = str(session_dir.resolve())
        return (LocalBuilder(repo, workdir.resolve(), build_command, {**env, OWNER_ENV: owner},  # builds too
                             timeout_s=spec.judge.timeout_s,
                             artifacts_dir=session_dir.resolve() / "build-outputs" if reuse else None),
                _local_executor(spec, env, python_paths, session_dir))
    return _docker_environment(spec, repo, recipe, session_dir)


def unit_test_builder(spec: SessionSpec, repo: git.Repo, workdir: Path) -> Builder:
    """`--unit-test`: each candidate's worktree with its vLLM pin's cached venv (builders/unit_tests.py)."""
    tests_from = (TestsFrom(spec.judge.unit_test_from,
                            tuple(dict.fromkeys(file_of(n) for n in spec.judge.unit_tests)))
                  if spec.judge.unit_test_from else None)
    # No submodules: they are the C++ ops' sources (csrc/third_party), which no unit test builds.
    return UnitTestBuilder(repo, LocalBuilder(repo, workdir.resolve(), submodules=False),
                           PinVenvs(default_pin_venv_cache(),
                                    vllm_repo=Path(spec.judge.vllm_repo) if spec.judge.vllm_repo else None),
                           tests_from)


def release_venvs(package: str, spec: SessionSpec, recipe: Recipe | None) -> Builder:
    """The cached venvs of a package's releases (`--package`, and what overlays stand on)."""
    plan = recipe.install if recipe else InstallPlan()
    return VenvBuilder(package, plan, default_venv_cache(), int(spec.executor.cache_size_gb * 2**30))


def release_overlay_builder(spec: SessionSpec, repo: git.Repo, recipe: Recipe | None, workdir: Path) -> Builder:
    """`--overlay-on-release PACKAGE==VERSION`: each commit's Python tree over that release's venv."""
    release = overlay_of(spec.level)
    assert release is not None
    package, version = parse_release(release)
    return ReleaseOverlayBuilder(repo, release_venvs(package, spec, recipe), package, version, workdir.resolve(),
                                 env=dict(recipe.environment) if recipe else {})


def overlay_release_for(spec: SessionSpec, recipe: Recipe | None, repo: git.Repo, version: str, ref: str,
                        log_dir: Path) -> str | None:
    """`PACKAGE==VERSION` when the commits below the release level can run as overlays on
    `version`'s venv (cached by the release level): the repository holds the release's import
    packages at `ref`. None otherwise (a repository of something else): the commits are built."""
    assert spec.range.package is not None
    try:
        venv = release_venvs(spec.range.package, spec, recipe).acquire(version, log_dir)
        part = release_part(Path(venv.path or ""), spec.range.package)
    except BuildFailed:
        return None
    return f"{spec.range.package}=={version}" if package_paths(repo, ref, part.packages) else None


def _docker_environment(spec: SessionSpec, repo: git.Repo, recipe: Recipe | None,
                        session_dir: Path) -> tuple[Builder, Executor]:
    """The builder and executor for `--executor docker`; the session's containers are swept
    when the process exits."""
    client = connect_engine()
    cache = ImageCache(client, int(spec.executor.cache_size_gb * (1 << 30)))
    build_args = dict(recipe.build.docker_args) if recipe else {}
    base_images = BaseImageMap.parse(spec.executor.base_image_map, recipe.build.base_image_map if recipe else None)
    builder = DockerBuilder(repo, client, build_args=build_args, cache=cache,
                            dockerfile=recipe.build.dockerfile if recipe else "Dockerfile", base_images=base_images,
                            release_images=spec.executor.release_images
                            or (recipe.build.release_images if recipe else None))
    executor = DockerExecutor(client, container_spec_factory(spec, recipe), session_id=session_label(session_dir),
                              device_pool=device_pool(spec.executor.devices, spec.executor.slots))
    atexit.register(executor.close)
    return builder, executor


def container_spec_factory(spec: SessionSpec, recipe: Recipe | None) -> Callable[[str, Path], ContainerSpec]:
    """What each candidate's container gets: with `--devices` the NPUs (execute/ascend.py), else
    a plain CPU container (the demo); the recipe's environment, its model and an accuracy trial's
    input files (read-only, at their host paths) either way."""
    env = dict(recipe.environment) if recipe else {}
    host_model = Path(recipe.model.host_path) if recipe and recipe.model.host_path else None
    model_path = recipe.model.path if recipe else None
    inputs = accuracy_inputs(recipe) if recipe else []
    if spec.executor.devices:
        return functools.partial(ascend_container_spec, devices=list(spec.executor.devices),
                                 model_dir=host_model, model_path=model_path, env=env, host=spec.context.host,
                                 inputs=inputs)

    def cpu_spec(image: str, out_dir: Path) -> ContainerSpec:
        spec = plain_container_spec(image, out_dir)
        mounts = list(spec.mounts)
        if host_model is not None:
            mounts.append(Mount(source=str(host_model), target=model_path or str(host_model)))
        mounts += [Mount(source=str(path), target=str(path), read_only=True) for path in inputs]
        return spec.model_copy(update={"environment": env, "mounts": mounts})

    return cpu_spec


def _python_oracle_environment(spec: SessionSpec, repo: git.Repo | None, session_dir: Path, workdir: Path,
                               oracle: Oracle | None) -> tuple[Builder, Executor]:
    """A checkout per candidate (nothing built) and the callable judging it in this process."""
    if oracle is None:
        name = spec.context.python_oracle or ""
        raise UsageError(f"session {session_dir} was judged by the Python callable {name} (given through "
                         "bisect_npu.api), which a journal cannot hold, so `bisect-npu resume` cannot continue it; "
                         f"call bisect_npu.api.bisect(..., oracle={name.rpartition(':')[2]}, "
                         f"session_dir={str(session_dir)!r}) with the callable again")
    if spec.executor.executor != "local" or repo is None:
        raise UsageError("a Python oracle judges a local checkout of each commit: use executor='local' and a "
                         "repository")
    return LocalBuilder(repo, workdir.resolve()), CallableExecutor(oracle)


def ray_environment(spec: SessionSpec, repo: git.Repo, recipe: Recipe | None, session_dir: Path,
                    workdir: Path) -> tuple[Builder, Executor]:
    """`--executor ray`: each node builds in its own part of the session (a worktree, or an image
    of its own engine with --node-executor docker) and runs the probe as `--executor local|docker`
    does, on the cards Ray gave the batch (made there by the factories below)."""
    on_nodes = spec.with_executor(executor=spec.executor.node_executor, devices=[], slots=1)
    keys, _ = make_environment(on_nodes, repo, recipe, session_dir, workdir)
    builder_factory = functools.partial(node_builder, on_nodes, session_dir, workdir)
    executor_factory = functools.partial(node_executor, on_nodes, session_dir, workdir)
    nodes = recipe.engine.nodes if recipe else None
    across = (functools.partial(EngineAcrossNodes, nodes, session_label(session_dir), builder_factory, executor_factory)
              if nodes is not None else None)
    return (RemoteBuilds(keys),
            RayExecutor(spec.executor.ray_address, recipe.cards_per_run() if recipe else 1, session_label(session_dir),
                        builder_factory, executor_factory, across))


def node_builder(spec: SessionSpec, session_dir: Path, workdir: Path, node_id: str) -> Builder:
    """A Ray node's builder: worktrees and build outputs in the node's own directories."""
    recipe = recipe_for_host(load_recipe(spec.judge.recipe), spec.context.host) if spec.judge.recipe else None
    node = node_id[:12]
    return make_environment(spec, history.open_repo(spec.range.repo or "."), recipe, session_dir / "nodes" / node,
                            workdir / node)[0]


def node_executor(spec: SessionSpec, session_dir: Path, workdir: Path, cards: list[int]) -> Executor:
    """An executor on a Ray node, on the cards Ray gave one batch (none: to sweep the session):
    a process in the node's worktree, or a container of the node's engine."""
    recipe = recipe_for_host(load_recipe(spec.judge.recipe), spec.context.host) if spec.judge.recipe else None
    if spec.executor.executor == "docker":
        if not host_cards():
            cards = []  # a node without NPU device files (fake NPU resources): a plain CPU container
        # Made here, not by _docker_environment: its sweep at exit would reach the session's
        # containers that other workers of this node still run.
        return DockerExecutor(connect_engine(), container_spec_factory(spec.with_executor(devices=cards), recipe),
                              session_id=session_label(session_dir))
    on_cards = spec.with_executor(devices=cards)
    return make_environment(on_cards, history.open_repo(spec.range.repo or "."), recipe, session_dir, workdir)[1]


def _local_executor(spec: SessionSpec, env: dict[str, str], python_paths: list[str], session_dir: Path) -> Executor:
    """Processes on this host, marked as the session's; with --devices (an NPU host without a
    container engine) each run sees its slot's cards and the determinism switches are on, as
    in an Ascend container, with the host type's (the recipe's environment has the last word)."""
    return LocalExecutor({**npu_run_env(spec.context.host), **env} if spec.executor.devices else env, python_paths,
                         owner=str(session_dir.resolve()), devices=list(spec.executor.devices),
                         device_pool=device_pool(spec.executor.devices, spec.executor.slots))


@contextlib.contextmanager
def make_evaluator(repo_path: str, recipe_path: str | None, command: list[str] | None = None,
                   executor: Literal["local", "docker"] = "local", session_dir: Path | None = None,
                   devices: list[int] | None = None) -> Iterator[Callable[[str], Verdict]]:
    """A commit -> Verdict function outside a bisection (used by `bisect-npu fix --verify`), on the
    NPUs `devices` (all of them for each run) of a host type detected as `run` detects it (its
    image variant, dtype and switches follow); its worktrees, build outputs and containers go when
    the ``with`` block ends."""
    repo = history.open_repo(repo_path)
    recipe = load_recipe(recipe_path) if recipe_path else None
    spec = SessionSpec.of(RunRequest.of(good="", bad="", repo=repo_path, recipe=recipe_path, command=command,
                                        executor=executor, devices=list(devices or []), slots=1))
    if spec.executor.devices:
        settle_devices(spec, recipe.cards_per_run() if recipe else 1)  # as `run`: host type, cards, device files
    session_dir = session_dir or new_session_dir(DEFAULT_ROOT)
    session_dir.mkdir(parents=True, exist_ok=True)
    evaluator = session_evaluator(spec, repo, recipe, session_dir, None, None)

    def evaluate(commit: str) -> Verdict:
        return evaluator.evaluate(EvaluationRequest(commit, recipe.trials.count if recipe else 1)).verdict

    try:
        yield evaluate
    finally:
        evaluator.close()


@contextlib.contextmanager
def fix_verifier(repo_path: str, recipe_path: str | None, command: list[str] | None = None,
                 executor: Literal["local", "docker"] = "local",
                 devices: list[int] | None = None) -> Iterator[tuple[Callable[[str], Verdict], Path]]:
    """`bisect-npu fix --verify`'s commit -> Verdict function and the directory for its fixes'
    worktrees, both in a verification scratch (`verification_scratch`) that goes at the end."""
    repo = history.open_repo(repo_path)
    with verification_scratch(repo, executor) as scratch, \
            make_evaluator(repo_path, recipe_path, command=command, executor=executor,
                           session_dir=verification_session(scratch), devices=devices) as evaluate:
        yield evaluate, scratch / "fixes"


EXECUTOR_FILE = "executor"  # in a verification's scratch: `local` or `docker`


@contextlib.contextmanager
def verification_scratch(repo: git.Repo, executor: str = "local") -> Iterator[Path]:
    """A directory for one `fix --verify` run's worktrees and session, under the cache: each run
    first sweeps what runs killed before it left (their process is gone: their processes, their
    containers when they used any, their worktrees), then its own at the end."""
    base = cache_root() / "fix-verify"
    base.mkdir(parents=True, exist_ok=True)
    # This host's runs only: a cache shared over NFS also holds other machines' live runs.
    host = re.sub(r"[^\w.]", "_", socket.gethostname()) + "--"
    for stale in base.iterdir():
        if stale.name.startswith(host) and not _process_alive(stale.name[len(host):].split("-", 1)[0]):
            if (stale / EXECUTOR_FILE).is_file() and (stale / EXECUTOR_FILE).read_text().strip() == "docker" \
                    and not _remove_containers_of(stale):
                continue  # the engine is unreachable now: kept, so a later run still finds them
            kill_owned_processes(str(stale.resolve()))  # its probe or oracle command, if still running
            sweep_worktrees_of_any_repo(stale)  # the killed run may have verified on another clone
            sweep_worktrees(repo, stale)
            shutil.rmtree(stale, ignore_errors=True)
    scratch = base / f"{host}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    (scratch / EXECUTOR_FILE).write_text(executor + "\n")  # what a sweep of this run, if killed, must look for
    try:
        yield scratch
    finally:
        sweep_worktrees(repo, scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def verification_session(scratch: Path) -> Path:
    """The session directory of a verification run (its containers' label is made from it)."""
    return scratch / f"session-{scratch.name}"


def _remove_containers_of(stale: Path) -> bool:
    """Remove a killed verification's containers by its session label; False if the engine is
    out of reach (nothing removed)."""
    try:
        client = connect_engine()
    except InfrastructureError:
        return False
    remove_session_containers(client, session_label(verification_session(stale)))
    return True


def _process_alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_fix_worktrees(repo: git.Repo | None, session_dir: Path) -> None:
    """What a killed fix verification of a session left: its applied fixes' worktrees."""
    if repo is not None:
        sweep_worktrees(repo, fix_worktrees(session_dir), APPLY_NAME)


def fix_worktrees(session_dir: Path) -> Path:
    """Where a session's fix stage applies fixes."""
    return session_dir / "fix-worktrees"


def load_golden(recipe: Recipe) -> list[Observation]:
    """A golden reference: one observation file, a directory of them, or a record (paths relative to the
    recipe; a record's dumps relative to it)."""
    return [load_observation(f) for f in recipe.golden_files()]
