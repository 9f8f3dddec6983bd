"""`bisect-npu demo`: the embedded default. Bisect the bundled demo upstream on the CPU, end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import click

from bisect_npu.cli import note_session
from bisect_npu.defaults import SESSIONS_ROOT


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
@click.option("--session-root", type=click.Path(path_type=Path), default=SESSIONS_ROOT, show_default=True,
              help="Where the demo's sessions go (by default beside `run`'s, so `report` and `resume` find them).")
@click.option("--harness", type=click.Choice(["lm_eval", "aisbench"]), default="lm_eval", show_default=True,
              help="Case accuracy: the harness that scores each candidate (its venv: make harness-lmeval, "
                   "make harness-aisbench).")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary as the last line.")
@click.option("--quiet", is_flag=True, help="Plain log lines even on a terminal.")
def demo(case_name: str | None, seed: int, executor: Literal["local", "docker"], verify_fix: bool, session_root: Path,
         harness: Literal["lm_eval", "aisbench"], as_json: bool, quiet: bool) -> None:
    """Generate the demo upstream (once), bisect a case with its recipe, write the report."""
    from bisect_npu import api

    click.echo("preparing the demo upstream (generated once, then cached)...", err=True)
    upstream = api.demo_upstream(seed)
    cases = api.demo_cases(upstream, case_name, harness)
    click.echo(f"demo upstream: {upstream.repo} ({upstream.manifest.commit_count} commits, ground truth in the "
               "manifest beside it)", err=True)
    summaries = []
    worst = 0
    for case in cases:
        truth = case.truth
        click.echo(f"\n== case {case.name}: {truth.symptom}\n   bisecting {truth.good_ref}..{truth.bad_ref} "
                   f"with recipe {case.recipe}", err=True)
        outcome = api.run_demo_case(upstream, case, executor=executor, verify_fix=verify_fix,
                                    session_root=session_root, quiet=quiet or as_json, live=True,
                                    on_session=note_session)
        click.echo(outcome.result.message)
        click.echo(f"manifest culprit: {truth.culprit.sha[:12]} {truth.culprit.title} -> "
                   f"{'MATCH' if outcome.check.links[0][1] == truth.culprit.sha else 'MISMATCH'}")
        for line in outcome.check.lines()[1:]:
            click.echo(line)
        click.echo(f"report: {outcome.report}")
        summaries.append(outcome.summary())
        worst = max(worst, outcome.result.exit_code if outcome.match else 1)
    if as_json:  # one JSON object as the last line, as `run --json` ends; several cases under `cases`
        click.echo(json.dumps(summaries[0] if len(summaries) == 1 else
                              {"status": "matched" if worst == 0 else "mismatched", "exit_code": worst,
                               "cases": summaries}))
    raise SystemExit(worst)
