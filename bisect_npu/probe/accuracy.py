"""One trial of an accuracy recipe: the harness scores the candidate's running server.

The backend (openai) has started the server; this runs the request's harness against it on the
trial's samples (the whole dataset, or `sample_ids` when the host focuses), `repeats` times for
a sampled evaluation (run r sends seed + r), and returns the per-sample outcomes pooled per id,
in the order the samples were asked for. Any failure of the harness, the dataset or the
harness's output is a `HarnessError`: the probe exits `HARNESS_FAILED_EXIT` and the host stops
the run as an infrastructure error, never a verdict about the commit.
"""

from __future__ import annotations

import os
from typing import Any

from .harness import HarnessError, aisbench, command, dataset, find_executable, lm_eval

DEFAULT_TIMEOUT_S = 3600.0


def _pool(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Outcomes of several runs of the same samples as one per id (rates over the runs)."""
    pooled: dict[str, dict[str, Any]] = {}
    for outcomes in runs:
        for outcome in outcomes:
            seen = pooled.get(outcome["id"])
            if seen is None:
                pooled[outcome["id"]] = dict(outcome)
                continue
            total = seen["runs"] + outcome["runs"]
            seen["correct"] = (seen["correct"] * seen["runs"] + outcome["correct"] * outcome["runs"]) / total
            seen["runs"] = total
    return list(pooled.values())


def check_inputs(request: dict[str, Any]) -> None:
    """What a trial needs besides the server (a known harness, its executable, the dataset), checked
    before the server starts: a start can take minutes on an NPU host."""
    spec = request["accuracy"]
    harness = spec.get("harness")
    if harness not in ("lm_eval", "aisbench", "command"):
        raise HarnessError(f"unknown accuracy harness {harness!r}; known: lm_eval, aisbench, command")
    if harness != "command":
        find_executable(harness)
    dataset.check_exists(str(spec["dataset"]))


def run_accuracy(request: dict[str, Any], host: str, port: int, model_id: str) -> list[dict[str, Any]]:
    """The trial's per-sample outcomes (`SampleOutcome` dicts) against the server at host:port."""
    check_inputs(request)
    spec = request["accuracy"]
    harness = spec.get("harness")
    settings = spec.get(harness) or {}
    sampling = {k: v for k, v in ((request.get("case") or {}).get("sampling") or {}).items() if v is not None}
    seed = sampling.get("seed") if sampling.get("seed") is not None else request.get("seed")
    base_seed = int(seed or 0)
    repeats = int(spec.get("repeats") or 1)
    sample_ids = spec.get("sample_ids")
    work = os.path.splitext(os.path.abspath(request["output"]))[0] + ".harness"
    data, ids = dataset.select(str(spec["dataset"]), sample_ids, spec.get("limit"), work)
    timeout_s = float(request.get("timeout_s") or DEFAULT_TIMEOUT_S)
    base_url = f"http://{host}:{port}"
    if harness == "command":
        outcomes = [command.run(settings, base_url, model_id, data, ids, repeats, base_seed,
                                os.path.join(work, "command"), timeout_s)]
    else:
        outcomes = []
        for run in range(repeats):
            run_dir = os.path.join(work, f"{harness}-{run}")
            seed = base_seed + run
            run_sampling = {**sampling, "seed": seed}
            if harness == "lm_eval":
                outcomes.append(lm_eval.run(settings, base_url, model_id, data, ids, sample_ids, run_sampling, seed,
                                            run_dir, timeout_s))
            else:
                outcomes.append(aisbench.run(settings, host, port, model_id, data, ids, run_sampling, seed, run_dir,
                                             timeout_s))
    samples = _pool(outcomes)
    return _in_order(samples, ids if ids is not None else sample_ids, data)


def _in_order(samples: list[dict[str, Any]], wanted: list[str] | None, data: str) -> list[dict[str, Any]]:
    """The outcomes of the asked samples, in the asked order; a sample the harness skipped is an error."""
    if wanted is None:
        return samples
    by_id = {s["id"]: s for s in samples}
    missing = [sid for sid in wanted if sid not in by_id]
    if missing:
        raise HarnessError(f"the harness reported no outcome for {len(missing)} of the {len(wanted)} samples of {data} "
                           f"(first: {missing[0]!r}); see its log")
    return [by_id[sid] for sid in wanted]
