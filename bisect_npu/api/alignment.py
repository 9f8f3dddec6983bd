"""Precision alignment without bisecting: `record` a reference on any host where the recipe's backend
runs, and `align` two records stage by stage (`bisect-npu record`, `bisect-npu align`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_npu.alignment.record import Record, is_record, read_record
from bisect_npu.errors import UsageError
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe

if TYPE_CHECKING:  # the comparison (numpy, the dump diff) is imported when align is called
    from bisect_npu.alignment.align import Alignment


def record(recipe: Recipe | str | Path, out: str | Path, *, force: bool = False, tree: str | Path | None = None,
           commit: str = "", timeout_s: float | None = None, python: str | None = None,
           env: dict[str, str] | None = None) -> Record:
    """Run each case of `recipe` once on this host (its engine from `tree`, a source checkout, or the
    installed packages; `python`: another venv's interpreter, `env`: variables it gets) and write a
    record to `out`: observations with top logprobs, every alignment
    stage, layer dumps (the recipe's capture.layers) and where it ran. Nothing is overwritten
    without `force`, and only a record even then."""
    from bisect_npu.orchestration.running.recording import DEFAULT_TIMEOUT_S
    from bisect_npu.orchestration.running.recording import record as run_record

    loaded = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    return run_record(loaded, Path(out), force=force, tree=Path(tree) if tree else None, commit=commit,
                      timeout_s=timeout_s or DEFAULT_TIMEOUT_S, python=python, env=env)


def align(reference: str | Path | Record, candidate: str | Path | Record | None = None, *,
          recipe: Recipe | str | Path | None = None, tree: str | Path | None = None) -> Alignment:
    """The first stage (and forward-pass module) where `candidate` leaves `reference`.

    Both are records; or `recipe` is given and the recipe runs here first (in `tree`, a checkout at
    the ref to test) into `candidate`, a new directory (a temporary one when left out)."""
    from bisect_npu.alignment.align import align_records

    ref = reference if isinstance(reference, Record) else read_record(reference)
    if isinstance(candidate, Record):
        return align_records(ref, candidate)
    if recipe is None:
        if candidate is None:
            raise UsageError("align needs a candidate: a record, or --recipe to run one here")
        return align_records(ref, read_record(candidate))
    if candidate and Path(candidate).exists() and (is_record(Path(candidate)) or any(Path(candidate).iterdir())):
        raise UsageError(f"{candidate} is not empty: give a new directory for the candidate's record, or leave "
                         "the candidate out to record into a temporary one")
    if candidate:
        return align_records(ref, record(recipe, candidate, tree=tree))
    with tempfile.TemporaryDirectory(prefix="bisect-npu-align-") as scratch:
        return align_records(ref, record(recipe, Path(scratch) / "candidate", tree=tree))
