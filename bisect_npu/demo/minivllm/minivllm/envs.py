"""Environment variables minivllm reads, with their defaults."""

from __future__ import annotations

import os

environment_variables: dict[str, str] = {
    "MINIVLLM_LOGGING_LEVEL": "INFO",
    # new variables go above this line
}


def get(name: str) -> str:
    return os.environ.get(name, environment_variables[name])
