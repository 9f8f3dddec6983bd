"""`bisect-npu record` and `bisect-npu align`: a reference recorded anywhere, two runs compared stage by stage."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command()
@click.option("--recipe", "recipe_path", required=True, help="Recipe file or bundled recipe name.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory the record is written to: new or empty, or an interrupted record of the same "
                   "recipe, which is finished.")
@click.option("--tree", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Source checkout to run the engine from (put on PYTHONPATH); default: the current "
                   "directory, then the installed packages.")
@click.option("--python", "python", type=click.Path(dir_okay=False, exists=True),
              help="Interpreter of the venv that holds the engine (vLLM, transformers); default: this one.")
@click.option("--commit", default="", help="What the tree is checked out at, kept in the manifest.")
@click.option("--timeout", "timeout_s", type=float, help="Seconds one case may run.  [default: 3600]")
@click.option("--force", is_flag=True, help="Overwrite the record already at --out.")
def record(recipe_path: str, out: Path, tree: Path | None, python: str | None, commit: str, timeout_s: float | None,
           force: bool) -> None:
    """Run each case of the recipe once on this host with its backend and keep it as a reference: the
    observations with top logprobs, every alignment stage, layer dumps, and where it ran."""
    from bisect_npu import api
    from bisect_npu.cli import note_kept

    again = api.record_command(recipe_path, out.resolve(), tree.resolve() if tree else None, commit)
    note_kept(f"the cases recorded so far are kept in {out}: `{again}` finishes the record")
    made = api.record(recipe_path, out, force=force, tree=tree, commit=commit, timeout_s=timeout_s, python=python)
    click.echo(f"recorded {len(made.observations)} case(s) of {made.recipe} on {made.where()}: {made.path}")


@click.command()
@click.argument("reference", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("candidate", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--recipe", "recipe_path", help="Run this recipe here as the candidate (into CANDIDATE, or a "
                                             "temporary directory) instead of reading a record.")
@click.option("--tree", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="With --recipe: the source checkout (at the ref to test) to run the engine from.")
@click.option("--json", "as_json", is_flag=True, help="Print the alignment as JSON.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the alignment as Markdown to this file.")
def align(reference: Path, candidate: Path | None, recipe_path: str | None, tree: Path | None, as_json: bool,
          markdown_path: Path | None) -> None:
    """Name the first stage where CANDIDATE leaves REFERENCE (chat template, token ids, forward pass and
    its first divergent module, sampler parameters, text). Exit 0 aligned, 1 diverged, 2 usage error."""
    from bisect_npu import api

    result = api.align(reference, candidate, recipe=recipe_path, tree=tree)
    if markdown_path is not None:
        try:
            markdown_path.write_text(result.to_markdown(), encoding="utf-8")
        except OSError as exc:
            raise api.UsageError(f"cannot write {markdown_path} ({exc.strerror}); pass --markdown with a path in "
                                 "an existing, writable directory") from None
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.to_markdown())
    sys.exit(result.exit_code)
