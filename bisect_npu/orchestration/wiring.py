"""What a session evaluates candidates with, made from its options and recipe: the builder,
executor and Evaluator (also outside a bisection, for `fix --verify`) and a golden reference."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import git

from bisect_npu import history
from bisect_npu.builders.base import Builder
from bisect_npu.contracts import Observation, Verdict
from bisect_npu.errors import UsageError
from bisect_npu.execute.base import Executor
from bisect_npu.journal import DEFAULT_ROOT, new_session_dir, session_label
from bisect_npu.orchestration.evaluate import Evaluator
from bisect_npu.orchestration.options import RunOptions
from bisect_npu.recipe import InstallPlan, Recipe, load_recipe


def session_evaluator(options: RunOptions, repo: git.Repo | None, recipe: Recipe | None, session_dir: Path,
                      builder: Builder | None, executor: Executor | None) -> Evaluator:
    """A session's Evaluator: the builder and executor given (tests, the demo) or made for the
    options, the builder wrapped to prefetch where that is asked or --devices are given."""
    from bisect_npu.execute.host import recipe_for_host

    recipe = recipe_for_host(recipe, options.host) if recipe else None  # the host's image variant and dtype
    workdir = (Path(options.workdir) / session_label(session_dir) if options.workdir
               else session_dir / "worktrees")
    if builder is None or executor is None:
        made_builder, made_executor = make_environment(options, repo, recipe, session_dir, workdir)
        builder = builder or made_builder
        executor = executor or made_executor
    if options.prefetch if options.prefetch is not None else bool(options.devices):
        from bisect_npu.builders.prefetch import Prefetcher

        builder = Prefetcher(builder, session_dir / "prefetch")
    return Evaluator(builder, executor, session_dir, recipe=recipe, command=options.command,
                     timeout_s=options.timeout_s)


def make_environment(options: RunOptions, repo: git.Repo | None, recipe: Recipe | None, session_dir: Path,
                     workdir: Path) -> tuple[Builder, Executor]:
    """The builder and executor for `--executor local|docker`."""
    env = dict(recipe.environment) if recipe else {}
    if options.package:
        from bisect_npu.builders.venv import VenvBuilder, default_venv_cache

        plan = recipe.install if recipe else InstallPlan()
        return (VenvBuilder(options.package, plan, default_venv_cache(), int(options.cache_size_gb * 2**30)),
                _local_executor(options, env, [], session_dir))
    assert repo is not None
    if options.executor == "local":
        from bisect_npu.builders.local import LocalBuilder
        from bisect_npu.execute.local import OWNER_ENV

        build_command = recipe.build.local_command if recipe else []
        python_paths = recipe.build.python_paths if recipe else ["."]
        reuse = recipe.build.reuse_outputs if recipe else True
        owner = str(session_dir.resolve())
        return (LocalBuilder(repo, workdir.resolve(), build_command, {**env, OWNER_ENV: owner},  # builds too
                             artifacts_dir=session_dir.resolve() / "build-outputs" if reuse else None),
                _local_executor(options, env, python_paths, session_dir))
    from bisect_npu.builders.docker import make_docker_environment

    return make_docker_environment(options, repo, recipe, session_dir)


def _local_executor(options: RunOptions, env: dict[str, str], python_paths: list[str], session_dir: Path) -> Executor:
    """Processes on this host, marked as the session's; with --devices (an NPU host without a
    container engine) each run sees its slot's cards and the determinism switches are on, as
    in an Ascend container (the recipe's environment has the last word)."""
    from bisect_npu.execute.ascend import DETERMINISM_ENV
    from bisect_npu.execute.devices import device_pool
    from bisect_npu.execute.local import LocalExecutor

    return LocalExecutor({**DETERMINISM_ENV, **env} if options.devices else env, python_paths,
                         owner=str(session_dir.resolve()), devices=list(options.devices),
                         device_pool=device_pool(options.devices, options.slots))


@contextlib.contextmanager
def make_evaluator(repo_path: str, recipe_path: str | None, command: list[str] | None = None,
                   executor: Literal["local", "docker"] = "local", session_dir: Path | None = None,
                   devices: list[int] | None = None) -> Iterator[Callable[[str], Verdict]]:
    """A commit -> Verdict function outside a bisection (used by `bisect-npu fix --verify`), on the
    NPUs `devices` (all of them for each run); its worktrees, build outputs and containers go when
    the ``with`` block ends."""
    repo = history.open_repo(repo_path)
    recipe = load_recipe(recipe_path) if recipe_path else None
    options = RunOptions(good="", bad="", repo=repo_path, recipe=recipe_path, command=command, executor=executor,
                         devices=list(devices or []), slots=1)
    if options.devices:
        from bisect_npu.orchestration.preflight import settle_slots

        settle_slots(options, recipe.cards_per_run() if recipe else 1)  # one run at a time: enough cards?
        if executor == "docker":
            from bisect_npu.execute.host_devices import check_host_devices

            check_host_devices(options.devices)  # before the first build, as `run` does
    session_dir = session_dir or new_session_dir(DEFAULT_ROOT)
    session_dir.mkdir(parents=True, exist_ok=True)
    evaluator = session_evaluator(options, repo, recipe, session_dir, None, None)

    def evaluate(commit: str) -> Verdict:
        return evaluator.evaluate(commit, recipe.trials.count if recipe else 1, [], lambda r: None, False).verdict

    try:
        yield evaluate
    finally:
        evaluator.close()


def load_golden(recipe: Recipe) -> list[Observation]:
    """A golden reference: one observation file, or a directory of them (paths relative to the recipe)."""
    if not recipe.reference.path:
        raise UsageError(f"recipe {recipe.name}: reference.kind golden needs reference.path "
                         "(an observation JSON or a directory of them)")
    path = Path(recipe.reference.path)
    if not path.is_absolute() and recipe.source:
        path = Path(recipe.source).resolve().parent / path
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not all(f.exists() for f in files):
        raise UsageError(f"recipe {recipe.name}: golden reference {path} not found or empty")
    return [Observation.load(f) for f in files]
