"""Layer outputs written in MindStudio Probe's dump layout, one forward pass (step) at a time.

`step{N}/rank{R}/dump.json` plus `dump_tensor_data/Module.<name>.<Class>.forward.<call>.output.<i>.pt`,
the layout `bisect_npu/oracle/dumps` reads and users bring from msprobe. The transformers and mini
backends call it from their own hooks; each forward pass of the whole model is one step (step 0 is
the prefill). Tensors are saved with a leading batch dimension as the module produced them.

An MoE router (a module named `...gate`: HF's `Qwen3MoeTopKRouter`, `DeepseekV3TopkRouter`,
vLLM's `GateLinear`) is saved with its input (`input_args`) and its score-correction bias
(`parameters`) beside its outputs (logits, routing weights, expert ids): the routing comparison
takes the noise a flip may come from out of the router's input, and the margin of a biased
choice out of the bias.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable
from typing import Any

# Buffers of a router that decide its choice beside the logits (DeepSeek-V3's grouped top-k).
ROUTER_PARAMETERS = ("e_score_correction_bias",)


def is_router(name: str) -> bool:
    """An MoE block's gate: `mlp.gate` (not a dense MLP's `gate_proj`)."""
    return name.rsplit(".", 1)[-1] == "gate"


class DumpWriter:
    """Collects the outputs of the modules whose names match `patterns`, for the steps asked."""

    def __init__(self, dump_dir: str, patterns: list[str], steps: list[int] | None, rank: int = 0) -> None:
        self.dump_dir = dump_dir
        self.patterns = patterns
        self.steps = set(steps if steps is not None else [0])
        self.rank = rank
        self.step = -1
        self.data: dict[str, Any] = {}
        self.calls: dict[str, int] = {}
        self.modules: set[str] = set()

    def wanted(self, name: str) -> bool:
        return bool(name) and any(fnmatch.fnmatch(name, pattern) for pattern in self.patterns)

    @property
    def active(self) -> bool:
        return self.step in self.steps

    def _dir(self) -> str:
        return os.path.join(self.dump_dir, f"step{self.step}", f"rank{self.rank}")

    def begin_step(self) -> None:
        self.step += 1
        self.data, self.calls = {}, {}

    def hook(self, name: str, module: Any, layout: Callable[[Any], Any] = lambda value: value) -> Any:
        """A forward hook on `module` that saves its outputs (a router's input and bias too)."""
        if not is_router(name):
            return module.register_forward_hook(
                lambda mod, _args, out: self.save(name, type(mod).__name__, layout(out)))
        buffers = dict(module.named_buffers(recurse=False))
        parameters = {key: buffers[key] for key in ROUTER_PARAMETERS if key in buffers}
        return module.register_forward_hook(
            lambda mod, args, out: self.save(name, type(mod).__name__, layout(out), inputs=layout(list(args)),
                                             parameters=parameters))

    def save(self, name: str, class_name: str, output: Any, inputs: list[Any] | None = None,
             parameters: dict[str, Any] | None = None) -> None:
        """One call of module `name`: its tensor outputs (a tensor, or a tuple/list of them and None), and
        the input tensors and parameters given."""
        if not self.active:
            return
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        key = f"Module.{name}.{class_name}.forward.{call}"
        tensors = output if isinstance(output, (tuple, list)) else (output,)
        data_dir = os.path.join(self._dir(), "dump_tensor_data")
        os.makedirs(data_dir, exist_ok=True)
        op: dict[str, Any] = {}
        if inputs:
            op["input_args"] = [self._write(data_dir, f"{key}.input.{i}", t) for i, t in enumerate(inputs)]
        if parameters:
            op["parameters"] = {k: self._write(data_dir, f"{key}.parameters.{k}", t) for k, t in parameters.items()}
        op["output"] = [self._write(data_dir, f"{key}.output.{i}", t) for i, t in enumerate(tensors)]
        self.data[key] = {section: [e for e in entries if e is not None] if isinstance(entries, list)
                          else {k: e for k, e in entries.items() if e is not None} for section, entries in op.items()}
        self.modules.add(name)

    @staticmethod
    def _write(data_dir: str, stem: str, tensor: Any) -> dict[str, Any] | None:
        """Save one tensor as `<stem>.pt` and return its dump.json entry (None for what is not a tensor)."""
        import torch

        if not isinstance(tensor, torch.Tensor):
            return None
        data_name = f"{stem}.pt"
        value = tensor.detach().to("cpu").contiguous()
        torch.save(value.clone(), os.path.join(data_dir, data_name))
        stats = value.float()
        return {"type": "torch.Tensor", "dtype": str(value.dtype), "shape": list(value.shape),
                "Max": stats.max().item(), "Min": stats.min().item(), "Mean": stats.mean().item(),
                "Norm": stats.norm().item(), "data_name": data_name}

    def end_step(self) -> None:
        """Write the step's dump.json (the tensors are already on disk)."""
        if self.active and self.data:
            summary = {"task": "tensor", "level": "L0", "framework": "pytorch",
                       "dump_data_dir": os.path.join(self._dir(), "dump_tensor_data"), "data": self.data}
            with open(os.path.join(self._dir(), "dump.json"), "w", encoding="utf-8") as fh:
                json.dump(summary, fh)
