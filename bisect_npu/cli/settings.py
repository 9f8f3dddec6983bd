"""`bisect-npu settings`: which setting breaks it, at one commit (ddmin over the differing keys)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import click

from bisect_npu.cli import started
from bisect_npu.cli.params import FiniteRange
from bisect_npu.defaults import TRIAL_TIMEOUT_S


@click.command()
@click.option("--repo", help="The upstream repository [default: . , or the --after session's].")
@click.option("--at", "ref", help="The commit the settings are searched at (the bad end) [default with --after: "
                                  "that session's culprit].")
@click.option("--recipe", help="The bad case: a recipe file or bundled name [default with --after: its recipe].")
@click.option("--good-set", "good_set", multiple=True, metavar="KEY=VALUE",
              help="The good variant: the recipe with KEY set to VALUE (YAML: true, 1.3, null unsets), e.g. "
                   "engine.args.async_scheduling=false, cases[*].sampling.repetition_penalty=1.0, "
                   "environment.HCCL_DETERMINISTIC=true. Repeat for each key.")
@click.option("--good-recipe", "good_recipe", help="The good variant as a second recipe of the same case.")
@click.option("--vary", multiple=True, metavar="KEY=V1,V2,...",
              help="An open question: is KEY needed? The good variant takes V1; the others are each checked in "
                   "place of the bad value once the trigger is known. Repeat for each key.")
@click.option("--mode", type=click.Choice(["exact", "noisy"]), help="How a configuration is judged [default: the "
                                                                    "recipe's trials.mode].")
@click.option("--confidence", type=FiniteRange(0.5, 1.0, min_open=True, max_open=True),
              help="Noisy mode: how sure each configuration's verdict must be [default: the recipe's].")
@click.option("--executor", type=click.Choice(["local", "docker", "ray"]), default="local", show_default=True,
              help="Where the commit is built and run: a git worktree or a container image (built once); ray is "
                   "refused (every configuration shares this host's one build).")
@click.option("--devices", help="NPU cards every configuration's engine runs on, e.g. 0-1 (one at a time).")
@click.option("--dep-repo", "dep_repos", multiple=True, metavar="NAME=PATH_OR_URL",
              help="A clone of a dependency the recipe declares, laid into the build at the commit's pin.")
@click.option("--timeout", "timeout_s", type=FiniteRange(0.0, min_open=True), default=TRIAL_TIMEOUT_S,
              show_default=True, help="Seconds one trial may run.")
@click.option("--session", "session_dir", type=click.Path(file_okay=False, path_type=Path),
              help="The search's directory; one holding a settings search continues it [default: a new session, "
                   "or the --after session's settings/].")
@click.option("--after", "after", type=click.Path(file_okay=False, path_type=Path),
              help="A finished commit session: search the settings at its culprit, with its repository and recipe; "
                   "its report gains the Settings section.")
@click.option("--reference-at", "reference_at", metavar="REF",
              help="A commit where the case is good (the commit search's good end): each configuration is judged "
                   "against its own output there, run once. Needed where the recipe compares with the good end's "
                   "output and the output length (or, for a throughput, the load) is a key [default with --after, "
                   "where needed: that session's good end].")
@click.option("--verdict-store", "verdict_store", type=click.Path(dir_okay=False, path_type=Path),
              help="The verdict store sessions share (a configuration's verdict is kept under its own recipe "
                   "digest) [default: $BISECT_NPU_VERDICT_STORE, else verdicts.sqlite in the cache].")
@click.option("--no-verdict-store", "no_verdict_store", is_flag=True, help="Neither reuse nor keep verdicts.")
@click.option("--json", "as_json", is_flag=True, help="End stdout with one JSON line: status, exit_code, trigger, "
                                                      "configurations, session, report.")
def settings(repo: str | None, ref: str | None, recipe: str | None, good_set: tuple[str, ...],
             good_recipe: str | None, vary: tuple[str, ...], mode: Literal["exact", "noisy"] | None,
             confidence: float | None, executor: Literal["local", "docker", "ray"], devices: str | None,
             dep_repos: tuple[str, ...], timeout_s: float,
             session_dir: Path | None, after: Path | None, reference_at: str | None, verdict_store: Path | None,
             no_verdict_store: bool, as_json: bool) -> None:
    """Find the smallest set of settings that turns the good variant bad at one commit.

    The recipe is the bad case; --good-set, --good-recipe or --vary give a good variant. Delta
    debugging over the keys they differ in names the trigger: each of its keys is needed (set back,
    the case is good), the others are not. Exit 0 with a trigger, 4 when the recipe is not bad or
    the good variant is not good there, 2 for a bad key or value.
    """
    from bisect_npu import api

    if verdict_store is not None and no_verdict_store:
        raise click.UsageError("--verdict-store and --no-verdict-store contradict each other; give one")
    result = api.search_settings(repo=repo, ref=ref, recipe=recipe, good_set=good_set, good_recipe=good_recipe,
                                 vary=vary, mode=mode, confidence=confidence, executor=executor, devices=devices,
                                 dep_repos=dep_repos, timeout_s=timeout_s, session_dir=session_dir, after=after,
                                 verdict_store=verdict_store, no_verdict_store=no_verdict_store,
                                 reference_at=reference_at, on_session=started)
    click.echo(result.message)
    click.echo(f"report: {result.report}")
    if as_json:
        click.echo(json.dumps({"status": result.status, "exit_code": result.exit_code, "trigger": result.trigger,
                               "configurations": result.configurations, "session": str(result.session_dir),
                               "report": str(result.report), "report_json": str(result.report_json)}))
    raise SystemExit(result.exit_code)
