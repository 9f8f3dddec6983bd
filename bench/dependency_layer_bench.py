"""Crossing into a dependency: what one dependency-level step's build costs against a full image build.

Measured on the demo (`--executor docker`, the engine's API), then projected for vllm-ascend:
1. a full build of the demo's pin-move commit (the culprit the dependency level holds), with the
   engine's layer cache emptied first, as build_bench.py does it;
2. a dependency-level step's build: DependencyBuilder over that image laying minivllm's tree at a
   dependency commit (extracted from git, one layer committed), for several distinct commits;
3. with --vllm-tree DIR (an installed `vllm` package directory): the same layer with a tree of
   vLLM's Python files, the size of what vllm-ascend's dependency level lays per candidate;
4. plan's cost model (bisect_npu.forecast.simulate, as `bisect-npu plan` replays the search): a dependency
   level over N vLLM commits between two pins, every candidate one layer over the held image,
   against a vllm-ascend image build per candidate. Build and run minutes are plan's defaults
   (30 and 5), the overlay minutes the vLLM-sized layer measured in 3 (plan's default 2 without).

Needs the engine (containers/setup-podman.sh; DOCKER_HOST exported) and the demo base image
(containers/make-base-image.sh). It removes the demo dependency case's images (to build afresh):
do not run it beside a `demo --case dependency --executor docker`. Usage:
`.venv/bin/python bench/dependency_layer_bench.py [--vllm-tree .venv-vllm/lib/python3.11/site-packages/vllm]`.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import docker.errors
import git
from build_bench import forget_layers, remove_images

from bisect_npu.builders.base import DEPENDENCY_KIND, LABEL_COMMIT, LABEL_KEY, LABEL_KIND
from bisect_npu.builders.dependency import DependencyBuilder
from bisect_npu.builders.docker import DockerBuilder, connect_engine
from bisect_npu.builders.key import BuildKeyReader
from bisect_npu.demo.generate import ensure_upstream
from bisect_npu.forecast.simulate import Minutes, simulate
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import DependencySpec

REPEATS = 3
LAYERS = 4  # distinct dependency commits laid per repeat
PLAN_BUILD_MIN, PLAN_RUN_MIN, PLAN_OVERLAY_MIN = 30.0, 5.0, 2.0  # `bisect-npu plan` defaults
VLLM_COMMITS = (50, 150, 400)
T = TypeVar("T")
ATTEMPTS = 10  # vLLM commits between two pins (a pin move every week or two)


def retried(measure: Callable[[], T]) -> T:
    """`measure()`, again after an engine error (500): on an engine shared with other jobs podman
    answers "image not known" when another client removes an image during a listing, or a broken
    pipe on a copy into a container."""
    for attempt in range(ATTEMPTS):
        try:
            return measure()
        except docker.errors.APIError as exc:
            if not exc.is_server_error() or attempt == ATTEMPTS - 1:
                raise
            print(f"  (engine error, measuring again: {str(exc)[-100:]})", flush=True)
            time.sleep(2)
    raise AssertionError("unreachable")


def full_build_seconds(client, repo: git.Repo, commit: str, logs: Path) -> float:
    """One full build of `commit` from the base image, its key's images and cached layers removed."""
    builder = DockerBuilder(repo, client, overlays=False)
    digest = BuildKeyReader(repo).key(commit).digest
    # The dependency layers made over this key's image (the demo's dependency case) hold its layers too.
    laid_over = {key for row in client.api.images(filters={"label": f"{LABEL_KIND}={DEPENDENCY_KIND}"})
                 if (key := (row.get("Labels") or {}).get(LABEL_KEY, "")).startswith(f"{commit[:16]}-")}
    remove_images(client, LABEL_KEY, {digest, *laid_over})
    started = time.monotonic()
    env = builder.acquire(commit, logs)
    seconds = time.monotonic() - started
    assert env.how == "built" and env.image, env
    compiled = "RUN" in Path(env.log_path or "").read_text().split("COPY", 1)[-1].split("Using cache", 1)[0]
    assert compiled, "the full build came from the engine's layer cache; run the bench again"
    forget_layers(client, env.image)
    return seconds


def layer_seconds(client, repo: git.Repo, held: str, spec: DependencySpec, dep_repo: git.Repo, shas: list[str],
                  root: Path) -> list[float]:
    """Each of `shas` laid over `held`'s image as a dependency-level step does it: a fresh tree
    (nothing extracted before) and a fresh layer (none of that key made before)."""
    inner = DockerBuilder(repo, client)
    inner.acquire(held, root / "logs")  # the held culprit's image: the commit level built it
    layers = {f"{held[:16]}-{spec.name}-{sha[:16]}" for sha in shas}  # the keys DependencyBuilder gives them
    remove_images(client, LABEL_KEY, layers)
    trees = Path(tempfile.mkdtemp(prefix="trees-", dir=root))
    builder = DependencyBuilder(inner, spec, dep_repo, lambda _: held, lambda commit: commit, trees, inner.lay_over)
    seconds = []
    for sha in shas:
        started = time.monotonic()
        env = builder.acquire(sha, root / "logs")
        seconds.append(time.monotonic() - started)
        assert env.how == "overlay", env
        builder.release(env)
    shutil.rmtree(trees)
    remove_images(client, LABEL_KEY, layers)
    return seconds


def upstream_overlay_seconds(client, repo: git.Repo, held: str, sibling: str, root: Path) -> float:
    """The commit level's own overlay, for comparison: `sibling` (same build key as `held`) laid
    over `held`'s image as a Python-tree layer."""
    inner = DockerBuilder(repo, client)
    inner.acquire(held, root / "logs")
    remove_images(client, LABEL_COMMIT, {sibling})
    started = time.monotonic()
    env = inner.acquire(sibling, root / "logs")
    seconds = time.monotonic() - started
    assert env.how == "overlay", env
    remove_images(client, LABEL_COMMIT, {sibling})
    return seconds


