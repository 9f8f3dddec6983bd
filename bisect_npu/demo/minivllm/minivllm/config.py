"""The server's default sampling parameters, from a model's generation config and the override.

Like vLLM's `ModelConfig.get_diff_sampling_param()`: the keys a generation config (or
`--override-generation-config`) may set, by SamplingParams name; anything else is ignored.
"""

from __future__ import annotations

from typing import Any


def get_diff_sampling_param(generation_config: dict[str, Any] | None,
                            override_generation_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sampling parameters the model's generation config, with the override on top, sets."""
    config = {**(generation_config or {}), **(override_generation_config or {})}
    available_params = [
        "repetition_penalty",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "max_new_tokens",
    ]
    diff = {p: config[p] for p in available_params if config.get(p) is not None}
    if "max_new_tokens" in diff:
        diff["max_tokens"] = diff.pop("max_new_tokens")
    return diff
