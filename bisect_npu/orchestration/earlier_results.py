"""The ends' evaluations the user already made, taken instead of running the whole dataset there.

A user who reports a score drop has run the harness at both ends: that is how they know. Their
per-sample results (the command harness's lines, lm-eval's samples JSONL, AISBench's output
directory) are read with the harness's own readers and checked against the recipe: the commit
each ran on, the harness, the dataset's sample ids, the sampling. Then a small control share of
the dataset is run again at the end; when it agrees, the earlier results stand for the end. Any
difference is said in one line and the end runs the whole dataset, as without them.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bisect_npu.contracts import SampleOutcome
from bisect_npu.oracle.accuracy.samples import SampleFormatError, read_samples_jsonl
from bisect_npu.oracle.accuracy.stats import pool
from bisect_npu.probe.harness import HarnessError, aisbench, dataset, lm_eval
from bisect_npu.recipe.schema import AccuracySpec, EarlierEndSpec, Recipe

MIN_CONTROL = 5  # control samples at least: fewer says nothing


@dataclass(frozen=True)
class Earlier:
    """One end's earlier results, or why they are set aside (`samples` None)."""

    samples: list[SampleOutcome] | None
    source: str
    why_not: str = ""


def earlier_for(recipe: Recipe, role: str, commit: str) -> Earlier | None:
    """The earlier results of the end in `role` at `commit`, checked against the recipe; None when
    the recipe gives none for that end."""
    spec = recipe.accuracy
    if spec is None or spec.earlier_results is None or role not in ("good_end", "bad_end"):
        return None
    end = spec.earlier_results.good if role == "good_end" else spec.earlier_results.bad
    if end is None:
        return None
    path = _beside(recipe, end.path)
    differs = _differences(spec, end, commit)
    if differs:
        return Earlier(None, str(path), "; ".join(differs))
    ids = dataset_ids(recipe)
    try:
        samples = read_earlier(end.harness or spec.harness, path, ids)
    except (SampleFormatError, HarnessError, OSError) as exc:
        return Earlier(None, str(path), f"cannot be read ({exc})")
    got = {s.id for s in samples}
    missing, extra = [i for i in ids if i not in got], sorted(got - set(ids))
    if missing or extra:
        said = [f"{len(missing)} dataset samples missing (first {missing[0]})" if missing else "",
                f"{len(extra)} samples not in the dataset (first {extra[0]})" if extra else ""]
        return Earlier(None, str(path), "the sample ids differ from the dataset's: " + ", ".join(filter(None, said)))
    return Earlier(samples, str(path))


def _differences(spec: AccuracySpec, end: EarlierEndSpec, commit: str) -> list[str]:
    """What the earlier run says it was that this session's end is not."""
    said = []
    if not commit.startswith(end.commit.lower()):
        said.append(f"they ran at {end.commit}, this end is {commit[:12]}")
    if end.harness is not None and end.harness != spec.harness:
        said.append(f"they come from harness {end.harness}, the recipe's is {spec.harness}")
    if end.sampling is not None:
        ours = spec.sampling.model_dump()
        for key, value in sorted(end.sampling.items()):
            if key in ours and ours[key] is not None and ours[key] != value:
                said.append(f"sampling {key} was {value}, the recipe's is {ours[key]}")
    return said


def read_earlier(harness: str, path: Path, ids: list[str]) -> list[SampleOutcome]:
    """One end's per-sample outcomes from the harness's own output (its own reader, as a trial's)."""
    if harness == "command":
        return read_samples_jsonl(path)
    if not path.exists():
        raise HarnessError(f"{path} does not exist")
    if harness == "aisbench":
        rows = aisbench.read_samples(str(path), ids)
    else:  # lm_eval reads `<work>/output/**/samples_*.jsonl`: the file or directory is laid there
        with tempfile.TemporaryDirectory(prefix="bisect-npu-earlier-") as work:
            os.makedirs(os.path.join(work, "output"))
            os.symlink(path.resolve(), os.path.join(work, "output", "samples_earlier.jsonl" if path.is_file()
                                                    else "run"))
            rows = lm_eval.read_samples(work, ids)
    return pool([SampleOutcome.model_validate(row) for row in rows])


def dataset_ids(recipe: Recipe) -> list[str]:
    """The sample ids of the recipe's dataset, in order, as many as `limit` keeps."""
    spec = recipe.accuracy
    assert spec is not None
    rows = dataset.read_rows(str(spec.dataset_path(recipe.source)))
    ids = [dataset.sample_id(row, index) for index, row in enumerate(rows)]
    return ids[:spec.limit] if spec.limit else ids


def control_ids(ids: Sequence[str], share: float, commit: str) -> list[str]:
    """The control share of the dataset for the end at `commit`: a fixed pseudo-random choice (the
    same on a resume), in dataset order."""
    count = min(len(ids), max(MIN_CONTROL, math.ceil(share * len(ids))))
    chosen = set(sorted(ids, key=lambda i: hashlib.sha256(f"{commit}:{i}".encode()).hexdigest())[:count])
    return [i for i in ids if i in chosen]


def disagreement(earlier: Sequence[SampleOutcome], control: Sequence[SampleOutcome]) -> tuple[int, int]:
    """(control samples whose outcome differs from the earlier one's by more than half, control samples)."""
    before = {s.id: s.correct for s in earlier}
    differ = sum(1 for s in control if s.id in before and abs(before[s.id] - s.correct) > 0.5)
    return differ, len(control)


def _beside(recipe: Recipe, value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute() and recipe.source and not recipe.source.startswith("<"):
        path = Path(recipe.source).resolve().parent / path
    return path
