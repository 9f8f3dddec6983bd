"""Build avoidance on the demo upstream, measured through the container engine's API.

Prints, in one run:
1. the wall time of a full image build and of an overlay build of the same commit (goal: >= 10x);
2. the wall time of a demo bisection (`--executor docker`) with every candidate fully built,
   with overlays (build avoidance), and with overlays plus prefetch.

Needs the engine (containers/setup-podman.sh; DOCKER_HOST exported) and the demo base image
(containers/make-base-image.sh). Usage: `.venv/bin/python bench/build_bench.py [--skip-bisect]`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import docker.errors
import git

from bisect_npu.builders.base import LABEL_COMMIT, LABEL_KEY
from bisect_npu.builders.docker import DockerBuilder, connect_engine
from bisect_npu.builders.key import distinct_keys
from bisect_npu.demo.generate import ensure_upstream

REPEATS = 3


def remove_images(client, label: str, values: set[str]) -> None:
    """Remove our images whose `label` is one of `values`, overlays before the full images below them."""
    rows = [r for r in client.api.images(filters={"label": label}) if (r.get("Labels") or {}).get(label) in values]
    for row in sorted(rows, key=lambda r: r["Labels"].get("org.bisect-npu.kind") != "overlay"):
        client.images.remove(row["Id"], force=True)


def forget_layers(client, image: str) -> None:
    """Remove a built image and the engine's cached intermediate layers below it (down to the first
    image that is not only ours), so the next full build of the same commit compiles again."""
    chain = []
    current = client.api.inspect_image(image)
    while current.get("Parent"):
        chain.append(current["Id"])
        current = client.api.inspect_image(current["Parent"])
        if current.get("RepoTags"):  # the base image (or another tagged image): keep it and below
            break
    for image_id in chain:
        with contextlib.suppress(docker.errors.NotFound):  # pruned with its child already
            client.images.remove(image_id, force=True)


def build_pair(client, repo: git.Repo, commits: list[str], logs: Path) -> tuple[float, float]:
    """Median (full build seconds, overlay build seconds) of one commit sharing its key with a neighbour."""
    pairs = [build_pair_once(client, repo, commits, logs) for _ in range(REPEATS)]
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def build_pair_once(client, repo: git.Repo, commits: list[str], logs: Path) -> tuple[float, float]:
    groups = distinct_keys(repo, commits)
    group = next(g for g in groups.values() if len(g) >= 2)
    neighbour, target = group[0], group[-1]
    remove_images(client, LABEL_KEY, set(groups))
    base = DockerBuilder(repo, client).acquire(neighbour, logs)  # the key's full image (not timed)
    started = time.monotonic()
    full = DockerBuilder(repo, client, overlays=False).acquire(target, logs)
    full_s = time.monotonic() - started
    assert full.how == "built", full
    compiled = "RUN" in Path(full.log_path).read_text().split("COPY", 1)[-1].split("Using cache", 1)[0]
    assert compiled, "the full build came from the engine's layer cache; run the bench again"
    forget_layers(client, full.image)  # (the key tag moved to it; the neighbour's image keeps its labels)
    started = time.monotonic()
    overlay = DockerBuilder(repo, client).acquire(target, logs)
    overlay_s = time.monotonic() - started
    assert overlay.how == "overlay", overlay
    client.images.remove(overlay.image, force=True)
    forget_layers(client, base.image)
    return full_s, overlay_s


def bisect_once(client, repo: git.Repo, case, overlays: bool, prefetch: bool, root: Path) -> tuple[float, int, str]:
    """Wall seconds, steps and culprit of one exact bisection in containers, from an empty image cache.

    The real Evaluator (build, probe in a container, oracle) and the real search; only the loop is
    here, so the prefetcher can be told what the next step may need (speculative_queries).
    """
    from bisect_npu.builders.prefetch import Prefetcher, speculative_queries
    from bisect_npu.execute.docker import DockerExecutor
    from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.search import Evidence, Found, Next, SearchProblem, decide
    from bisect_npu.upstream import history

    remove_images(client, LABEL_COMMIT, {c.hexsha for c in repo.iter_commits("--all")})
    brange = history.resolve_range(repo, case.good_ref, case.bad_ref)
    positions = [brange.base, *brange.candidates]
    recipe = load_recipe(case.recipe)
    builder = Prefetcher(DockerBuilder(repo, client, overlays=overlays), root / "prefetch")
    started = time.monotonic()
    problem = SearchProblem(n=len(brange.candidates))
    evidence: dict[int, Evidence] = {}
    steps = 0
    with DockerExecutor(client) as executor:
        evaluator = Evaluator(builder, executor, root / "session", recipe=recipe)
        while isinstance(decision := decide(problem, evidence), Next):
            index = decision.queries[0].index
            if prefetch:
                builder.prefetch([positions[j] for j in speculative_queries(problem, evidence, [index])])
            verdict = evaluator.evaluate(EvaluationRequest(positions[index], recipe.trials.count)).verdict
            evidence[index] = evidence.get(index, Evidence()).add(verdict.kind.value)
            steps += 1
    builder.close()
    seconds = time.monotonic() - started
    culprit = positions[decision.index] if isinstance(decision, Found) else ""
    print(f"    prefetch saved {builder.seconds_saved():.1f} s of build time")
    return seconds, steps, culprit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-bisect", action="store_true", help="only the full vs overlay build pair")
    args = parser.parse_args()
    client = connect_engine()
    repo_path, manifest = ensure_upstream()
    repo = git.Repo(repo_path)
    case = manifest.case(manifest.default_case)
    commits = [c.hexsha for c in repo.iter_commits(f"{case.good_sha}..{case.bad_sha}", first_parent=True)][::-1]
    with tempfile.TemporaryDirectory(prefix="build-bench-") as tmp:
        root = Path(tmp)
        full_s, overlay_s = build_pair(client, repo, commits, root / "logs")
        print(f"full build    {full_s:7.2f} s (median of {REPEATS})")
        print(f"overlay build {overlay_s:7.2f} s (median of {REPEATS})   full/overlay = {full_s / overlay_s:.1f}x "
              "(goal >= 10x)")
        if args.skip_bisect:
            return
        rows = [("every candidate built", False, False), ("build avoidance", True, False),
                ("avoidance + prefetch", True, True)]
        baseline = None
        for name, overlays, prefetch in rows:
            seconds, steps, culprit = bisect_once(client, repo, case, overlays, prefetch, root / name[:5])
            baseline = baseline or seconds
            ok = "culprit ok" if culprit == case.culprit.sha else f"culprit WRONG ({culprit[:12]})"
            print(f"bisect: {name:<22} {seconds:7.1f} s  {steps} steps  {baseline / seconds:4.1f}x  {ok}")


if __name__ == "__main__":
    main()
