"""A record (`bisect-npu record`'s directory) written by hand: a manifest and one case's observation,
with layer dumps where asked, as `record` leaves them on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bisect_npu.alignment.record import FORMAT, MANIFEST, VERSION, cases_digest, relative_dumps
from bisect_npu.oracle.dumps.compare import write_dump

IDENTITY = {"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "tokenizer": "abc"}
CASES = cases_digest([{"id": "c", "prompt": "hello"}])


def make_record(root: Path, *, text: str = "a b c", tensors: list[tuple[str, np.ndarray]] | None = None,
                identity: dict[str, Any] | None = None, digest: str = CASES, complete: bool = True,
                template: str = "hello") -> Path:
    root.mkdir(parents=True)
    observation: dict[str, Any] = {"schema_version": 1, "case_id": "c", "prompt_token_ids": [1, 2], "text": text,
                                   "output_token_ids": [3, 4, 5], "sampling": {"temperature": 0.0}, "extra": {}}
    if tensors is not None:
        write_dump(root / "obs-c-t0.dump", tensors)
        observation["logits_dump"] = str(root / "obs-c-t0.dump")
    observation["extra"]["stages"] = {"chat_template": template, "prompt_token_ids": [1, 2],
                                      "forward": observation.get("logits_dump"), "sampler": {"temperature": 0.0},
                                      "text": text}
    (root / "obs-c-t0.json").write_text(json.dumps(relative_dumps(observation, root)))
    (root / MANIFEST).write_text(json.dumps({
        "format": FORMAT, "version": VERSION, "complete": complete, "backend": "mini", "device": "cpu",
        "recipe": {"name": "r", "digest": "d", "cases_digest": digest}, "model_identity": identity or IDENTITY,
        "case_ids": ["c"], "cases": {"c": "obs-c-t0.json"}}))
    return root
