"""Two layer dumps lined up tensor by tensor, so the dump diff compares what both engines hold.

A dump of our probes (and MindStudio Probe's) names each module call `Module.<path>.<Class>.forward.<n>`
with its outputs `...output.<i>`, and the dump diff pairs tensors by that name. Two dumps of one
engine name them alike, but for the class where vllm-ascend swaps in its own (`AscendRMSNorm` for
vLLM's `RMSNorm`): they are lined up by path, call and output. A vLLM dump against a transformers
dump is lined up by the module map (`module_map`): each tensor both hold gets transformers' name on
both sides, fused projections are cut at transformers' sizes, vLLM's decoder layer outputs summed;
what has no counterpart, what only one side captured and what the map does not know are kept
with their reason. The lined-up pair is written as two dumps in MindStudio Probe's layout (the
tensors as dumped are linked, derived ones written as `.npy`), which the dump diff reads as any.
Only outputs are lined up: inputs mean other things on the two engines (vLLM's norms take the
residual too).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bisect_npu.alignment.module_map import MODULE_MAP, TRANSFORMERS, VLLM, Boundary, ModuleMap, transformers_path
from bisect_npu.oracle.dumps.compare import OUTPUT, TensorEntry, open_dump, open_tensor

_OP = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[A-Za-z_]\w*)\.forward\.(?P<call>\d+)$")
_OUTPUT_INDEX = re.compile(r"\.output\.(\d+)$")
_LAYER_NUMBER = re.compile(r"(?<=\.layers\.)\d+(?=\.|$)")
_INTEGERS = ("int", "uint", "bool")


@dataclass(frozen=True)
class Op:
    """One module call of a dump: where it sits, its class, which call, and its tensor outputs by index."""

    path: str
    cls: str
    call: int
    outputs: dict[int, TensorEntry]

    @property
    def label(self) -> str:
        return f"{self.path} ({self.cls})"


@dataclass(frozen=True)
class Source:
    """How one side gives a compared tensor: an output as dumped, a piece of a fused output (columns
    start:stop of the last axis), the sum of vLLM's (hidden, residual), or an output reshaped."""

    entries: tuple[TensorEntry, ...]
    how: str = "as dumped"
    columns: tuple[int, int] | None = None
    shape: tuple[int, ...] | None = None

    @property
    def dtype(self) -> str | None:
        return self.entries[0].dtype


@dataclass(frozen=True)
class Point:
    """One tensor both dumps hold, under one name (`op`, transformers' where the engines differ)."""

    part: str
    op: str
    index: int
    reference: Source
    candidate: Source
    vllm_module: str | None = None
    order: tuple[int, int] = (0, 0)


@dataclass
class LineUp:
    """What two dumps share, tensor by tensor, and what each side leaves out and why."""

    points: list[Point] = field(default_factory=list)
    engines: tuple[str, str] = (TRANSFORMERS, TRANSFORMERS)
    families: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    summed: int = 0
    no_counterpart: dict[str, list[str]] = field(default_factory=dict)
    only_reference: list[str] = field(default_factory=list)
    only_candidate: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)

    @property
    def across_engines(self) -> bool:
        return self.engines[0] != self.engines[1]

    @property
    def renamed(self) -> bool:
        """Whether the dumps must be rewritten to line up (their names or tensors differ)."""
        return any(point.reference.how != "as dumped" or point.candidate.how != "as dumped"
                   or point.reference.entries[0].name != point.candidate.entries[0].name for point in self.points)

    def vllm_module(self, op: str) -> str | None:
        """The vLLM module a lined-up name came from (None where the names are an engine's own)."""
        return next((point.vllm_module for point in self.points if point.op == op and point.vllm_module), None)

    def unknown_line(self) -> str | None:
        """The modules the map does not know, in one line (None when it knows them all)."""
        if not self.unknown:
            return None
        counts = Counter(_pattern(label) for label in self.unknown)
        listed = ", ".join(f"{label}" + (f" x{n}" if n > 1 else "") for label, n in list(counts.items())[:6])
        more = f" and {len(counts) - 6} more" if len(counts) > 6 else ""
        return (f"not compared, not in the vLLM-transformers module map: {listed}{more} "
                "(docs/reference/module-map.md lists the families it knows)")

    def to_dict(self) -> dict[str, Any]:
        return {"engines": {"reference": self.engines[0], "candidate": self.engines[1]}, "families": self.families,
                "compared": len(self.points), "fused_cut": self.cut, "layers_summed": self.summed,
                "no_counterpart": {why: _patterns(labels) for why, labels in self.no_counterpart.items()},
                "only_in_reference": _patterns(self.only_reference),
                "only_in_candidate": _patterns(self.only_candidate),
                "not_in_map": _patterns(self.unknown), "left_out": _patterns(self.left_out)}

    def summary(self) -> str:
        """One paragraph for the alignment's report."""
        said = [f"{len(self.points)} tensors lined up"]
        if self.across_engines:
            said[0] += (f" by the vLLM-transformers module map ({', '.join(self.families) or 'family not named'};"
                        f" reference {self.engines[0]}, candidate {self.engines[1]})")
        else:
            said[0] += " by module path (the classes differ: an engine's own replacements)"
        if self.cut:
            said.append("fused projections cut at transformers' sizes: " + ", ".join(_patterns(self.cut)))
        if self.summed:
            said.append(f"{self.summed} vLLM decoder layer outputs summed (hidden + residual)")
        for why, labels in self.no_counterpart.items():
            said.append(f"no counterpart ({len(labels)}: {', '.join(_patterns(labels)[:3])}): {why}")
        for name, labels in (("only in the reference dump", self.only_reference),
                             ("only in the candidate dump", self.only_candidate)):
            if labels:
                said.append(f"{name}: {', '.join(_patterns(labels)[:4])} (captured on one side)")
        said += _patterns(self.left_out)
        unknown = self.unknown_line()
        if unknown:
            said.append(unknown)
        return "; ".join(said)


