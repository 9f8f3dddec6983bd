"""The probe request: what the host asks the probe to run, as plain JSON.

Written by the host (`bisect_npu.execute`), read here with the standard library. Keys:

- ``schema_version`` (1), ``commit``, ``recipe`` (name), ``case_id``, ``trial``, ``seed``
- ``backend``: ``mini`` | ``vllm`` | ``openai``
- ``model``: ``{"path", "dtype", "tokenizer"}``
- ``engine``: ``{"args": {...}, "server_flags": [...], "port", "startup_timeout_s"}``
- ``case``: ``{"prompt"}`` or ``{"messages"}``, plus ``"sampling"`` (only the keys the recipe sets:
  ``None`` means "not sent", so server-side defaults apply)
- ``loop_guard``: ``{"min_pattern_size", "max_pattern_size", "min_count"}`` or ``None``
- ``logits``: ``{"top_k": int, "dump_dir": str | None}``
- ``output``: path where the observation JSON goes
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

REQUEST_SCHEMA_VERSION = 1
OBSERVATION_SCHEMA_VERSION = 1


def read_request(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        request = json.load(fh)
    if request.get("schema_version") != REQUEST_SCHEMA_VERSION:
        raise ValueError(f"{path}: probe request schema {request.get('schema_version')!r}, "
                         f"this probe reads {REQUEST_SCHEMA_VERSION}")
    return request


def new_observation(request: dict[str, Any]) -> dict[str, Any]:
    """An observation pre-filled with what the request already says; backends fill the rest."""
    return {
        "schema_version": OBSERVATION_SCHEMA_VERSION,
        "commit": request.get("commit", ""),
        "recipe": request.get("recipe", ""),
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
        "extra": {},
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
