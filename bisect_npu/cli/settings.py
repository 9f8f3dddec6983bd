"""`bisect-npu settings`: which setting breaks it, at one commit (ddmin over the differing keys).

Its run options are `run`'s, made from the same request fields (`cli/run.py`), so every executor
option a commit search takes a settings search takes too; its own are the commit (`--at`), the
good variant, the session it follows and the reference commit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from bisect_npu.cli import started
from bisect_npu.cli.run import request_options, request_parts

# The request fields a search at one commit reads: where and how its runs are built and made, how a
# configuration is judged and the verdict store; not the range, the levels or the fix stage.
SETTINGS_FIELDS = {"range": {"repo"}, "judge": {"recipe", "timeout_s", "timeout_is", "retries"},
                   "search": {"mode", "confidence", "dependencies", "dep_repos"}}
WHOLE_PARTS = {"executor", "store"}


def taken(part: str, name: str) -> bool:
    return part in WHOLE_PARTS or name in SETTINGS_FIELDS.get(part, set())


def run_settings(ref: str | None, good_set: tuple[str, ...], good_recipe: str | None, vary: tuple[str, ...],
                 session_dir: Path | None, after: Path | None, reference_at: str | None, as_json: bool,
                 quiet: bool, **values: Any) -> None:
    """Find the smallest set of settings that turns the good variant bad at one commit.

    The recipe is the bad case; --good-set, --good-recipe or --vary give a good variant. Delta
    debugging over the keys they differ in names the trigger: each of its keys is needed (set back,
    the case is good), the others are not. Exit 0 with a trigger, 4 when the recipe is not bad or
    the good variant is not good there, 3 when configurations the trigger rests on could not be
    judged, 5 when the host's failures (an engine that does not start, a busy card) left one
    unjudged after --retries: free the host and run the same command again.
    """
    from bisect_npu import api

    fields = {name: value for part in request_parts(values, taken=taken).values() for name, value in part.items()}
    result = api.search_settings(ref=ref, good_set=good_set, good_recipe=good_recipe, vary=vary,
                                 session_dir=session_dir, after=after, reference_at=reference_at,
                                 on_session=started, quiet=quiet or as_json, live=True, **fields)
    click.echo(result.message)
    click.echo(f"report: {result.report}")
    if as_json:
        click.echo(json.dumps({"status": result.status, "exit_code": result.exit_code, "trigger": result.trigger,
                               "configurations": result.configurations, "session": str(result.session_dir),
                               "report": str(result.report), "report_json": str(result.report_json)}))
    raise SystemExit(result.exit_code)


settings = click.Command("settings", callback=run_settings, help=run_settings.__doc__, params=[
    click.Option(["--at", "ref"], help="The commit the settings are searched at (the bad end) [default with "
                                       "--after: that session's culprit]."),
    click.Option(["--good-set", "good_set"], multiple=True, metavar="KEY=VALUE",
                 help="The good variant: the recipe with KEY set to VALUE (YAML: true, 1.3, null unsets), e.g. "
                      "engine.args.async_scheduling=false, cases[*].sampling.repetition_penalty=1.0, "
                      "environment.HCCL_DETERMINISTIC=true. Repeat for each key."),
    click.Option(["--good-recipe", "good_recipe"], help="The good variant as a second recipe of the same case."),
    click.Option(["--vary"], multiple=True, metavar="KEY=V1,V2,...",
                 help="An open question: is KEY needed? The good variant takes V1; the others are each checked in "
                      "place of the bad value once the trigger is known. Repeat for each key."),
    *request_options(taken=taken),
    click.Option(["--session", "session_dir"], type=click.Path(file_okay=False, path_type=Path),
                 help="The search's directory; one holding a settings search continues it [default: a new session, "
                      "or the --after session's settings/]."),
    click.Option(["--after"], type=click.Path(file_okay=False, path_type=Path),
                 help="A finished commit session: search the settings at its culprit, with its repository and "
                      "recipe (unless --repo or --recipe are given); its report gains the Settings section."),
    click.Option(["--reference-at", "reference_at"], metavar="REF",
                 help="A commit where the case is good (the commit search's good end): each configuration is judged "
                      "against its own output there, run once. Needed where the recipe compares with the good end's "
                      "output and the output length (or, for a throughput, the load) is a key [default with --after, "
                      "where needed: that session's good end]."),
    click.Option(["--json", "as_json"], is_flag=True, help="End stdout with one JSON line: status, exit_code, "
                                                           "trigger, configurations, session, report."),
    click.Option(["--quiet"], is_flag=True, help="Plain log lines even on a terminal."),
])