def _pattern(label: str) -> str:
    return _LAYER_NUMBER.sub("*", label)


def _patterns(labels: list[str]) -> list[str]:
    """Labels with their layer numbers folded (`model.layers.*.mlp (Qwen2MLP)`), each once, in order."""
    return list(dict.fromkeys(_pattern(label) for label in labels))


def _ops(entries: list[TensorEntry]) -> list[Op] | None:
    """A part's module calls in execution order, None when its names are not module dumps."""
    ops: dict[str, Op] = {}
    for entry in entries:
        if entry.role != OUTPUT:
            continue
        op_name = entry.module or entry.name
        match, index = _OP.match(op_name), _OUTPUT_INDEX.search(entry.name)
        if match is None or index is None:
            return None
        op = ops.setdefault(op_name, Op(match["path"], match["cls"], int(match["call"]), {}))
        op.outputs[int(index.group(1))] = entry
    return list(ops.values())


def _op_name(op: Op, path: str | None = None, cls: str | None = None) -> str:
    return f"Module.{path or op.path}.{cls or op.cls}.forward.{op.call}"


def _is_integer(dtype: str | None) -> bool:
    return bool(dtype) and str(dtype).startswith(_INTEGERS)


def _squeezed(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if shape is None else tuple(n for n in shape if n != 1)


class _Pairing:
    """Lines up one part (a step and rank) of a vLLM dump with a transformers dump."""

    def __init__(self, result: LineUp, part: str, module_map: ModuleMap, vllm_is_reference: bool,
                 sharded: bool) -> None:
        self.result, self.part, self.map = result, part, module_map
        self.vllm_is_reference, self.sharded = vllm_is_reference, sharded
        self.points: list[Point] = []
        self.position: dict[int, int] = {}

    def emit(self, vllm: Source, hf: Source, hf_op: Op, vllm_op: Op, piece: int = 0) -> None:
        """A point in the reference's execution order (a fused output's pieces in their order)."""
        ref, cand = (vllm, hf) if self.vllm_is_reference else (hf, vllm)
        order = (self.position[id(vllm_op if self.vllm_is_reference else hf_op)], piece)
        self.points.append(Point(self.part, _op_name(hf_op), 0, ref, cand, vllm_op.label, order))

    def only(self, side: str, op: Op) -> None:
        is_reference = (side == VLLM) == self.vllm_is_reference
        (self.result.only_reference if is_reference else self.result.only_candidate).append(op.label)

    def no_counterpart(self, why: str, op: Op) -> None:
        self.result.no_counterpart.setdefault(why, []).append(op.label)

    def compatible(self, vllm: Source, hf_entry: TensorEntry, vllm_op: Op) -> Source | None:
        """vLLM's source, reshaped to transformers' shape where they differ only in dimensions of one;
        None (and why, kept) where they cannot be compared."""
        if _is_integer(vllm.dtype) != _is_integer(hf_entry.dtype):
            self.result.left_out.append(f"{vllm_op.label}: {vllm.dtype} against transformers' {hf_entry.dtype} "
                                        "(an integer output is not comparable with a float one)")
            return None
        shape = vllm.shape or (vllm.entries[0].shape if vllm.columns is None else None)
        if shape is None or hf_entry.shape is None or tuple(shape) == tuple(hf_entry.shape):
            return vllm
        if _squeezed(tuple(shape)) == _squeezed(tuple(hf_entry.shape)):
            return Source(vllm.entries, "reshape" if vllm.how == "as dumped" else vllm.how, vllm.columns,
                          tuple(hf_entry.shape))
        if self.sharded:
            self.result.left_out.append(f"{vllm_op.label}: shape {list(shape)} against transformers' "
                                        f"{list(hf_entry.shape)}, a tensor-parallel shard")
            return None
        return vllm

    def cut(self, vllm_op: Op, parts: list[Op], names: tuple[str, ...]) -> None:
        fused = vllm_op.outputs.get(0)
        sizes = [part.outputs[0].shape[-1] if 0 in part.outputs and part.outputs[0].shape else None for part in parts]
        if fused is None or fused.shape is None or any(size is None for size in sizes):
            return
        width = fused.shape[-1]
        if sum(int(size or 0) for size in sizes) != width:
            reason = "a tensor-parallel shard" if self.sharded else "another split"
            self.result.left_out.append(f"{vllm_op.label}: {width} columns, transformers' {'+'.join(names)} "
                                        f"{'+'.join(str(s) for s in sizes)} ({reason})")
            return
        start = 0
        for piece, (part, size) in enumerate(zip(parts, sizes, strict=True)):
            stop = start + int(size or 0)
            source = self.compatible(Source((fused,), "split", (start, stop), (*fused.shape[:-1], stop - start)),
                                     part.outputs[0], vllm_op)
            if source is not None:
                self.emit(source, Source((part.outputs[0],)), part, vllm_op, piece)
            start = stop
        self.result.cut.append(f"{vllm_op.label} -> {' | '.join(names)}")

    def pair(self, vllm_ops: list[Op], hf_ops: list[Op]) -> None:
        for position, op in enumerate(vllm_ops if self.vllm_is_reference else hf_ops):
            self.position[id(op)] = position
        self.pair_ops(vllm_ops, hf_ops)
        self.result.points += sorted(self.points, key=lambda point: point.order)

    def pair_ops(self, vllm_ops: list[Op], hf_ops: list[Op]) -> None:
        by_place = {(op.path, op.call): op for op in hf_ops}
        used: set[int] = set()
        for op in vllm_ops:
            one_sided = self.map.one_sided(op.path)
            if one_sided is not None:
                self.no_counterpart(one_sided.why, op)
                continue
            known = self.map.lookup(VLLM, op.path, op.cls)
            hf_path = transformers_path(op.path)
            hf = by_place.get((hf_path, op.call))
            split = next((c for c in known if c.boundary is Boundary.SPLIT), None)
            if hf is None and split is not None:
                parent = hf_path.rsplit(".", 1)[0]
                parts = [by_place.get((f"{parent}.{name}", op.call)) for name in split.parts]
                if all(part is not None for part in parts):
                    found = [part for part in parts if part is not None]
                    used.update(id(part) for part in found)
                    self.cut(op, found, split.parts)
                else:
                    self.only(VLLM, op)
                continue
            if hf is None:
                (self.only(VLLM, op) if known else self.result.unknown.append(f"vLLM {op.label}"))
                continue
            used.add(id(hf))
            counterpart = self.map.pair(op.path, op.cls, hf.path, hf.cls)
            if counterpart is None:
                self.result.unknown.append(f"vLLM {op.label} against transformers' {hf.cls}")
                continue
            self.result.families += [name for name in self.map.families_of(VLLM, op.path, op.cls)
                                     if name in self.map.families_of(TRANSFORMERS, hf.path, hf.cls)]
            if counterpart.boundary is Boundary.NONE:
                self.no_counterpart(counterpart.why, op)
                continue
            self.same(op, hf, layer=counterpart.boundary is Boundary.LAYER)
        for hf in hf_ops:
            if id(hf) in used:
                continue
            one_sided = self.map.one_sided(hf.path)
            if one_sided is not None:
                self.no_counterpart(one_sided.why, hf)
            elif self.map.lookup(TRANSFORMERS, hf.path, hf.cls):
                self.only(TRANSFORMERS, hf)
            else:
                self.result.unknown.append(f"transformers {hf.label}")

    def same(self, vllm_op: Op, hf_op: Op, layer: bool) -> None:
        first, hf_first = vllm_op.outputs.get(0), hf_op.outputs.get(0)
        if first is None or hf_first is None:
            return
        second = vllm_op.outputs.get(1)
        if layer and second is not None and second.shape == first.shape:
            source = Source((first, second), "sum")
            self.result.summed += 1
        else:
            source = Source((first,))
        lined = self.compatible(source, hf_first, vllm_op)
        if lined is not None:
            self.emit(lined, Source((hf_first,)), hf_op, vllm_op)


def _by_path(result: LineUp, part: str, ref_ops: list[Op], cand_ops: list[Op]) -> None:
    """One engine on both sides: every output both hold at the same path, call and index."""
    theirs = {(op.path, op.call, index): entry for op in cand_ops for index, entry in op.outputs.items()}
    mine = {(op.path, op.call, index) for op in ref_ops for index in op.outputs}
    for op in ref_ops:
        for index, entry in sorted(op.outputs.items()):
            cand = theirs.get((op.path, op.call, index))
            if cand is None:
                result.only_reference.append(f"{op.label} output {index}")
            else:
                result.points.append(Point(part, _op_name(op), index, Source((entry,)), Source((cand,))))
    result.only_candidate += [f"{op.path} ({op.cls}) output {index}" for op in cand_ops
                              for index in op.outputs if (op.path, op.call, index) not in mine]


def line_up(reference_dump: str | Path, candidate_dump: str | Path, reference_engine: str, candidate_engine: str,
            module_map: ModuleMap = MODULE_MAP) -> LineUp | None:
    """The tensors two module dumps share; None when either is not a module dump (a bisect-npu dump's
    own names), which is then compared by its names as written."""
    ref_parts, cand_parts = open_dump(reference_dump), open_dump(candidate_dump)
    result = LineUp(engines=(reference_engine, candidate_engine))
    across = reference_engine != candidate_engine
    vllm_parts = ref_parts if reference_engine == VLLM else cand_parts
    sharded = any(re.search(r"rank[1-9]", part) for part in vllm_parts)
    extra = sorted(set(ref_parts) ^ set(cand_parts))
    if extra:
        result.left_out.append(f"{', '.join(extra[:4])}: in one dump only (another step, or the ranks of a "
                               "tensor-parallel run against an unsharded one)")
    for part in (p for p in ref_parts if p in cand_parts):
        ref_ops, cand_ops = _ops(ref_parts[part]), _ops(cand_parts[part])
        if ref_ops is None or cand_ops is None:
            return None
        if not across:
            _by_path(result, part, ref_ops, cand_ops)
            continue
        vllm_ops, hf_ops = (ref_ops, cand_ops) if reference_engine == VLLM else (cand_ops, ref_ops)
        _Pairing(result, part, module_map, reference_engine == VLLM, sharded).pair(vllm_ops, hf_ops)
    result.families = list(dict.fromkeys(result.families))
    return result


def _derived(source: Source) -> np.ndarray:
    """The tensor a source gives, read from its files (float32 where bfloat16 was stored)."""
    arrays = [open_tensor(entry).read_all() for entry in source.entries]
    value = arrays[0].astype(np.float32) + arrays[1].astype(np.float32) if source.how == "sum" else arrays[0]
    if source.columns is not None:
        value = value[..., source.columns[0]:source.columns[1]]
    if source.shape is not None:
        value = value.reshape(source.shape)
    return np.ascontiguousarray(value)


def _write_tensor(source: Source, directory: Path, data_name: str) -> dict[str, Any]:
    first = source.entries[0]
    if source.how == "as dumped":
        target = directory / f"{data_name}{first.file.suffix}"
        os.symlink(first.file.resolve(), target)
        shape = list(first.shape) if first.shape is not None else None
    else:
        target = directory / f"{data_name}.npy"
        value = _derived(source)
        np.save(target, value, allow_pickle=False)
        shape = list(value.shape)
    return {"type": "torch.Tensor", "dtype": f"torch.{first.dtype}" if first.dtype else None, "shape": shape,
            "data_name": target.name}


def write_views(lined: LineUp, reference_dir: Path, candidate_dir: Path) -> tuple[Path, Path]:
    """Both sides' shared tensors as MindStudio Probe dumps under one name each, in each side's order."""
    for root, side in ((reference_dir, "reference"), (candidate_dir, "candidate")):
        docs: dict[str, dict[str, Any]] = {}
        for point in lined.points:
            directory = root / point.part / "dump_tensor_data"
            if point.part not in docs:
                directory.mkdir(parents=True, exist_ok=True)
                docs[point.part] = {"task": "tensor", "level": "L0", "framework": "pytorch",
                                    "dump_data_dir": str(directory), "data": {}}
            source = point.reference if side == "reference" else point.candidate
            tensor = _write_tensor(source, directory, f"{point.op}.output.{point.index}")
            docs[point.part]["data"].setdefault(point.op, {"output": []})["output"].append(tensor)
        for part, doc in docs.items():
            (root / part / "dump.json").write_text(json.dumps(doc), encoding="utf-8")
    return reference_dir, candidate_dir
