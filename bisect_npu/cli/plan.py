"""`bisect-npu plan`: resolve a range and show what a bisection of it would cost, running nothing."""

from __future__ import annotations

import json
from typing import Any

import click

PLAN_CULPRITS = 64  # culprit positions the estimate averages over (all of them in a smaller range)


@click.command()
@click.option("--good", required=True, help="A ref where the model behaves.")
@click.option("--bad", required=True, help="A ref where it misbehaves.")
@click.option("--repo", default=".", show_default=True, help="Path or URL of the upstream repository.")
@click.option("--build-minutes", type=click.FloatRange(0), default=30.0, show_default=True,
              help="Cost of one full build (the first commit of a build key).")
@click.option("--overlay-minutes", type=click.FloatRange(0), default=2.0, show_default=True,
              help="Cost of a python-only overlay on a built key's image.")
@click.option("--run-minutes", type=click.FloatRange(0, min_open=True), default=5.0, show_default=True,
              help="Cost of one step's probe run.")
@click.option("--dockerfile", default="Dockerfile", show_default=True,
              help="The Dockerfile that builds the images (a recipe's build.dockerfile): Dockerfile.a3, ...")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan(good: str, bad: str, repo: str, build_minutes: float, overlay_minutes: float, run_minutes: float,
         dockerfile: str, as_json: bool) -> None:
    """Resolve GOOD..BAD: candidates, merge-base note, build groups, expected steps and cost.

    The expected figures replay the real exact-mode search (which picks its pivots by build
    cost, as a session with container builds does) over culprits spread across the range, next
    to plain midpoint bisection of the same range.
    """
    from bisect_npu import history
    from bisect_npu.build.key import BuildKeyReader

    git_repo = history.open_repo(repo)
    brange = history.resolve_range(git_repo, good, bad)
    n = len(brange.candidates)
    reader = BuildKeyReader(git_repo, dockerfile=dockerfile)
    build_keys = [reader.key(sha) for sha in (brange.base, *brange.candidates)]
    keys = [key.digest for key in build_keys]
    groups: dict[str, list[str]] = {}
    inputs: dict[str, dict[str, str]] = {}
    lacking: list[str] = []
    for sha, key in zip(brange.candidates, build_keys[1:], strict=True):
        groups.setdefault(key.digest, []).append(sha)
        inputs.setdefault(key.digest, {"base_image": key.inputs.get("base_image", ""),
                                       "vllm_tag": key.inputs.get("vllm_tag", "")})
        if not key.has_dockerfile:
            lacking.append(sha)
    costs = {"build_cost_min": build_minutes, "overlay_cost_min": overlay_minutes, "run_cost_min": run_minutes}
    expected = {told: _expected(n, keys, told, costs) for told in (True, False)}
    facts = history.commits_facts(git_repo, [brange.candidates[0], brange.candidates[-1]])
    summary: dict[str, Any] = {
        "good": brange.good, "bad": brange.bad, "base": brange.base,
        "merge_base_note": brange.merge_base_note, "candidates": n,
        "first": {"sha": facts[0].sha, "title": facts[0].title},
        "last": {"sha": facts[-1].sha, "title": facts[-1].title},
        "build_keys": len(groups),
        "build_groups": [{"key": key, "commits": len(shas), "first": shas[0], **inputs[key]}
                         for key, shas in groups.items()],
        "dockerfile": dockerfile, "lacking_dockerfile": len(lacking),
        "expected": expected[True], "midpoint": expected[False],
        "minutes": {"build": build_minutes, "overlay": overlay_minutes, "run": run_minutes},
    }
    if as_json:
        click.echo(json.dumps(summary))
        return
    if brange.merge_base_note:
        click.echo(f"note: {brange.merge_base_note}")
    click.echo(f"candidates: {n} first-parent commits in ({brange.base[:12]}, {brange.bad[:12]}]")
    click.echo(f"  oldest: {facts[0].sha[:12]} {facts[0].title}")
    click.echo(f"  newest: {facts[-1].sha[:12]} {facts[-1].title}")
    click.echo(f"distinct build keys: {len(groups)} (the other candidates reuse a compiled image + python overlay)")
    for group in summary["build_groups"]:
        made_of = ", ".join(f"{label} {group[name]}" for name, label in (("base_image", "FROM"),
                                                                           ("vllm_tag", "VLLM_TAG")) if group[name])
        click.echo(f"  key {group['key']}: {group['commits']} commits from {group['first'][:12]}"
                   + (f" ({made_of})" if made_of else ""))
    if lacking:
        click.echo(f"warning: {len(lacking)} of {n} candidates have no {dockerfile} (from {lacking[0][:12]}"
                   f"{f' to {lacking[-1][:12]}' if len(lacking) > 1 else ''}): with --executor docker they "
                   "cannot be built and are skipped; bisect a range where it exists")
    for label, figures in (("expected", expected[True]), ("plain midpoint bisection", expected[False])):
        click.echo(f"{label}: {figures['steps']:.1f} steps (end checks included, at most {figures['max_steps']}), "
                   f"{figures['full_builds']:.1f} full builds, {figures['overlays']:.1f} overlays, "
                   f"{figures['hours']:.2f} h")
    click.echo(f"  at {build_minutes:g} min/build, {overlay_minutes:g} min/overlay, {run_minutes:g} min/run, "
               f"averaged over {expected[True]['culprits']} culprit positions")


def _expected(n: int, keys: list[str], told: bool, costs: dict[str, float]) -> dict[str, float]:
    """The exact search's figures over culprits spread evenly across 1..n (a perfect oracle)."""
    from bisect_npu.simulate import simulate

    count = min(n, PLAN_CULPRITS)
    culprits = sorted({1 + (i * (n - 1)) // max(count - 1, 1) for i in range(count)})
    summary = simulate(n, culprits, bad_rate=1.0, good_rate=0.0, mode="exact", runs=1,
                       build_key_of=keys.__getitem__, tell_build_groups=told, build_cost_min=costs["build_cost_min"],
                       overlay_cost_min=costs["overlay_cost_min"], run_cost_min=costs["run_cost_min"])
    return {"steps": round(summary.mean_trials, 2), "max_steps": int(summary.max_trials),
            "full_builds": round(summary.mean_builds, 2), "overlays": round(summary.mean_overlays, 2),
            "hours": round(summary.mean_machine_hours, 2), "culprits": len(culprits)}
