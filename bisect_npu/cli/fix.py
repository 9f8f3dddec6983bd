"""`bisect-npu fix`: rank (and with --verify, prove) the upstream commits that fix a culprit."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from bisect_npu.defaults import VERIFY_TOP
from bisect_npu.errors import UsageError

if TYPE_CHECKING:
    from bisect_npu.fix import FixReport, FixVerification


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
        keywords: tuple[str, ...], command: str | None, verify: bool, verify_top: int, executor: str,
        devices: str | None,
        as_json: bool) -> None:
    """Rank the later commits that fix CULPRIT, with the evidence for each."""
    from bisect_npu.execute.ascend import parse_devices
    from bisect_npu.fix import propose_fixes, verify_fixes
    from bisect_npu.orchestration.preflight import command_words
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.upstream.history import open_repo

    recipe = load_recipe(recipe_path) if recipe_path else None
    argv = command_words(command) if command else None
    cards = parse_devices(devices) if devices is not None else []
    if verify and ((recipe is None and not argv) or bad is None):
        raise UsageError("--verify needs --recipe or --cmd (the bad case to re-run) and --bad "
                         "(where to apply the fix)")
    repo = open_repo(repo_path)
    report = propose_fixes(repo, culprit, bad=bad, symptom=[*(recipe.symptom if recipe else []), *keywords],
                           top=max(top, verify_top if verify else 0))
    verifications: list[FixVerification] = []
    if verify and bad is not None:
        from bisect_npu.orchestration.wiring import fix_verifier

        with fix_verifier(repo_path, None if argv else recipe_path, command=argv,
                          executor="docker" if executor == "docker" else "local", devices=cards) as (evaluate, fixes):
            verifications = verify_fixes(repo, bad, report, evaluate, top=verify_top, workdir=fixes,
                                         check_bad=True)
    if as_json:
        click.echo(json.dumps(_as_json(report, verifications), indent=2, default=str))
    else:
        _print(report, verifications)


def _as_json(report: FixReport, verifications: list[FixVerification]) -> dict[str, Any]:
    """The same shapes as a session's journal (`fix` and `fix_verify` lines) and its JSON report."""
    from bisect_npu.contracts import to_jsonable

    data = {**to_jsonable(report), "verifications": to_jsonable(verifications)}
    if report.dependency is not None:
        data["dependency"]["message"] = report.dependency.message
    return data


def _print(report: FixReport, verifications: list[FixVerification]) -> None:
    """A rich table on a terminal, plain unwrapped lines otherwise (pipes, logs, CI); then the reasons."""
    from rich.console import Console
    from rich.table import Table

    from bisect_npu.contracts import some_branches

    status = {tuple(v.proposal.shas): v for v in verifications}
    ordered = [v.proposal for v in verifications] + [p for p in report.proposals if tuple(p.shas) not in status]
    click.echo(f"culprit {report.culprit[:10]}: {report.note}")
    rows = []
    for rank, proposal in enumerate(ordered, 1):
        row = [str(rank), " ".join(s[:10] for s in proposal.shas), some_branches(proposal.branches),
               f"{proposal.confidence:.0%}", f"{proposal.score:g}",
               proposal.pr_url or (f"#{proposal.pr}" if proposal.pr else "-"), proposal.title]
        if verifications:
            checked = status.get(tuple(proposal.shas))
            row.append(f"{checked.status}: {checked.detail}" if checked else "not tried")
        rows.append(row)
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
    for rank, proposal in enumerate(ordered, 1):
        click.echo(f"{rank}. {proposal.shas[0][:10]} {proposal.title}")
        for reason in proposal.reasons:
            click.echo(f"   {reason.weight:+g} {reason.signal}: {reason.detail}")
        for line in proposal.also_on:
            click.echo(f"   {line}")
        if proposal.missing_on:
            click.echo(f"   not yet on: {some_branches(proposal.missing_on)}")

