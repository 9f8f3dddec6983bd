"""`bisect-npu plan`: resolve a range and show what a bisection of it would cost, running nothing."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

import click

from bisect_npu.cli.params import FiniteRange

if TYPE_CHECKING:
    from bisect_npu.api import Plan


@click.command()
@click.option("--good", "--old", "good", required=True,
              help="A ref where the model behaves (with --find-fix: the old end, where it misbehaves).")
@click.option("--bad", "--new", "bad", required=True,
              help="A ref where it misbehaves (with --find-fix: the new end, where it is fixed).")
@click.option("--find-fix", is_flag=True, help="Plan a search for the fix (as `run --find-fix`): the old end shows "
                                               "the symptom, the new end not; warns where the search would start "
                                               "from a merge-base that may not show it.")
@click.option("--repo", default=".", show_default=True, help="Path or URL of the upstream repository.")
@click.option("--build-minutes", type=FiniteRange(0), default=30.0, show_default=True,
              help="Cost of one full build (the first commit of a build key).")
@click.option("--overlay-minutes", type=FiniteRange(0), default=2.0, show_default=True,
              help="Cost of a python-only overlay on a built key's image.")
@click.option("--run-minutes", type=FiniteRange(0, min_open=True),
              help="Cost of one step's probe or command run [default: 5 for images; none with --cmd: the "
                   "hours are shown only when the command's time is given].")
@click.option("--cmd", "command", help="Plan a run with this oracle command (as `run --cmd`): candidates are "
                                       "checked out, nothing is built, unless --executor docker.")
@click.option("--executor", type=click.Choice(["local", "docker"]),
              help="How the run would test candidates: checkouts (local) or images (docker) [default: local with "
                   "--cmd, as `run`; else docker, whose build keys and costs are the plan's subject].")
@click.option("--dockerfile",
              help="The Dockerfile that builds the images: Dockerfile.a3, ... [default: the recipe's "
                   "build.dockerfile, else Dockerfile]")
@click.option("--recipe", help="Recipe file or bundled name: its supported versions and its engine args are "
                               "checked at both ends, as `run` does.")
@click.option("--base-image-map", "base_image_map", multiple=True, metavar="PREFIX=MIRROR",
              help="Base images through a mirror, as `run --base-image-map` (repeatable; adds to the recipe's "
                   "build.base_image_map).")
@click.option("--release-images", metavar="TEMPLATE",
              help="Images published for release tags, e.g. quay.io/ascend/vllm-ascend:{tag}: count the keys a "
                   "release image stands for (no full build where it exists; --pull pulls them) [default: the "
                   "recipe's build.release_images].")
@click.option("--pull", is_flag=True,
              help="Pull every base image the range's builds need (through --base-image-map) into the container "
                   "engine now, before a long run: a registry that cannot be reached shows here (exit 5).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan(good: str, bad: str, repo: str, build_minutes: float, overlay_minutes: float, run_minutes: float | None,
         command: str | None, executor: Literal["local", "docker"] | None, dockerfile: str | None, recipe: str | None,
         base_image_map: tuple[str, ...], release_images: str | None, pull: bool, as_json: bool,
         find_fix: bool) -> None:
    """Resolve GOOD..BAD: candidates, merge-base note, build groups, expected steps and cost.

    The expected figures replay the real exact-mode search (which picks its pivots by build
    cost, as a session with container builds does) over culprits spread across the range, next
    to plain midpoint bisection of the same range.
    """
    from bisect_npu import api

    if command is not None and recipe is not None:
        raise click.UsageError("give either --recipe or --cmd (the oracle the run would use)")
    answer = api.plan(repo, good, bad, build_minutes=build_minutes, overlay_minutes=overlay_minutes,
                      run_minutes=run_minutes, command=command, executor=executor, dockerfile=dockerfile,
                      recipe=recipe, base_image_map=base_image_map, release_images=release_images, pull=pull,
                      find_fix=find_fix)
    if as_json:
        click.echo(json.dumps(answer.to_json()))
        return
    if answer.warning:
        click.echo(f"warning: {answer.warning}")
    if answer.executor == "local":
        _print_checkouts(answer)
    else:
        _print_images(answer)
    if recipe is not None:
        from bisect_npu.cli.recipes import node_lines

        for line in node_lines(api.recipe_plan(recipe)["engine"].get("nodes", [])):
            click.echo(line)


def _print_images(answer: Plan) -> None:
    result = answer.range_plan
    for image, image_id in (answer.pulled or {}).items():
        click.echo(f"pulled {image} ({image_id.removeprefix('sha256:')[:12]})")
    for image, note in answer.published.items():
        click.echo(f"{'pulled' if note.startswith('sha256:') else 'not used'} {image}: {note}")
    brange, n, lacking = result.range, len(result.range.candidates), result.lacking_dockerfile
    dockerfile = result.dockerfile
    if brange.merge_base_note:
        click.echo(f"note: {brange.merge_base_note}")
    click.echo(f"candidates: {n} first-parent commits in ({brange.base[:12]}, {brange.bad[:12]}]")
    click.echo(f"  oldest: {result.oldest.sha[:12]} {result.oldest.title}")
    click.echo(f"  newest: {result.newest.sha[:12]} {result.newest.title}")
    click.echo(f"distinct build keys: {len(result.groups)} of {dockerfile} (the other candidates reuse a compiled "
               "image + python overlay)")
    for group in result.groups:
        made_of = ", ".join(f"{label} {value}" for label, value in (("FROM", group.base_image),
                                                                     ("vLLM", group.vllm_tag)) if value)
        click.echo(f"  key {group.key}: {group.commits} commits from {group.first[:12]}"
                   + (f" ({made_of})" if made_of else "") + (f", pulled from {group.pull}" if group.pull else ""))
    if answer.release_images:
        click.echo(f"release images: {len(result.released)} of the range's keys are a release's build "
                   "(no full build where its image exists)")
        for key, release in result.released.items():
            click.echo(f"  key {key}: {release.image} ({release.tag})")
    for end in result.ends_lacking_dockerfile:
        click.echo(f"warning: the {end} end has no {dockerfile}: `run --executor docker` refuses this range "
                   "(pick ends where it exists)")
    if lacking:
        click.echo(f"warning: {len(lacking)} of {n} candidates have no {dockerfile} (from {lacking[0][:12]}"
                   f"{f' to {lacking[-1][:12]}' if len(lacking) > 1 else ''}): with --executor docker they "
                   "cannot be built and are skipped; bisect a range where it exists")
    for label, figures in (("expected", result.expected), ("plain midpoint bisection", result.midpoint)):
        click.echo(f"{label}: {figures.steps:.1f} steps (end checks included, at most {figures.max_steps}), "
                   f"{figures.full_builds:.1f} full builds, {figures.overlays:.1f} overlays, {figures.hours:.2f} h")
    click.echo(f"  at {answer.build_minutes:g} min/build, {answer.overlay_minutes:g} min/overlay, "
               f"{answer.run_minutes:g} min/run, averaged over {result.expected.culprits} culprit positions")


def _print_checkouts(answer: Plan) -> None:
    """A run that checks candidates out (`--cmd`, `--executor local`): no image, no build key;
    steps, and hours only from a declared run time."""
    result = answer.range_plan
    brange, figures = result.range, result.expected
    if brange.merge_base_note:
        click.echo(f"note: {brange.merge_base_note}")
    click.echo(f"candidates: {len(brange.candidates)} first-parent commits in ({brange.base[:12]}, {brange.bad[:12]}]")
    click.echo(f"  oldest: {result.oldest.sha[:12]} {result.oldest.title}")
    click.echo(f"  newest: {result.newest.sha[:12]} {result.newest.title}")
    click.echo(f"expected: {figures.steps:.1f} steps (end checks included, at most {figures.max_steps}), each a "
               "checkout of the candidate and one run; nothing is built")
    if figures.hours is None:
        click.echo("  time: steps x the command's own time (give --run-minutes for hours)")
    else:
        click.echo(f"  time: {figures.hours:.2f} h at {answer.run_minutes:g} min/run, averaged over "
                   f"{figures.culprits} culprit positions")
