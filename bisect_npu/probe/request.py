"""The probe request: what the host asks the probe to run, as plain JSON.

Written by the host (`bisect_npu.execute`), read here with the standard library. Keys:

- ``schema_version`` (1), ``commit``, ``recipe`` (name), ``run_digest`` (a hash of what the recipe runs, copied
  into the observation so that `judge` can tell output of another version of the case), ``case_id``, ``trial``, ``seed``
- ``backend``: ``mini`` | ``vllm`` | ``openai``
- ``model``: ``{"path", "dtype", "tokenizer"}``
- ``engine``: ``{"args": {...}, "server_flags": [...], "port", "startup_timeout_s",
  "load": {"concurrency", "requests"}}`` (``load``: the openai backend's requests beside the observed one;
  ``server_env``, optional: the serving node's own environment when the engine spans hosts)
- ``case``: ``{"prompt"}`` or ``{"messages"}``, plus ``"sampling"`` (only the keys the recipe sets:
  ``None`` means "not sent", so server-side defaults apply)
- ``loop_guard``: ``{"min_pattern_size", "max_pattern_size", "min_count"}`` or ``None``
- ``logits``: ``{"top_k": int, "dump_dir": str | None}``
- ``output``: path where the observation JSON goes
- ``accuracy`` (only for oracle kind ``accuracy``): the harness run, ``{"harness", "dataset",
  "lm_eval" | "aisbench" | "command", "limit", "metric", "repeats", "sample_ids"}``; ``sample_ids``
  is ``None`` for the whole dataset, else the ids to run (focusing). The observation then carries
  ``samples``, one ``{"id", "correct", "runs", ...}`` per sample run (docs/reference/oracles.md,
  "Accuracy"); the case's ``sampling`` is what the harness sends.
- ``batch`` (optional): ``[{"trial": int, "seed": int | None, "output": str}, ...]``, several trials of
  this case at this commit for ONE engine start (a model load takes minutes on Ascend, a trial
  seconds). The top-level ``trial``/``seed``/``output`` equal the first entry's. The host numbers
  the entries and gives their seeds (base + trial); the probe never invents them.

A batch runs as the trial requests of `trial_requests`, in order, on one engine: each
observation is written to its entry's ``output`` as soon as its trial finishes (the host journals
each file as it appears, so a kill mid-batch keeps the finished trials). The first trial of an
engine start reports the real ``timings.load_s``, later ones 0.0, and every observation of a
batch carries ``extra["batch"] = {"index": i, "size": n}`` (a request without ``batch`` gets none).
Between trials the backends reset what the engine keeps across requests (prefix cache,
cumulative counters) so that a trial sees the engine as a fresh start would. What is fixed at
start-up comes from the first trial (engine seed, `--seed`, server log path); the `vllm` backend
refuses a batch of more than one trial with ``logits.layers`` (its dump hooks cannot be removed).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
from typing import Any

REQUEST_SCHEMA_VERSION = 1
OBSERVATION_SCHEMA_VERSION = 1


def read_request(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        request: dict[str, Any] = json.load(fh)
    if request.get("schema_version") != REQUEST_SCHEMA_VERSION:
        raise ValueError(f"{path}: probe request schema {request.get('schema_version')!r}, "
                         f"this probe reads {REQUEST_SCHEMA_VERSION}")
    return request


def trial_requests(request: dict[str, Any]) -> list[dict[str, Any]]:
    """One full request per trial: the request itself without ``batch``, else one per entry.

    Each is a copy with the entry's ``trial``, ``seed`` and ``output``, and the entry's seed in
    ``case.sampling.seed`` where the case sends a seed (a case that leaves the seed to the engine
    keeps doing so). The copies have no ``batch`` key, so a backend sees one plain trial.
    """
    if "batch" not in request:
        return [request]
    batch = request["batch"]
    if not isinstance(batch, list) or not batch:
        raise ValueError(f"probe request: batch must be a non-empty list of trials, got {batch!r}")
    base = {key: value for key, value in request.items() if key != "batch"}
    trials = []
    for entry in batch:
        if not isinstance(entry, dict) or not isinstance(entry.get("trial"), int) or not entry.get("output"):
            raise ValueError(f"probe request: batch entry {entry!r} needs an int trial and an output path")
        trial = copy.deepcopy(base)
        trial.update(trial=entry["trial"], seed=entry.get("seed"), output=entry["output"])
        sampling = (trial.get("case") or {}).get("sampling")
        if isinstance(sampling, dict) and "seed" in sampling:
            sampling["seed"] = entry.get("seed")
        trials.append(trial)
    return trials


def case_input_digest(case: dict[str, Any]) -> str:
    """sha256 of the prompt or messages the case gives (not its sampling): what makes two observations
    of the same case across engines, before any chat template or tokenizer touched it."""
    given = {key: case[key] for key in ("prompt", "messages") if key in case}
    return hashlib.sha256(json.dumps(given, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def new_observation(request: dict[str, Any]) -> dict[str, Any]:
    """An observation pre-filled with what the request already says; backends fill the rest."""
    case, model = request.get("case"), request.get("model")
    return {
        "schema_version": OBSERVATION_SCHEMA_VERSION,
        "commit": request.get("commit", ""),
        "recipe": request.get("recipe", ""),
        "run_digest": request.get("run_digest", ""),
        "case_id": request.get("case_id", "default"),
        "trial": request.get("trial", 0),
        "seed": request.get("seed"),
        "prompt_token_ids": [],
        "output_token_ids": [],
        "text": "",
        "finish_reason": None,
        "stop_reason": None,
        "timings": {"load_s": 0.0, "generate_s": 0.0},
        "sampling": {},
        "versions": {},
        "top_logprobs": None,
        "logits_dump": None,
        "extra": {**({"case_input": case_input_digest(case)} if isinstance(case, dict) else {}),
                  **({"dtype": model["dtype"]} if isinstance(model, dict) and model.get("dtype") else {})},
    }


def write_json_atomic(path: str, payload: dict[str, Any]) -> None:
    """Write via a temporary file and rename, so a killed probe never leaves half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".obs-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
