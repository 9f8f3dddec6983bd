"""What says two runs used the same model and tokenizer, across engines: the architecture's sizes and a
digest of the vocabulary (token text -> id), which every engine can read from its tokenizer."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def vocabulary_digest(vocabulary: Mapping[str, int]) -> str:
    """sha256 of the vocabulary in id order: the same tokenizer gives the same digest in any engine."""
    ordered = sorted(((int(i), str(token)) for token, i in vocabulary.items()))
    return hashlib.sha256(json.dumps(ordered, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def model_identity(vocabulary: Mapping[str, int], vocab_size: int, hidden_size: int, num_layers: int) -> dict[str, Any]:
    """The observation's `extra["model_identity"]`: a record's check that the reference ran the same model."""
    return {"vocab_size": int(vocab_size), "hidden_size": int(hidden_size), "num_hidden_layers": int(num_layers),
            "tokenizer": vocabulary_digest(vocabulary)}
