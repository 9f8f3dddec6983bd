"""Probe backends: one module of this package per way of driving an engine, named by the request's
`backend` (a recipe's `engine.backend`).

Standard library and relative imports only, like the rest of the probe (it runs inside candidate
environments, copied into images under another package name). A backend's module is imported
when a request names it, and its engine (tinyvllm, vllm, a `vllm serve` process) only when
`open_engine` starts one, so choosing one backend never imports another's engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, runtime_checkable

# The registry: each name is a module of this package. The recipe schema takes its choices from here.
BackendName = Literal["mini", "vllm", "openai", "transformers"]
BACKENDS: tuple[BackendName, ...] = get_args(BackendName)


class ProbeEngine(Protocol):
    """One engine start that the trials of a batch share, in order, each as a fresh start would see it."""

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """One trial: its observation (`request.new_observation`, filled in by the backend)."""
        ...

    def close(self) -> object:
        """Stop the engine; the openai backend returns the server's exit status."""
        ...


@runtime_checkable
class ProbeBackend(Protocol):
    """What a backend module defines; `python -m bisect_npu.probe` calls nothing else."""

    def open_engine(self, request: dict[str, Any], trials: int = 1) -> ProbeEngine:
        """Start the engine for the request's case (model, engine args), for `trials` trials."""
        ...

    def run_case(self, request: dict[str, Any]) -> dict[str, Any]:
        """One trial on its own engine start, stopped before the observation is returned."""
        ...


class UnknownBackend(ValueError):
    """A request names a backend this probe does not have."""


def load_backend(name: str) -> ProbeBackend:
    """Import the backend module `name` (its engine is imported later, by open_engine)."""
    if name not in BACKENDS:
        raise UnknownBackend(f"unknown probe backend {name!r}; known: {', '.join(BACKENDS)}")
    module = importlib.import_module(f".{name}", __package__)
    if not isinstance(module, ProbeBackend):
        raise TypeError(f"probe backend {name!r} ({module.__name__}) does not define open_engine and run_case")
    return module


if TYPE_CHECKING:  # mypy checks each registered module against the protocol; nothing is imported at run time
    from . import mini, openai, transformers, vllm

    _REGISTERED: tuple[ProbeBackend, ...] = (mini, vllm, openai, transformers)
