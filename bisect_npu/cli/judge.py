"""`bisect-npu judge`: run the recipe's oracle on observation files (the `git bisect run` protocol)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click


def _flat(figures: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for key, value in figures.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows.extend(_flat(value, f"{name}."))
        else:
            rows.append((name, json.dumps(value) if not isinstance(value, str) else value))
    return rows


@click.command()
@click.option("--recipe", "recipe_path", required=True, help="Recipe file or bundled recipe name.")
@click.option("--reference", "references", multiple=True, type=click.Path(dir_okay=False),
              help="Reference observation (the good end's, or a golden file); repeat for several.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.argument("observations", nargs=-1, required=True, type=click.Path(dir_okay=False))
def judge(recipe_path: str, references: tuple[str, ...], as_json: bool, observations: tuple[str, ...]) -> None:
    """Judge OBSERVATIONS with the recipe's oracle: exit 0 good, 1 bad, 125 undecided or skip; 128 when
    there is no verdict (unreadable input, unknown recipe, observations written for another recipe or
    another version of it, internal error), so `git bisect run` aborts."""
    from bisect_npu import api
    from bisect_npu.cli import reader_may_leave

    verdict = api.judge(recipe_path, observations, references or None)
    with reader_may_leave():  # `judge ... | head -1` still exits with the verdict's code
        if as_json:
            click.echo(json.dumps(verdict.model_dump(mode="json"), indent=2))
        elif sys.stdout.isatty():
            from rich.console import Console
            from rich.markup import escape
            from rich.table import Table

            colour = {"good": "green", "bad": "red", "skip": "yellow"}[verdict.kind.value]
            console = Console()
            console.print(f"[bold {colour}]{verdict.kind.value.upper()}[/] {escape(verdict.reason)}", markup=True,
                          highlight=False)
            table = Table("figure", "value")
            for name, value in _flat(verdict.figures):
                table.add_row(escape(name), escape(value))
            console.print(table)
        else:
            click.echo(f"verdict: {verdict.kind.value}")
            click.echo(f"reason: {verdict.reason}")
            click.echo(f"trials: {verdict.trials}")
            for name, value in _flat(verdict.figures):
                if (name, value) != ("trials", str(verdict.trials)):  # a stats verdict's figures repeat the line above
                    click.echo(f"{name}: {value}")
    # SystemExit, not click's Exit: click returns Exit codes from main(standalone_mode=False) instead of
    # exiting, and the exit code is this command's answer (the `git bisect run` protocol).
    sys.exit(api.VERDICT_EXIT[verdict.kind])
