"""`bisect-npu fix`: rank (and with --verify, prove) the upstream commits that fix a culprit."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal

import click

from bisect_npu.defaults import VERIFY_TOP

if TYPE_CHECKING:
    from bisect_npu.api import Fixes


@click.command()
@click.option("--culprit", required=True, help="The commit that introduced the regression (sha, tag, branch).")
@click.option("--repo", "repo_path", default=".", show_default=True, help="Clone of the upstream, or its URL.")
@click.option("--bad", help="The bad end: its branch is searched, and --verify applies fixes onto it.")
@click.option("--top", default=5, show_default=True, type=click.IntRange(min=1), help="Proposals to list.")
@click.option("--recipe", "recipe_path", help="Recipe: its symptom keywords rank fixes; --verify runs its bad case.")
@click.option("--keyword", "keywords", multiple=True, help="Extra symptom keyword (repeatable).")
@click.option("--cmd", "command", help="With --verify: oracle command instead of a recipe (exit 0 good).")
@click.option("--verify", is_flag=True,
              help="Apply the proposals to the bad end, best first, re-running the bad case until one works.")
@click.option("--verify-top", "verify_top", default=VERIFY_TOP, show_default=True, type=click.IntRange(min=1),
              help="With --verify: proposals tried at most.")
@click.option("--executor", type=click.Choice(["local", "docker"]), default="local", show_default=True,
              help="Where --verify runs the bad case.")
@click.option("--devices", help="With --verify: NPU cards each verification runs on, e.g. 0-7 (as `run`).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def fix(culprit: str, repo_path: str, bad: str | None, top: int, recipe_path: str | None,
        keywords: tuple[str, ...], command: str | None, verify: bool, verify_top: int,
        executor: Literal["local", "docker"], devices: str | None, as_json: bool) -> None:
    """Rank the later commits that fix CULPRIT, with the evidence for each."""
    from bisect_npu import api

    answer = api.fix(repo_path, culprit, bad=bad, top=top, recipe=recipe_path, keywords=keywords, command=command,
                     verify=verify, verify_top=verify_top, executor=executor, devices=devices)
    if as_json:
        click.echo(json.dumps(answer.to_json(), indent=2, default=str))
    else:
        _print(answer)


def _print(answer: Fixes) -> None:
    """A rich table on a terminal, plain unwrapped lines otherwise (pipes, logs, CI); then the reasons."""
    from rich.console import Console
    from rich.table import Table

    click.echo(f"culprit {answer.report.culprit[:10]}: {answer.report.note}")
    rows = answer.rows()
    console = Console(highlight=False)
    if rows and console.is_terminal:
        table = Table()
        for column in ("rank", "sha(s)", "branches", "confidence", "score", "PR", "title",
                       "verification")[:len(rows[0])]:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    else:
        for row in rows:
            click.echo("  ".join(row))
    for line in answer.reasons():
        click.echo(line)
