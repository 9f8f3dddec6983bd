"""`bisect-npu ci`: the steps of the GitHub Actions composite action (action.yml). Each option
also reads the environment variable named in its help, which is how the action hands its inputs
over (a `${{ }}` expression inside a `run:` script could inject shell)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


@click.group()
def ci() -> None:
    """Steps of the GitHub Actions action: bisect (or resume a retried job), then open or update the issue."""


@ci.command("bisect")
@click.option("--good", envvar="BISECT_NPU_CI_GOOD", default="last-good", show_default=True, show_envvar=True,
              help="The good ref, or last-good.")
@click.option("--bad", envvar="BISECT_NPU_CI_BAD", required=True, show_envvar=True, help="The bad ref.")
@click.option("--repo", envvar="BISECT_NPU_CI_REPO", default=".", show_default=True, show_envvar=True,
              help="The clone to bisect (full history and submodules).")
@click.option("--recipe", envvar="BISECT_NPU_CI_RECIPE", default="", show_envvar=True, help="Recipe file or name.")
@click.option("--cmd", "command", envvar="BISECT_NPU_CI_CMD", default="", show_envvar=True,
              help="Oracle command instead of a recipe.")
@click.option("--executor", envvar="BISECT_NPU_CI_EXECUTOR", default="docker", show_default=True,
              show_envvar=True, help="local, docker or ray.")
@click.option("--devices", envvar="BISECT_NPU_CI_DEVICES", default="", show_envvar=True, help="NPU cards, e.g. 0-7.")
@click.option("--verdict-store", "verdict_store", envvar="BISECT_NPU_CI_VERDICT_STORE", default="", show_envvar=True,
              help="The verdict store file [default: run's].")
@click.option("--args", "args", envvar="BISECT_NPU_CI_ARGS", default="", show_envvar=True,
              help="More `bisect-npu run` options, split as a shell would (no shell runs them).")
@click.option("--matrix", "matrix", envvar="BISECT_NPU_CI_MATRIX", default="", show_envvar=True,
              help="The job's matrix values (toJSON(matrix)): legs of one job that differ there get sessions of "
                   "their own.")
@click.option("--session", "session", envvar="BISECT_NPU_CI_SESSION", default="", show_envvar=True,
              help="Session directory [default: one per repository, run and job under the cache directory, "
                   "which a retried job finds again].")
def bisect(good: str, bad: str, repo: str, recipe: str, command: str, executor: str, devices: str,
           verdict_store: str, args: str, matrix: str, session: str) -> None:
    """Bisect, or resume the session of a retried job (GITHUB_RUN_ATTEMPT > 1); report to the job
    summary, answer to the step's outputs. Exits 0 for an answer (or no regression since last-good)."""
    from bisect_npu import api

    inputs = api.BisectInputs(good=good, bad=bad, repo=repo, recipe=recipe, command=command, executor=executor,
                              devices=devices, verdict_store=verdict_store, args=args, matrix=matrix)
    sys.exit(api.ci_bisect(inputs, os.environ, session or None))


@ci.command("issue")
@click.option("--report-json", "report_json", envvar="BISECT_NPU_CI_REPORT_JSON", required=True, show_envvar=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path), help="The session's report.json.")
@click.option("--repository", envvar="BISECT_NPU_CI_ISSUE_REPO", required=True, show_envvar=True,
              help="owner/name of the repository the issues go to.")
@click.option("--label", envvar="BISECT_NPU_CI_ISSUE_LABEL", default="bisect-npu-regression", show_default=True,
              show_envvar=True, help="The label of bisect-npu's issues.")
def issue(report_json: Path, repository: str, label: str) -> None:
    """Open the culprit's issue, or comment on the one already filed for it (found by its marker)."""
    from bisect_npu import api

    outputs = api.ci_issue(report_json, repository, os.environ, label)
    click.echo(f"issue {outputs['issue-action']}: {outputs['issue'] or '-'}")


@ci.command("comment")
@click.option("--body", envvar="BISECT_NPU_CI_COMMENT", required=True, show_envvar=True,
              help="The comment's text (`/bisect <case> [--good REF] [--bad REF]`).")
@click.option("--repo", envvar="BISECT_NPU_CI_REPO", default=".", show_default=True, show_envvar=True,
              help="The clone the case is looked up in (at the bad ref).")
@click.option("--good-table", "good_table", envvar="BISECT_NPU_CI_GOOD_TABLE", default="", show_envvar=True,
              help="The runner's nightly good_table.csv: `--good last-good` reads it [default: the verdict store].")
@click.option("--soc", envvar="BISECT_NPU_CI_SOC", default="", show_envvar=True,
              help="The runner's SoC for --good-table (a2, a3).")
def comment(body: str, repo: str, good_table: str, soc: str) -> None:
    """Parse a `/bisect` comment into the step outputs `good`, `bad`, `case` and `args` (the
    `bisect-npu run` options for the action's `args`)."""
    from bisect_npu import api

    asked = api.ci_comment(body, os.environ, repo=repo, good_table=good_table, soc=soc)
    click.echo(f"/bisect {asked.case}: good {asked.good}, bad {asked.bad}")
