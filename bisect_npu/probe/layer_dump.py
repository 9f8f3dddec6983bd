"""Layer outputs written in MindStudio Probe's dump layout, one forward pass (step) at a time.

`step{N}/rank{R}/dump.json` plus `dump_tensor_data/Module.<name>.<Class>.forward.<call>.output.<i>.pt`,
the layout `bisect_npu/oracle/dumps` reads and users bring from msprobe. The transformers and mini
backends call it from their own hooks; each forward pass of the whole model is one step (step 0 is
the prefill). Tensors are saved with a leading batch dimension as the module produced them.
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import Any


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

    def save(self, name: str, class_name: str, output: Any) -> None:
        """One call of module `name`: its tensor outputs (a tensor, or a tuple/list of them and None)."""
        import torch

        if not self.active:
            return
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        key = f"Module.{name}.{class_name}.forward.{call}"
        tensors = output if isinstance(output, (tuple, list)) else (output,)
        data_dir = os.path.join(self._dir(), "dump_tensor_data")
        os.makedirs(data_dir, exist_ok=True)
        entries = []
        for index, tensor in enumerate(tensors):
            if not isinstance(tensor, torch.Tensor):
                continue
            data_name = f"{key}.output.{index}.pt"
            value = tensor.detach().to("cpu").contiguous()
            torch.save(value.clone(), os.path.join(data_dir, data_name))
            stats = value.float()
            entries.append({"type": "torch.Tensor", "dtype": str(value.dtype), "shape": list(value.shape),
                            "Max": stats.max().item(), "Min": stats.min().item(), "Mean": stats.mean().item(),
                            "Norm": stats.norm().item(), "data_name": data_name})
        self.data[key] = {"output": entries}
        self.modules.add(name)

    def end_step(self) -> None:
        """Write the step's dump.json (the tensors are already on disk)."""
        if self.active and self.data:
            summary = {"task": "tensor", "level": "L0", "framework": "pytorch",
                       "dump_data_dir": os.path.join(self._dir(), "dump_tensor_data"), "data": self.data}
            with open(os.path.join(self._dir(), "dump.json"), "w", encoding="utf-8") as fh:
                json.dump(summary, fh)
