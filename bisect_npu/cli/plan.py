"""`bisect-npu plan`: resolve a range and show what a bisection of it would cost, running nothing."""

from __future__ import annotations

import json
import math

import click


@click.command()
@click.option("--good", required=True, help="A ref where the model behaves.")
@click.option("--bad", required=True, help="A ref where it misbehaves.")
@click.option("--repo", default=".", show_default=True, help="Path or URL of the upstream repository.")
@click.option("--build-minutes", type=float, default=30.0, show_default=True, help="Cost of one full build.")
@click.option("--overlay-minutes", type=float, default=2.0, show_default=True, help="Cost of a python-only overlay.")
@click.option("--run-minutes", type=float, default=5.0, show_default=True, help="Cost of one probe run.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan(good: str, bad: str, repo: str, build_minutes: float, overlay_minutes: float, run_minutes: float,
         as_json: bool) -> None:
    """Resolve GOOD..BAD: candidates, merge-base note, build groups, expected steps and cost."""
    from bisect_npu import history
    from bisect_npu.build.key import distinct_keys

    git_repo = history.open_repo(repo)
    brange = history.resolve_range(git_repo, good, bad)
    n = len(brange.candidates)
    keys = distinct_keys(git_repo, list(brange.candidates))
    steps = math.ceil(math.log2(n)) + 2 if n > 1 else 2
    # Each step builds one commit; a new build key costs a full build, the rest are overlays.
    full_builds = min(steps, len(keys))
    minutes = full_builds * build_minutes + (steps - full_builds) * overlay_minutes + steps * run_minutes
    facts = history.commits_facts(git_repo, [brange.candidates[0], brange.candidates[-1]])
    summary = {
        "good": brange.good, "bad": brange.bad, "base": brange.base,
        "merge_base_note": brange.merge_base_note, "candidates": n,
        "first": {"sha": facts[0].sha, "title": facts[0].title},
        "last": {"sha": facts[-1].sha, "title": facts[-1].title},
        "build_keys": len(keys),
        "build_groups": [{"key": key, "commits": len(shas), "first": shas[0]} for key, shas in keys.items()],
        "expected_steps": steps, "worst_case_full_builds": full_builds,
        "estimated_hours": round(minutes / 60, 2),
    }
    if as_json:
        click.echo(json.dumps(summary))
        return
    if brange.merge_base_note:
        click.echo(f"note: {brange.merge_base_note}")
    click.echo(f"candidates: {n} first-parent commits in ({brange.base[:12]}, {brange.bad[:12]}]")
    click.echo(f"  oldest: {facts[0].sha[:12]} {facts[0].title}")
    click.echo(f"  newest: {facts[-1].sha[:12]} {facts[-1].title}")
    click.echo(f"distinct build keys: {len(keys)} (the other candidates reuse a compiled image + python overlay)")
    for group in summary["build_groups"]:
        click.echo(f"  key {group['key']}: {group['commits']} commits from {group['first'][:12]}")
    click.echo(f"expected steps: {steps} (ceil(log2 {n}) + 2 end checks), at most {full_builds} full builds")
    click.echo(f"estimated time: {summary['estimated_hours']} h at {build_minutes:g} min/build, "
               f"{overlay_minutes:g} min/overlay, {run_minutes:g} min/run")
