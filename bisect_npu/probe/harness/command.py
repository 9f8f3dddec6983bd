"""An in-house harness: any program that writes one JSON line per sample, `{"id", "correct", ...}`
(the per-sample line format, docs/reference/oracles.md), to the file `{output}` names.

Its argv's placeholders are filled in: `{base_url}` (the server, without `/v1`), `{model}` (the
served model id), `{dataset}` (the trial's dataset file: the focus subset), `{output}`,
`{sample_ids}` (the ids to run, comma-separated; empty for all), `{repeats}`, `{seed}`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import HarnessError, excerpt, json_lines, run_harness


def fill(argv: list[str], values: dict[str, str]) -> list[str]:
    filled = []
    for part in argv:
        try:
            filled.append(part.format(**values))
        except (KeyError, IndexError, ValueError) as exc:
            raise HarnessError(f"accuracy.command.argv item {part!r}: unknown placeholder {exc}; known: "
                               f"{', '.join('{' + k + '}' for k in values)}") from exc
    return filled


def read_lines(path: str) -> list[dict[str, Any]]:
    """The per-sample lines, checked as far as the probe can (the host validates them again)."""
    if not os.path.exists(path):
        raise HarnessError(f"the harness wrote no per-sample file {path}; see its log")
    outcomes = []
    for where, line in json_lines(path, "one JSON object per sample per line", errors="replace"):
        if not isinstance(line, dict) or line.get("id") in (None, "") or "correct" not in line:
            raise HarnessError(f"{where}: a sample line is a JSON object with `id` and `correct`")
        correct = line["correct"]
        if isinstance(correct, bool):
            correct = float(correct)
        if not isinstance(correct, (int, float)) or not 0.0 <= correct <= 1.0:
            raise HarnessError(f"{where}: `correct` is {line['correct']!r}; 0, 1, true, false or a rate in [0, 1]")
        runs = line.get("runs", 1)
        if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
            raise HarnessError(f"{where}: `runs` is {runs!r}; a whole number >= 1")
        outcome = {**line, "id": str(line["id"]), "correct": float(correct), "runs": runs}
        for key in ("prompt", "output", "target"):
            if key in outcome:
                outcome[key] = excerpt(outcome[key])
        outcomes.append(outcome)
    if not outcomes:
        raise HarnessError(f"the harness wrote no sample line to {path}; it scored nothing (an empty dataset?)")
    return outcomes


def run(spec: dict[str, Any], base_url: str, model_id: str, dataset: str, sample_ids: list[str] | None,
        repeats: int, seed: int, work_dir: str, timeout_s: float) -> list[dict[str, Any]]:
    os.makedirs(work_dir, exist_ok=True)
    output = os.path.join(work_dir, "samples.jsonl")
    if os.path.exists(output):
        os.unlink(output)
    values = {"base_url": base_url, "model": model_id, "dataset": dataset, "output": output,
              "sample_ids": ",".join(sample_ids or []), "repeats": str(repeats), "seed": str(seed)}
    command = fill(list(spec["argv"]), values)
    with open(os.path.join(work_dir, "argv.json"), "w", encoding="utf-8") as fh:
        json.dump(command, fh)
    run_harness(command, os.path.join(work_dir, "harness.log"), timeout_s, cwd=work_dir)
    return read_lines(output)
