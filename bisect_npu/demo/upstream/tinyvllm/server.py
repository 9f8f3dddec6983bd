"""A tiny completions server layer: per-request sampling over server-wide defaults.

Like `vllm serve --override-generation-config '{"presence_penalty": 1.5}'`: the override becomes
the server's default sampling parameters, and a request overrides only the fields it sends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .engine import LLM, TokenOutput
from .sampling_params import SamplingParams

# Generation-config names -> SamplingParams fields.
_GENERATION_CONFIG_TO_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "max_new_tokens": "max_tokens",
}


def default_sampling_params(override_generation_config: dict[str, Any] | None) -> dict[str, Any]:
    """The server's defaults from the override (unknown keys are ignored, like vLLM)."""
    defaults: dict[str, Any] = {}
    for key, value in (override_generation_config or {}).items():
        field = _GENERATION_CONFIG_TO_SAMPLING.get(key)
        if field is not None:
            defaults[field] = value
    return defaults


class CompletionServer:
    def __init__(self, llm: LLM, override_generation_config: dict[str, Any] | None = None) -> None:
        self.llm = llm
        self.defaults = default_sampling_params(override_generation_config)

    def sampling_params(self, request: dict[str, Any]) -> SamplingParams:
        """The effective parameters: the request's fields over the server defaults."""
        sent = {k: v for k, v in request.items() if v is not None}
        return SamplingParams.from_dict({**self.defaults, **sent})

    def complete(self, prompt: str, request: dict[str, Any]) -> tuple[SamplingParams, Iterator[TokenOutput]]:
        params = self.sampling_params(request)
        return params, self.llm.stream(self.llm.tokenizer.encode(prompt), params)
