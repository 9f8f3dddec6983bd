"""Reading dumps: the two formats' indexes as one list of tensor entries, in execution order.

* **bisect-npu dump**: a directory with `manifest.json`
  `{"format": "bisect-npu-dump", "version": 1, "tensors": [{"name": "model.layers.3.mlp.output",
  "file": "0007.npy", "shape": [512, 1024], "dtype": "float32", "step": 0, "kind": "hidden"}]}`,
  tensors listed in execution order, one `.npy` (preferred: memory-mapped) or `.pt` file each.
  `kind: "logits"` (or a name containing `logits`/`lm_head`) adds KL divergence and top-k overlap.
* **MindStudio Probe dump**: `step{N}/rank{ID}/dump.json` (`rank` or `proc{PID}` when not
  distributed: read as `rank0`, so they line up with a one-rank distributed dump)
  with `data: {op_name: {input_args, input_kwargs, parameters, output}}` in execution order, each
  tensor a mapping with `dtype`, `shape`, `data_name` (a file in `dump_tensor_data/`). The path
  given may be the dump root, a step/rank directory, or a `dump.json`. Per op the entries are
  input_args, input_kwargs, parameters, output, in that order. `.pt` files are read without
  torch (`oracle/dumps/formats.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bisect_npu.errors import UsageError
from bisect_npu.oracle.dumps.formats import PtFormatError, TensorFile, open_npy, open_pt

OWN_FORMAT = "bisect-npu-dump"
_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)(?:\.|$)")
_STEP_DIR = re.compile(r"^step(\d+)$")
# A run that is not distributed writes `rank` (vllm-ascend's msprobe guide) or `proc{PID}` (what
# mindstudio-probe 26.2 wrote here) where a distributed one writes `rank{ID}`: all name rank 0.
_SINGLE_PROCESS_DIR = re.compile(r"(?<![^/])(?:proc\d+|rank)(?![^/])")
# ROUTING: a router's ids and weights, judged by the routing rule, never by cosine; the weights, compared
# per expert id, are part of the experts' baseline. EXPERT_CALL: a call inside the experts (one per expert,
# over the tokens routed to it), left to the routing rule: neither judged nor a baseline.
INPUT, OUTPUT, ROUTING, EXPERT_CALL = "input", "output", "routing", "expert call"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a dump: where it lives, what its index says it is, and which module it belongs to."""

    name: str
    file: Path
    shape: tuple[int, ...] | None
    dtype: str | None
    step: int = 0
    kind: str = "hidden"
    module: str | None = None
    role: str = OUTPUT

    @property
    def layer(self) -> int | None:
        match = _LAYER.search(self.name)
        return int(match.group(1)) if match else None

    @property
    def is_logits(self) -> bool:
        return self.kind == "logits" or "logits" in self.name or "lm_head" in self.name


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"dump index not found: {path}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}); the dump was probably interrupted") from exc


def _own_entries(manifest_path: Path) -> list[TensorEntry]:
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tensors"), list):
        raise UsageError(f"{manifest_path}: expected {{\"format\": \"{OWN_FORMAT}\", \"tensors\": [...]}}")
    entries = []
    for i, item in enumerate(manifest["tensors"]):
        if not isinstance(item, dict) or "name" not in item or "file" not in item:
            raise UsageError(f"{manifest_path}: tensors[{i}] needs `name` and `file`")
        shape = item.get("shape")
        name = str(item["name"])
        entries.append(TensorEntry(name=name, file=manifest_path.parent / str(item["file"]),
                                   shape=tuple(shape) if shape is not None else None,
                                   dtype=item.get("dtype"), step=int(item.get("step", 0)),
                                   kind=str(item.get("kind", "hidden")), module=str(item.get("module", name)),
                                   role=INPUT if item.get("role") == INPUT else OUTPUT))
    return entries


def _msprobe_tensors(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if "data_name" in value and value.get("type", "torch.Tensor").endswith("Tensor"):
            yield value
            return
        for item in value.values():
            yield from _msprobe_tensors(item)
    elif isinstance(value, list):
        for item in value:
            yield from _msprobe_tensors(item)


def _msprobe_entries(dump_json: Path) -> list[TensorEntry]:
    doc = _read_json(dump_json)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise UsageError(f"{dump_json}: not a MindStudio Probe dump.json (no `data` mapping)")
    step = next((int(m.group(1)) for part in dump_json.parts if (m := _STEP_DIR.match(part))), 0)
    data_dir = dump_json.parent / "dump_tensor_data"
    entries = []
    for op_name, op in doc["data"].items():
        if not isinstance(op, dict):
            continue
        for section in ("input_args", "input_kwargs", "parameters", "output"):
            for tensor in _msprobe_tensors(op.get(section)):
                data_name = str(tensor["data_name"])
                shape = tensor.get("shape")
                dtype = str(tensor.get("dtype", "")).removeprefix("torch.") or None
                entries.append(TensorEntry(name=data_name.removesuffix(".pt").removesuffix(".npy"),
                                           file=data_dir / data_name,
                                           shape=tuple(shape) if shape is not None else None,
                                           dtype=dtype, step=step,
                                           kind="logits" if "lm_head" in op_name else "hidden",
                                           module=str(op_name), role=OUTPUT if section == "output" else INPUT))
    return entries


def open_dump(path: str | Path) -> dict[str, list[TensorEntry]]:
    """Index a dump: {relative part (e.g. "step0/rank0"): tensors in execution order}."""
    root = Path(path)
    if not root.exists():
        raise UsageError(f"dump not found: {root}")
    if root.is_file():
        if root.name == "manifest.json":
            return {".": _own_entries(root)}
        return {".": _msprobe_entries(root)}
    if (root / "manifest.json").exists():
        return {".": _own_entries(root / "manifest.json")}
    found = sorted(root.rglob("dump.json"))
    if not found:
        raise UsageError(f"{root}: neither a bisect-npu dump (manifest.json) nor a MindStudio Probe dump "
                         "(step*/rank*/dump.json)")
    return {_SINGLE_PROCESS_DIR.sub("rank0", str(p.parent.relative_to(root))): _msprobe_entries(p) for p in found}


def open_tensor(entry: TensorEntry) -> TensorFile:
    """Index one tensor's file (.npy or .pt) without reading its elements."""
    try:
        return open_npy(entry.file) if entry.file.suffix == ".npy" else open_pt(entry.file)
    except FileNotFoundError as exc:
        raise UsageError(f"{entry.file}: file of tensor {entry.name!r} is missing from the dump") from exc
    except (PtFormatError, ValueError, OSError, EOFError) as exc:
        raise UsageError(f"{entry.file}: cannot read tensor {entry.name!r} ({exc}); the dump is corrupt or "
                         "truncated") from exc


def write_dump(directory: str | Path, tensors: list[tuple[str, np.ndarray]], step: int = 0,
               logits: tuple[str, ...] = ()) -> Path:
    """Write a bisect-npu dump: one .npy per tensor plus manifest.json, in the order given."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    items = []
    for i, (name, array) in enumerate(tensors):
        file = f"{i:05d}.npy"
        np.save(directory / file, np.ascontiguousarray(array), allow_pickle=False)
        items.append({"name": name, "file": file, "shape": list(array.shape), "dtype": str(array.dtype),
                      "step": step, "kind": "logits" if name in logits else "hidden"})
    manifest = directory / "manifest.json"
    manifest.write_text(json.dumps({"format": OWN_FORMAT, "version": 1, "tensors": items}, indent=1),
                        encoding="utf-8")
    return manifest
