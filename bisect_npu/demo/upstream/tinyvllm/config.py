"""Model configuration: a tiny Qwen3 whose weights are generated from a seed (no downloads)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Linear RoPE scaling: positions are divided by the factor. The cos/sin cache is built for
    # max_position_embeddings positions and extended on demand for longer sequences.
    rope_scaling_factor: float = 4.0
    max_position_embeddings: int = 128
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_model_config(model: str | dict[str, Any]) -> ModelConfig:
    """`seed:N`, a JSON object string, or a dict of ModelConfig fields."""
    if isinstance(model, dict):
        return replace(ModelConfig(), **model)
    if model.startswith("seed:"):
        return ModelConfig(seed=int(model.split(":", 1)[1]))
    if model.lstrip().startswith("{"):
        return replace(ModelConfig(), **json.loads(model))
    raise ValueError(f"unknown model {model!r}: use 'seed:N' or a JSON object of ModelConfig fields")
