"""OpenAI-style request fields and the sampling parameters they resolve to.

A field the request leaves out (None) takes the server's default, else the OpenAI default: an
unsent field never overrides what the server was started with.
"""

from __future__ import annotations

from typing import Any

# What a field is when neither the request nor the server sets it.
_DEFAULT_SAMPLING_PARAMS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}


def to_sampling_params(request: dict[str, Any],
                       default_sampling_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The request's sampling parameters: priority user -> server default -> OpenAI default."""
    defaults = default_sampling_params or {}
    params: dict[str, Any] = {}
    for name in dict.fromkeys([*_DEFAULT_SAMPLING_PARAMS, *defaults, *request]):
        if request.get(name) is not None:
            params[name] = request[name]
        elif defaults.get(name) is not None:
            params[name] = defaults[name]
        elif name in _DEFAULT_SAMPLING_PARAMS:
            params[name] = _DEFAULT_SAMPLING_PARAMS[name]
    return params
