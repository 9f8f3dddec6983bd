"""`bisect-npu demo`: the embedded default. Bisect the bundled demo upstream on the CPU, end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import click

from bisect_npu.cli import note_session
from bisect_npu.errors import UsageError
from bisect_npu.journal import DEFAULT_ROOT


def _case_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("is empty; name a demo case, or `all` (leave the option out for the default case)")
    return value


@click.command()
@click.option("--case", "case_name", default=None, callback=_case_name,
              help="Demo case name, or `all` (default: the manifest's default).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated upstream.")
@click.option("--executor", type=click.Choice(["local", "docker"]), default="local", show_default=True)
@click.option("--verify-fix/--no-verify-fix", default=True, show_default=True,
              help="Apply the top fix proposals to the bad end and re-run the oracle.")
@click.option("--session-root", type=click.Path(path_type=Path), default=DEFAULT_ROOT, show_default=True,
              help="Where the demo's sessions go (by default beside `run`'s, so `report` and `resume` find them).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary as the last line.")
@click.option("--quiet", is_flag=True, help="Plain log lines even on a terminal.")
def demo(case_name: str | None, seed: int, executor: Literal["local", "docker"], verify_fix: bool, session_root: Path,
         as_json: bool, quiet: bool) -> None:
    """Generate the demo upstream (once), bisect a case with its recipe, write the report."""
    from bisect_npu import api
    from bisect_npu.demo.check import check_case
    from bisect_npu.demo.generate import ensure_upstream
    from bisect_npu.journal import new_session_dir

    click.echo("preparing the demo upstream (generated once, then cached)...", err=True)
    repo, manifest = ensure_upstream(seed)
    names = [c.name for c in manifest.cases] if case_name == "all" else [case_name or manifest.default_case]
    known = {c.name for c in manifest.cases}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown demo case {unknown[0]!r}; known: {', '.join(sorted(known))}, all")
    click.echo(f"demo upstream: {repo} ({manifest.commit_count} commits, ground truth in the manifest beside it)",
               err=True)
    summaries = []
    worst = 0
    for name in names:
        truth = manifest.case(name)
        click.echo(f"\n== case {name}: {truth.symptom}\n   bisecting {truth.good_ref}..{truth.bad_ref} "
                   f"with recipe {truth.recipe}", err=True)
        # A case whose culprit moves a dependency's pin crosses into the generated dependency's clone.
        dep_repos = [f"{truth.dependency.name}={manifest.dependency(truth.dependency.name).repo}"] if (
            truth.dependency) else []
        request = api.RunRequest.of(good=truth.good_ref, bad=truth.bad_ref, repo=str(repo), recipe=truth.recipe,
                                    executor=executor, verify_fix=verify_fix, dep_repos=dep_repos)
        session_root.mkdir(parents=True, exist_ok=True)
        top = new_session_dir(session_root).resolve()
        result = api.bisect(request, session_dir=top, quiet=quiet or as_json, live=True, on_session=note_session)
        md_path = top / "report.md"  # the top level's, which shows the finer level's answer
        check = check_case(truth, top)
        matches = check.match
        click.echo(result.message)
        click.echo(f"manifest culprit: {truth.culprit.sha[:12]} {truth.culprit.title} -> "
                   f"{'MATCH' if check.links[0][1] == truth.culprit.sha else 'MISMATCH'}")
        for line in check.lines()[1:]:
            click.echo(line)
        click.echo(f"report: {md_path}")
        summary: dict[str, Any] = {"case": name, "status": result.status, "culprit": check.links[0][1],
                                   "expected": truth.culprit.sha, "match": matches, "report": str(md_path)}
        if truth.dependency:
            summary["dependency"] = check.summary()
        summaries.append(summary)
        worst = max(worst, result.exit_code if matches else 1)
    if as_json:
        click.echo(json.dumps(summaries if len(summaries) > 1 else summaries[0]))
    raise SystemExit(worst)
