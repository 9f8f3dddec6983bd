"""The local dataset a harness scores: its samples, and the subset one trial runs.

A JSONL file is read line by line; a sample's id is its `id` field (else its 0-based line
number among the non-blank lines). Focusing (`sample_ids`) and `limit` become a smaller JSONL
file written next to the trial's output, which the harness is pointed at instead: the same
mechanism for every harness, and the harness never sees the samples it is not asked to run.
A directory or another format is handed to the harness as it is (the outcomes are filtered).
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import HarnessError, json_lines


def sample_id(row: dict[str, Any], index: int) -> str:
    value = row.get("id")
    return str(value) if value is not None and not isinstance(value, (dict, list)) else str(index)


def read_rows(path: str) -> list[dict[str, Any]]:
    """The dataset's samples (JSONL); HarnessError naming the file for a missing, empty or broken one."""
    if not os.path.exists(path):
        raise HarnessError(f"the dataset {path} does not exist; generate it or fix `accuracy.dataset` in the recipe")
    rows = []
    try:
        for where, row in json_lines(path, "the dataset is one JSON object per line"):
            if not isinstance(row, dict):
                raise HarnessError(f"{where}: a dataset line is a JSON object, got {type(row).__name__}")
            rows.append(row)
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"cannot read the dataset {path}: {exc}") from exc
    if not rows:
        raise HarnessError(f"the dataset {path} has no samples; an empty dataset cannot be scored")
    return rows


def indexed_rows(path: str) -> list[tuple[str, dict[str, Any]]]:
    """The dataset's samples with their ids; HarnessError for an id two samples share (their outcomes
    would be pooled as one sample's runs)."""
    indexed = [(sample_id(row, index), row) for index, row in enumerate(read_rows(path))]
    first: dict[str, int] = {}
    for position, (sid, _row) in enumerate(indexed, start=1):
        if sid in first:
            raise HarnessError(f"the dataset {path} has sample id {sid!r} twice (samples {first[sid]} and {position}): "
                               "their outcomes would be pooled as one sample's; give each sample its own id")
        first[sid] = position
    return indexed


def is_jsonl(path: str) -> bool:
    return os.path.isfile(path) and path.endswith((".jsonl", ".json"))


def check_exists(dataset: str) -> None:
    """HarnessError for a dataset path that is missing or an empty directory."""
    if not os.path.exists(dataset):
        raise HarnessError(f"the dataset {dataset} does not exist; generate it or fix `accuracy.dataset` in the recipe")
    if os.path.isdir(dataset) and not os.listdir(dataset):
        raise HarnessError(f"the dataset directory {dataset} is empty; an empty dataset cannot be scored")


def select(dataset: str, sample_ids: list[str] | None, limit: int | None,
           out_dir: str) -> tuple[str, list[str] | None]:
    """The file the harness runs on and the ids of its rows in order (None: not known, a directory).

    A JSONL dataset always yields a file of its own (with every row's `id` set), so the harnesses'
    row numbers map back to ids; ids the dataset lacks are an error naming the first."""
    check_exists(dataset)
    if not is_jsonl(dataset):
        return dataset, None
    indexed = indexed_rows(dataset)
    if limit is not None:
        indexed = indexed[:limit]
    if sample_ids is not None:
        by_id = dict(indexed)
        missing = [sid for sid in sample_ids if sid not in by_id]
        if missing:
            raise HarnessError(f"sample {missing[0]!r} is not in the dataset {dataset} ({len(missing)} ids missing); "
                               "the dataset changed since the ends ran")
        indexed = [(sid, by_id[sid]) for sid in sample_ids]
    if not indexed:
        raise HarnessError(f"no samples of {dataset} to run (sample_ids is empty)")
    os.makedirs(out_dir, exist_ok=True)
    subset = os.path.join(out_dir, "dataset.jsonl")
    with open(subset, "w", encoding="utf-8") as fh:
        for sid, row in indexed:
            fh.write(json.dumps({**row, "id": sid}) + "\n")
    return subset, [sid for sid, _ in indexed]
