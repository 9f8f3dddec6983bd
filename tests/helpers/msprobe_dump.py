"""One prefill of a model dumped by MindStudio Probe's own `PrecisionDebugger`, the dumps users bring.

Task `tensor`, level L0: every module whose name holds one of `modules` (msprobe matches the list
against the module's dump name, `Module.<path>.<Class>.forward.<call>`), inputs and outputs. An MoE
router (HF `Qwen3MoeTopKRouter`, `DeepseekV3TopkRouter`) is dumped with all it returns: its
logits, its routing weights and the chosen expert ids as an integer tensor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Class names of the dense parts, and of an MoE block, its router and its experts (HF transformers).
DENSE_MODULES = ["DecoderLayer", "Attention", "MLP", "RMSNorm", "lm_head"]
MOE_MODULES = [*DENSE_MODULES, "SparseMoeBlock", "MoE", "Router", "Experts"]


@contextmanager
def _threads(count: int | None) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def msprobe_dump(model: Any, ids: Any, out: Path, modules: list[str], threads: int | None = None) -> Path:
    """Dump one forward of `model` on `ids` into `out`; returns its `step0` directory (kept if already there)."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    if (out / "step0").is_dir():
        return out / "step0"
    out.mkdir(parents=True, exist_ok=True)
    config = out / "msprobe_config.json"
    config.write_text(json.dumps({"task": "tensor", "dump_path": str(out), "rank": [], "step": [], "level": "L0",
                                  "tensor": {"scope": [], "list": modules, "data_mode": ["all"]}}), encoding="utf-8")
    PrecisionDebugger._instance = None  # one debugger a process: a new config per dump
    debugger = PrecisionDebugger(config_path=str(config))
    with _threads(threads), torch.no_grad():
        debugger.start(model)
        model(ids)
        debugger.stop()
        debugger.step()
    return out / "step0"
