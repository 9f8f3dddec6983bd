"""Sampling parameters with vLLM's names and neutral defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

_GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: all tokens
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int = 16
    seed: int | None = None
    logprobs: int | None = None
    ignore_eos: bool = True

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SamplingParams:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameters: {', '.join(unknown)}")
        return cls(**values)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