def vllm_sized_repo(tree: Path, root: Path, commits: int) -> tuple[git.Repo, list[str], int]:
    """A scratch repository whose `vllm/` is `tree`'s Python files, with `commits` commits each
    touching one file (distinct trees to lay); the repository, its shas and the file count."""
    repo_dir = root / "vllm-sized"
    files = [p for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".so"]
    for path in files:
        dest = repo_dir / "vllm" / path.relative_to(tree)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    def run(*argv: str) -> str:
        return subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *argv],
                              cwd=repo_dir, check=True, capture_output=True, text=True).stdout.strip()

    run("init", "-q", "-b", "main")
    shas = []
    for i in range(commits):
        (repo_dir / "vllm" / "_bench_marker.py").write_text(f"STEP = {i}\n")
        run("add", "-A")
        run("commit", "-q", "-m", f"step {i}")
        shas.append(run("rev-parse", "HEAD"))
    return git.Repo(repo_dir), shas, len(files) + 1


def projection(overlay_min: float) -> None:
    """Plan's replay of the exact search over a dependency level of n vLLM commits."""
    print(f"\nprojection for vllm-ascend (plan's cost model: build {PLAN_BUILD_MIN:g} min, run {PLAN_RUN_MIN:g} min, "
          f"layer {overlay_min:.2f} min):")
    print("  vLLM commits | steps | dependency level: builds, layers, machine-hours | image per candidate: "
          "builds, machine-hours | saved")
    for n in VLLM_COMMITS:
        culprits = sorted({1 + (i * (n - 1)) // 63 for i in range(64)})
        layered = simulate(n, culprits, bad_rate=1.0, good_rate=0.0, mode="exact", runs=1,
                           build_key_of=lambda _: "held",
                           costs=Minutes(build=PLAN_BUILD_MIN, overlay=overlay_min, run=PLAN_RUN_MIN))
        rebuilt = simulate(n, culprits, bad_rate=1.0, good_rate=0.0, mode="exact", runs=1,
                           build_key_of=str, costs=Minutes(build=PLAN_BUILD_MIN, run=PLAN_RUN_MIN))
        print(f"  {n:12d} | {layered.mean_trials:5.1f} | {layered.mean_builds:.0f}, {layered.mean_overlays:5.1f}, "
              f"{layered.mean_machine_hours:5.2f} h | {rebuilt.mean_builds:5.1f}, {rebuilt.mean_machine_hours:5.2f} h "
              f"| {rebuilt.mean_machine_hours / layered.mean_machine_hours:4.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-tree", type=Path, help="an installed vllm package directory (its .py files are laid)")
    args = parser.parse_args()
    client = connect_engine()
    repo_path, manifest = ensure_upstream()
    repo = git.Repo(repo_path)
    case = manifest.case("dependency")
    assert case.dependency is not None
    dep_repo = git.Repo(manifest.dependency("minivllm").repo)
    spec = load_recipe(case.recipe).dependencies[0]
    shas = [c.hexsha for c in dep_repo.iter_commits(f"{case.dependency.old_sha}..{case.dependency.new_sha}",
                                                    first_parent=True)]
    with tempfile.TemporaryDirectory(prefix="dependency-bench-") as tmp:
        root = Path(tmp)
        full = statistics.median(retried(lambda: full_build_seconds(client, repo, case.culprit.sha, root / "logs"))
                                 for _ in range(REPEATS))
        print(f"demo full image build            {full:7.2f} s (median of {REPEATS})", flush=True)
        laid = [s for r in range(REPEATS) for s in retried(functools.partial(
            layer_seconds, client, repo, case.culprit.sha, spec, dep_repo, shas[r * LAYERS:(r + 1) * LAYERS], root))]
        files = len(dep_repo.git.ls_tree("-r", "--name-only", shas[0], "--", spec.package_dir).split())
        layer = statistics.median(laid)
        print(f"demo dependency step's layer     {layer:7.2f} s (median of {len(laid)}; minivllm/, {files} files)"
              f"   full/layer = {full / layer:.1f}x", flush=True)
        keys = BuildKeyReader(repo)
        sibling = next(c.hexsha for c in repo.iter_commits(f"{case.culprit.sha}..{case.bad_sha}", first_parent=True)
                       if keys.key(c.hexsha).digest == keys.key(case.culprit.sha).digest)
        own = statistics.median(retried(lambda: upstream_overlay_seconds(client, repo, case.culprit.sha, sibling, root))
                                for _ in range(REPEATS))
        print(f"demo commit-level overlay        {own:7.2f} s (median of {REPEATS}; tinyvllm's tree, same key)",
              flush=True)
        overlay_min = PLAN_OVERLAY_MIN
        if args.vllm_tree:
            vllm, vllm_shas, vllm_files = vllm_sized_repo(args.vllm_tree, root, REPEATS * 2)
            vllm_spec = spec.model_copy(update={"name": "vllm-sized", "package_dir": "vllm"})
            big = statistics.median(retried(lambda: layer_seconds(client, repo, case.culprit.sha, vllm_spec, vllm,
                                                                   vllm_shas, root)))
            print(f"vLLM-sized dependency layer      {big:7.2f} s (median of {len(vllm_shas)}; vllm/, {vllm_files} "
                  f"files)   demo full/layer = {full / big:.1f}x", flush=True)
            overlay_min = big / 60
    projection(overlay_min)


if __name__ == "__main__":
    main()
