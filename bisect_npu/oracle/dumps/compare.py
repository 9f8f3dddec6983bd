"""Tensor-dump diff: per-tensor metrics and the first tensor, in execution order, that diverges.

Two dump formats are read:

* **bisect-npu dump**: a directory with `manifest.json`
  `{"format": "bisect-npu-dump", "version": 1, "tensors": [{"name": "model.layers.3.mlp.output",
  "file": "0007.npy", "shape": [512, 1024], "dtype": "float32", "step": 0, "kind": "hidden"}]}`,
  tensors listed in execution order, one `.npy` (preferred: memory-mapped) or `.pt` file each.
  `kind: "logits"` (or a name containing `logits`/`lm_head`) adds KL divergence and top-k overlap.
* **MindStudio Probe dump**: `step{N}/rank{ID}/dump.json` (`rank` or `proc{PID}` when not
  distributed: read as `rank0`, so they line up with a one-rank distributed dump)
  with `data: {op_name: {input_args, input_kwargs, parameters, output}}` in execution order, each
  tensor a mapping with `dtype`, `shape`, `data_name` (a file in `dump_tensor_data/`). The path
  given may be the dump root, a step/rank directory, or a `dump.json`. Per op we compare
  input_args, input_kwargs, parameters, output, in that order. `.pt` files are read without
  torch (`oracle/dumps/formats.py`).

Metrics follow msprobe's compare: cosine similarity, max absolute error, max relative error
(|a - b| / (|b| + eps), b the reference), shares of elements with relative error below 1/1000 and
5/1000; plus the share within the dumped dtype's own precision (`within_tol`: one bf16 ulp, 2**-7
relative, for bf16; 1/1000 for fp16 and fp32, msprobe's line), which rounding alone never leaves.

A tensor diverges when it has a different shape (or a float against a non-float dtype), is
missing, holds NaN/Inf where the reference does not, or breaks a rule. A lower-precision float
candidate (bf16/fp16 against an fp32 golden) is upcast and judged at its own precision.
* absolute: a pass line of LogitsConfig (msprobe's cosine rule and the optional lines);
* relative (a module's output against what its inputs explain, msprobe's amplification rule
  generalised): the output agrees far worse than the module's inputs shaped like it (the hidden
  state it transforms; all its input_args, input_kwargs and parameters when none is) or, for a
  dump without inputs, than the output before it in execution order.
  msprobe's own form (inputs within 1/1000 > 0.9, output < 0.1), then the pair's own noise
  (`peers`): the cosine-distance amplification, and the norm ratio's change, of a module against
  the same module kind in the other layers. Without peers (or with `noise_from_peers` off) the
  fixed line: the cosine distance `amplification` times the input's and above the dtype's floor.
  Element shares are not amplified against the input: one-ulp flips of inputs move outputs near
  zero by many ulps, so a clean bf16 run's shares fall layer after layer without any error.
  All need a max absolute error above `cosine_abs_floor` (near-zero tensors say little), and a
  baseline: the first tensor of a dump without inputs has nothing to be relative to.
The first divergent tensor in execution order is where the drift enters; the outputs after it
whose drift its input did not have, without a rule of their own, are its carriers.

Why streamed: real dumps hold hundreds of tensors and a 152K-vocabulary logits tensor. Each file
is indexed (`formats.open_pt` / `open_npy`, while the workers compare the tensors before it) and
read `chunk_elements` at a time by positioned reads; large tensors are split into segments so
`workers` threads (numpy releases the GIL) share one tensor too. Peak memory is a few chunks per
worker, whatever the largest tensor. Why buffers: each worker reads every chunk into the same
arrays and computes every metric in place (`out=`); fresh arrays per chunk cost more in page
faults than the arithmetic done on them (the allocator hands multi-megabyte blocks back to the
kernel), and a chunk of the default size keeps them in a core's cache.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.formats import PtFormatError, TensorFile, open_npy, open_pt
from bisect_npu.oracle.dumps.peers import Line, leave_one_out_lines, log_ratio, module_kind, rounding_distance
from bisect_npu.oracle.dumps.routing import RouterSide, RoutingReport, compare_routing

OWN_FORMAT = "bisect-npu-dump"
# Chunks per unit of work: a tensor larger than this is shared between the workers.
SEGMENT_CHUNKS = 8
_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)(?:\.|$)")
_STEP_DIR = re.compile(r"^step(\d+)$")
# A run that is not distributed writes `rank` (vllm-ascend's msprobe guide) or `proc{PID}` (what
# mindstudio-probe 26.2 wrote here) where a distributed one writes `rank{ID}`: all name rank 0.
_SINGLE_PROCESS_DIR = re.compile(r"(?<![^/])(?:proc\d+|rank)(?![^/])")
_EPS32 = np.float32(np.finfo(np.float32).eps)
# Relative spacing of the dumped dtype's values (one ulp at the top of a binade).
_DTYPE_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-23, "float64": 2.0**-52}
# A router's ids and weights: judged by the routing comparison, never by cosine or as a baseline.
INPUT, OUTPUT, ROUTING = "input", "output", "routing"
_OP_NAME = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[A-Za-z_]\w*)\.forward\.(?P<call>\d+)$")
_TENSOR_NAME = re.compile(r"\.(?P<section>input|output|parameters)\.(?P<key>\w+)$")
_INTEGER_DTYPES = ("int", "uint", "bool")
# Class names of an MoE block (HF's Qwen3MoeSparseMoeBlock, DeepseekV3MoE; vLLM's alike).
_MOE_BLOCKS = ("MoeBlock", "MoE")


def dtype_tolerance(dtype: str | None) -> float:
    """Relative error that rounding to `dtype` explains: one ulp, never tighter than msprobe's 1/1000."""
    return max(1e-3, _DTYPE_EPS.get(dtype or "", 0.0))


def coarser_dtype(a: str, b: str) -> str | None:
    """The lower precision of two floating dtypes (the one a pair is judged at), None unless both are floats."""
    if a not in _DTYPE_EPS or b not in _DTYPE_EPS:
        return None
    return a if _DTYPE_EPS[a] >= _DTYPE_EPS[b] else b


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


@dataclass
class TensorDiff:
    """Comparison of one tensor pair; `problem` is set when it diverges, `rule` says which rule fired and
    `baseline` holds what it was measured against (the module's inputs or the neighbour before it)."""

    name: str
    index: int
    step: int
    layer: int | None
    module: str | None = None
    role: str = OUTPUT
    dtype: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    problem: str | None = None
    rule: str | None = None
    baseline: dict[str, Any] | None = None
    candidate_dtype: str | None = None
    shape: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "index": self.index, "step": self.step, "layer": self.layer,
                               "problem": self.problem, "rule": self.rule,
                               **{k: _round(v) for k, v in self.metrics.items()}}
        if self.module is not None:
            out["module"] = self.module
        if self.candidate_dtype is not None:
            out["dtype"], out["candidate_dtype"] = self.dtype, self.candidate_dtype
        if self.baseline is not None:
            out["baseline"] = _rounded(self.baseline)
        return out


@dataclass
class DumpComparison:
    rows: list[TensorDiff]
    seconds: float
    bytes_read: int
    largest_read: int = 0
    amplification: float = 5.0
    routing: list[RoutingReport] = field(default_factory=list)
    routing_unchecked: list[str] = field(default_factory=list)

    @property
    def first_divergent(self) -> TensorDiff | None:
        return next((row for row in self.rows if row.problem is not None), None)

    @property
    def worst_cosine(self) -> TensorDiff | None:
        scored = [row for row in self.rows if "cosine" in row.metrics]
        return min(scored, key=lambda row: row.metrics["cosine"], default=None)

    def after_first(self) -> tuple[list[TensorDiff], list[TensorDiff]]:
        """(carriers, also divergent) after the first divergent tensor: outputs whose cosine distance is
        `amplification` times what the first one's input had (and above the dtype's floor) without a
        rule of their own, and tensors where a rule fires again (a second source, or a module
        enclosing the first one)."""
        first = self.first_divergent
        if first is None:
            return [], []
        later = self.rows[first.index + 1:]
        before = 1.0 - first.baseline["cosine"] if first.baseline else 0.0
        also = [row for row in later if row.problem is not None]
        carriers = [row for row in later if row.problem is None and row.role == OUTPUT and row.metrics
                    and 1.0 - row.metrics["cosine"] >= max(_cosine_floor(row.dtype), self.amplification * before)]
        return carriers, also


def _round(value: float) -> float:
    return value if not math.isfinite(value) else float(f"{value:.6g}")


def _rounded(figures: dict[str, Any]) -> dict[str, Any]:
    """`figures` with every float (nested mappings too) rounded to six digits."""
    return {k: _round(v) if isinstance(v, float) else _rounded(v) if isinstance(v, dict) else v
            for k, v in figures.items()}


# ---------------------------------------------------------------- reading dumps


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


# ---------------------------------------------------------------- metrics


@dataclass
class ChunkSums:
    """What the metrics need, summed or maxed over chunks; two halves of a tensor merge into its whole."""

    size: int = 0
    cand_sq: float = 0.0
    ref_sq: float = 0.0
    diff_sq: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    within_1e3: int = 0
    within_5e3: int = 0
    within_tol: int = 0
    nonfinite_c: int = 0
    nonfinite_r: int = 0
    kl: float = 0.0
    overlap: float = 0.0
    rows: int = 0
    rows_skipped: int = 0
    largest_read: int = 0

    def merge(self, other: ChunkSums) -> None:
        for name in ("size", "cand_sq", "ref_sq", "diff_sq", "within_1e3", "within_5e3", "within_tol",
                     "nonfinite_c", "nonfinite_r", "kl", "overlap", "rows", "rows_skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_rel = max(self.max_rel, other.max_rel)
        self.largest_read = max(self.largest_read, other.largest_read)

    def add_chunk(self, c: np.ndarray, r: np.ndarray, tolerance: float, vocab: int | None, top_k: int,
                  scratch: Scratch) -> None:
        """Fold one chunk in (rows of `vocab` for logits); the NaN/Inf pairs are counted, the sums cover the
        finite ones, and a tensor with such a chunk gets no KL (over NaN/Inf it says nothing)."""
        self.size += c.size
        diff = np.subtract(c, r, out=scratch.d[:c.size])
        sums = (float(c @ c), float(r @ r), float(diff @ diff))
        if not all(math.isfinite(x) for x in sums):  # NaN/Inf somewhere (or float32 overflow): mask, widen
            fin_c, fin_r = np.isfinite(c), np.isfinite(r)
            self.nonfinite_c += int(c.size - np.count_nonzero(fin_c))
            self.nonfinite_r += int(r.size - np.count_nonzero(fin_r))
            both = fin_c & fin_r
            c, r = c[both].astype(np.float64), r[both].astype(np.float64)
            diff = c - r
            sums = (float(c @ c), float(r @ r), float(diff @ diff))
            self.rows_skipped += vocab is not None
            vocab, denom, mask = None, np.empty_like(r), np.empty(r.size, np.bool_)
        else:
            denom, mask = scratch.t[:c.size], scratch.mask[:c.size]
        self.cand_sq += sums[0]
        self.ref_sq += sums[1]
        self.diff_sq += sums[2]
        if vocab:
            self.add_rows(c.reshape(-1, vocab), r.reshape(-1, vocab), diff.reshape(-1, vocab), top_k, denom)
        if not diff.size:
            return
        np.abs(diff, out=diff)
        self.max_abs = max(self.max_abs, float(diff.max()))
        np.abs(r, out=denom)
        denom += _EPS32
        np.divide(diff, denom, out=diff)
        self.max_rel = max(self.max_rel, float(diff.max()))
        self.within_1e3 += int(np.count_nonzero(np.less(diff, 1e-3, out=mask)))
        self.within_5e3 += int(np.count_nonzero(np.less(diff, 5e-3, out=mask)))
        self.within_tol += int(np.count_nonzero(np.less_equal(diff, tolerance, out=mask)))

    def add_rows(self, c: np.ndarray, r: np.ndarray, diff: np.ndarray, top_k: int, scratch: np.ndarray) -> None:
        """KL(reference || candidate) and top-k overlap of rows over the vocabulary; `diff` is c - r.

        float32 throughout, one exp and one BLAS dot per row and side, in `scratch` (a row's worth):
        KL = log(sum_c / sum_r) - (exp_r . diff) / sum_r - (max_r - max_c), with exp_x = e^(x - max_x)
        and sum_x its sum. KL of identical rows stays exactly 0, and float32 sums of a 152K-vocabulary
        row are far finer than any pass line on KL.
        """
        max_r, max_c = r.max(axis=1), c.max(axis=1)
        work = scratch[:r.shape[1]]
        for row in range(r.shape[0]):
            np.exp(np.subtract(r[row], max_r[row], out=work), out=work)
            sum_r, moved = float(work.sum()), float(work @ diff[row])
            np.exp(np.subtract(c[row], max_c[row], out=work), out=work)
            sum_c = float(work.sum())
            self.kl += (math.log(sum_c) - math.log(sum_r) - moved / sum_r
                        - (float(max_r[row]) - float(max_c[row])))
        k = min(top_k, r.shape[1])
        top_r, top_c = top_k_indices(r, k), top_k_indices(c, k)
        self.overlap += float((top_r[:, :, None] == top_c[:, None, :]).any(axis=2).sum()) / k
        self.rows += r.shape[0]

    def norm_ratio(self) -> float:
        """|candidate| / |reference| (L2): a gain or a lost scale, which cosine cannot see."""
        if self.ref_sq == 0.0:
            return 1.0 if self.cand_sq == 0.0 else math.inf
        return math.sqrt(self.cand_sq / self.ref_sq)

    def metrics(self, logits: bool) -> dict[str, float]:
        size = max(1, self.size)
        if self.cand_sq == 0.0 and self.ref_sq == 0.0:
            cosine = 1.0
        elif self.cand_sq == 0.0 or self.ref_sq == 0.0:
            cosine = 0.0
        else:  # 1 - cos from the squared difference: exact near 1, where c.r / |c||r| loses digits
            norm_c, norm_r = math.sqrt(self.cand_sq), math.sqrt(self.ref_sq)
            distance = (self.diff_sq - (norm_c - norm_r) ** 2) / (2 * norm_c * norm_r)
            cosine = min(1.0, max(-1.0, 1.0 - distance))
        out = {"cosine": cosine, "max_abs_error": self.max_abs, "max_rel_error": self.max_rel,
               "within_1e3": self.within_1e3 / size, "within_5e3": self.within_5e3 / size,
               "within_tol": self.within_tol / size, "norm_ratio": self.norm_ratio(),
               "nonfinite_candidate": float(self.nonfinite_c), "nonfinite_reference": float(self.nonfinite_r)}
        if logits and self.rows and not self.rows_skipped:
            out["kl"] = self.kl / self.rows
            out["top_k_overlap"] = self.overlap / self.rows
        return out


def top_k_indices(rows: np.ndarray, k: int, block: int = 2048) -> np.ndarray:
    """Indices of each row's k largest values (in no order).

    Why blocks: partitioning every whole row of a large vocabulary is the slow part; the k largest
    values lie in the k blocks with the largest maxima, so one max-reduction finds those blocks,
    and the same search within them (blocks of 64) leaves a few hundred values to partition.
    """
    n_rows, vocab = rows.shape
    n_blocks = vocab // block
    if n_blocks < 4 * k or vocab <= 1024:
        return np.argpartition(rows, vocab - k, axis=1)[:, vocab - k:]
    whole = n_blocks * block
    head = rows[:, :whole].reshape(n_rows, n_blocks, block)
    best = np.argpartition(head.max(axis=2), n_blocks - k, axis=1)[:, n_blocks - k:]
    line = np.arange(n_rows)[:, None]
    values = head[line, best].reshape(n_rows, -1)
    candidates = (best[:, :, None] * block + np.arange(block)).reshape(n_rows, -1)
    if vocab > whole:
        values = np.concatenate([values, rows[:, whole:]], axis=1)
        candidates = np.concatenate([candidates, np.tile(np.arange(whole, vocab), (n_rows, 1))], axis=1)
    chosen: np.ndarray = candidates[line, top_k_indices(values, k, max(1, block // 32))]
    return chosen


class Scratch:
    """One worker's buffers for a chunk, reused for every chunk it reads (see `TensorFile.read_into`)."""

    def __init__(self, elements: int, itemsize: int) -> None:
        self.c, self.r, self.d, self.t = (np.empty(elements, np.float32) for _ in range(4))
        self.mask = np.empty(elements, np.bool_)
        self.raw = np.empty(elements * itemsize, np.uint8)

    def fits(self, elements: int, itemsize: int) -> bool:
        return self.c.size >= elements and self.raw.size >= elements * itemsize


_worker = threading.local()


def _scratch(elements: int, itemsize: int) -> Scratch:
    """This thread's buffers, grown when a chunk needs more (a worker thread's die with it)."""
    scratch: Scratch | None = getattr(_worker, "scratch", None)
    if scratch is None or not scratch.fits(elements, itemsize):
        if scratch is not None:
            elements, itemsize = max(elements, scratch.c.size), max(itemsize, scratch.raw.size // scratch.c.size)
        scratch = _worker.scratch = Scratch(elements, itemsize)
    return scratch


def segment_sums(cand: TensorFile, ref: TensorFile, start: int, stop: int, chunk: int, tolerance: float,
                 vocab: int | None, top_k: int) -> ChunkSums:
    """Elements [start, stop) of a pair, `chunk` at a time (whole rows of `vocab` for logits)."""
    sums = ChunkSums()
    itemsize = max(cand.stored.itemsize, ref.stored.itemsize)
    scratch = _scratch(min(chunk, stop - start), itemsize)
    fd_c = cand.open()
    try:
        fd_r = ref.open()
        try:
            for at in range(start, stop, chunk):
                count = min(chunk, stop - at)
                c = cand.read_into(fd_c, at, count, scratch.c, scratch.raw)
                r = ref.read_into(fd_r, at, count, scratch.r, scratch.raw)
                sums.largest_read = max(sums.largest_read, count * itemsize)
                sums.add_chunk(c, r, tolerance, vocab, top_k, scratch)
        finally:
            if fd_r is not None:
                os.close(fd_r)
    finally:
        if fd_c is not None:
            os.close(fd_c)
    return sums


# ---------------------------------------------------------------- rules


def _problem(metrics: dict[str, float], cfg: LogitsConfig) -> str | None:
    """The first absolute pass line a tensor breaks, in words, or None."""
    if metrics["nonfinite_candidate"] > metrics["nonfinite_reference"]:
        return f"{int(metrics['nonfinite_candidate'])} NaN/Inf values (reference has " \
               f"{int(metrics['nonfinite_reference'])})"
    cosine_line = cfg.min_cosine if metrics.get("max_abs_error", float("inf")) > cfg.cosine_abs_floor \
        else cfg.min_cosine_always
    lines = [("cosine", cosine_line, "<"), ("max_abs_error", cfg.max_abs_error, ">"),
             ("max_rel_error", cfg.max_rel_error, ">"), ("within_1e3", cfg.min_within_1e3, "<"),
             ("within_5e3", cfg.min_within_5e3, "<"), ("kl", cfg.max_kl, ">")]
    for key, line, broken_when in lines:
        if line is None or key not in metrics:
            continue
        value = metrics[key]
        if (value < line) if broken_when == "<" else (value > line):
            return f"{key} {value:.6g} {broken_when} {line:g}"
    return None


def _cosine_floor(dtype: str | None) -> float:
    """Cosine distance that rounding to `dtype` can leave in one module's output: half its tolerance, squared."""
    return rounding_distance(dtype_tolerance(dtype))


def _baseline(rows: list[TensorDiff]) -> dict[str, Any] | None:
    """The worst agreement among `rows`, metric by metric (None when none was measured)."""
    measured = [row for row in rows if row.metrics]
    if not measured:
        return None
    return {"tensors": [row.name for row in measured],
            "cosine": min(row.metrics["cosine"] for row in measured),
            "within_1e3": min(row.metrics["within_1e3"] for row in measured),
            "within_tol": min(row.metrics["within_tol"] for row in measured),
            "max_rel_error": max(row.metrics["max_rel_error"] for row in measured),
            "norm_change": max(log_ratio(row.metrics.get("norm_ratio", 1.0)) for row in measured)}


def _transformed_inputs(row: TensorDiff, inputs: list[TensorDiff]) -> list[TensorDiff]:
    """The inputs shaped like the output (the hidden state a layer, attention or MLP transforms), or all of
    them when none is. Why: auxiliary inputs (the rotary cos/sin, position ids, masks) and the weights are
    not what the module transforms; a bf16 model's rotary tables, cast from its own bf16 `inv_freq`, differ
    from an fp32 golden's by about one rounding, and an output judged against them looks amplified."""
    shaped = [item for item in inputs if item.metrics and row.shape is not None and item.shape == row.shape]
    return shaped or inputs


def _input_is_exact(row: TensorDiff, base: dict[str, Any]) -> bool:
    """Whether the module's input agrees to within one rounding (bit-identical, or just cast): its
    amplification then says nothing, and its output distance is judged against its peers' instead."""
    return bool(1.0 - base["cosine"] < _cosine_floor(row.dtype))


def _distance_statistic(row: TensorDiff, base: dict[str, Any]) -> tuple[str, float]:
    """("amplification", log(output's cosine distance / its input's)) or, for an exact input,
    ("distance", log(output's cosine distance)); distances floored at one rounding to the row's dtype."""
    floor = _cosine_floor(row.dtype)
    out = math.log(max(1.0 - row.metrics["cosine"], floor))
    if _input_is_exact(row, base):
        return "distance", out
    return "amplification", out - math.log(max(1.0 - base["cosine"], floor))


def _norm_change(row: TensorDiff, base: dict[str, Any]) -> float:
    """How far the output's norm ratio moved from 1 (log), less what its inputs' had moved."""
    return log_ratio(row.metrics["norm_ratio"]) - float(base["norm_change"])


@dataclass
class PeerLines:
    """The lines each output meets, drawn from its kind's other layers (or the highest of any kind's):
    its amplification's (or, for an exact input, its output distance's) and its norm change's."""

    distance: dict[int, tuple[str, Line]]
    norm: dict[int, Line]

    @staticmethod
    def of(measured: list[tuple[TensorDiff, dict[str, Any]]], cfg: LogitsConfig) -> PeerLines:
        amp: dict[str, list[tuple[int, float]]] = {}
        dist: dict[str, list[tuple[int, float]]] = {}
        norm: dict[str, list[tuple[int, float]]] = {}
        floor = math.log(cfg.peer_min_factor)
        dtypes = {row.index: row.dtype for row, _ in measured}
        exact = {row.index for row, base in measured if _input_is_exact(row, base)}
        for row, base in measured:
            kind = module_kind(row.module, row.name)
            statistic, value = _distance_statistic(row, base)
            (amp if statistic == "amplification" else dist).setdefault(kind, []).append((row.index, value))
            if statistic == "amplification":  # every output's distance is a peer of an exact-input one
                dist.setdefault(kind, []).append((row.index, math.log(max(1.0 - row.metrics["cosine"],
                                                                          _cosine_floor(row.dtype)))))
            change = _norm_change(row, base)
            if math.isfinite(change):
                norm.setdefault(kind, []).append((row.index, change))
        amp_lines = _with_fallback(leave_one_out_lines(amp, cfg.peer_mads, cfg.min_peers, lambda _: floor), amp)
        dist_lines = _with_fallback(leave_one_out_lines(dist, cfg.peer_mads, cfg.min_peers, lambda _: floor), dist)
        distance = {index: ("distance", line) for index, line in dist_lines.items() if index in exact}
        distance.update({index: ("amplification", line) for index, line in amp_lines.items() if index not in exact})
        norm_lines = leave_one_out_lines(norm, cfg.peer_mads, cfg.min_peers,
                                         lambda index: dtype_tolerance(dtypes[index]) / 2)
        return PeerLines(distance, _with_fallback(norm_lines, norm))


def _with_fallback(lines: dict[int, Line], kinds: dict[str, list[tuple[int, float]]]) -> dict[int, Line]:
    """`lines`, and for members of kinds too small for their own, the highest line of any kind."""
    if not lines:
        return lines
    highest = max(lines.values(), key=lambda line: line.line)
    return {index: lines.get(index, highest) for members in kinds.values() for index, _ in members}


def _peer_problem(row: TensorDiff, base: dict[str, Any], lines: PeerLines) -> tuple[str, str, dict[str, Any]] | None:
    """(rule, problem, the noise it stood against) when the output stands out from its peers' noise."""
    distance, distance_in = 1.0 - row.metrics["cosine"], 1.0 - base["cosine"]
    if row.index in lines.distance:
        statistic, line = lines.distance[row.index]
        value = _distance_statistic(row, base)[1]
        if value > line.line:
            noise = {"statistic": statistic, "value": math.exp(value), "peer_median": math.exp(line.median),
                     "line": math.exp(line.line), "peers": line.peers, "above_line": math.exp(value - line.line)}
            peers, reach, median = line.peers, math.exp(line.line), math.exp(line.median)
            what = (f"amplified x{math.exp(value):.3g} where its {peers} peers' noise reaches x{reach:.3g} (median "
                    f"x{median:.3g})") if statistic == "amplification" else (
                f"its input exact, where its {peers} peers' output distance reaches {reach:.3g} (median {median:.3g})")
            cosine = row.metrics["cosine"]
            return "cosine_amplification", (
                f"cosine distance {distance:.4g} vs {distance_in:.4g} of its input's (cosine {cosine:.7g}): "
                f"{what}, {noise['above_line']:.3g} times the line"), noise
    if row.index in lines.norm:
        line = lines.norm[row.index]
        value = _norm_change(row, base)
        if value > line.line:
            noise = {"statistic": "norm_change", "value": value, "peer_median": line.median, "line": line.line,
                     "peers": line.peers, "above_line": value / line.line if line.line > 0 else math.inf}
            return "norm_ratio", (
                f"norm ratio {row.metrics['norm_ratio']:.5g} (its input's moved {base['norm_change']:.3g} in log): "
                f"moved {value:.4g} where its {line.peers} peers' noise reaches {line.line:.3g} (median "
                f"{line.median:.3g}), {noise['above_line']:.3g} times the line"), noise
    return None


def _relative_problem(row: TensorDiff, base: dict[str, Any], cfg: LogitsConfig,
                      lines: PeerLines | None = None) -> tuple[str, str, dict[str, Any] | None] | None:
    """(rule, problem, noise) when the output agrees far worse than its baseline explains."""
    out = row.metrics
    if out["max_abs_error"] <= cfg.cosine_abs_floor:
        return None
    if cfg.msprobe_rule and base["within_1e3"] > 0.9 and out["within_1e3"] < 0.1:
        return "msprobe_amplification", (f"within_1e3 {out['within_1e3']:.4g} while its input's is "
                                         f"{base['within_1e3']:.4g} (msprobe: input > 0.9, output < 0.1)"), None
    if lines is not None and (row.index in lines.distance or row.index in lines.norm):
        return _peer_problem(row, base, lines)
    distance, distance_in = 1.0 - out["cosine"], 1.0 - base["cosine"]
    if distance >= _cosine_floor(row.dtype) and distance >= cfg.amplification * distance_in:
        return "cosine_amplification", (f"cosine distance {distance:.4g} vs {distance_in:.4g} of its input's "
                                        f"(cosine {out['cosine']:.7g} vs {base['cosine']:.7g})"), None
    return None


def apply_relative_rules(rows: list[TensorDiff], cfg: LogitsConfig) -> None:
    """Judge each output not already divergent against its module's inputs, or the output before it: against
    its peers' noise (`cfg.noise_from_peers`), else the fixed amplification line."""
    inputs: dict[tuple[int, str | None], list[TensorDiff]] = {}
    previous_output: TensorDiff | None = None
    measured: list[tuple[TensorDiff, dict[str, Any]]] = []
    for row in rows:
        if row.role == INPUT:
            inputs.setdefault((row.step, row.module), []).append(row)
            continue
        if row.role == ROUTING:
            continue
        base_rows = _transformed_inputs(row, inputs.get((row.step, row.module), [])) or (
            [previous_output] if previous_output else [])
        base = _baseline(base_rows)
        if base is not None and row.metrics:
            measured.append((row, base))
        if base is not None and row.problem is not None:
            row.baseline = base
        previous_output = row
    judged = [(row, base) for row, base in measured if row.problem is None] if cfg.relative else []
    lines = PeerLines.of(measured, cfg) if cfg.noise_from_peers else None
    for row, base in judged:
        fired = _relative_problem(row, base, cfg, lines)
        if fired is not None:
            row.rule, row.problem, noise = fired
            row.baseline = base if noise is None else {**base, "noise": noise}


# ---------------------------------------------------------------- comparing


@dataclass
class _Pair:
    row: TensorDiff
    cand: TensorFile | None = None
    ref: TensorFile | None = None
    logits: bool = False
    sums: ChunkSums = field(default_factory=ChunkSums)


def _prepare(index: int, cand: TensorEntry | None, ref: TensorEntry) -> _Pair:
    row = TensorDiff(name=ref.name, index=index, step=ref.step, layer=ref.layer, module=ref.module, role=ref.role,
                     dtype=ref.dtype, shape=ref.shape)
    pair = _Pair(row)
    if cand is None:
        row.problem = "missing from the candidate dump"
    elif cand.shape is not None and ref.shape is not None and cand.shape != ref.shape:
        row.problem = f"shape {list(cand.shape)} vs reference {list(ref.shape)}"
    elif cand.dtype and ref.dtype and cand.dtype != ref.dtype and coarser_dtype(cand.dtype, ref.dtype) is None:
        row.problem = f"dtype {cand.dtype} vs reference {ref.dtype}"
    else:
        if cand.dtype and ref.dtype and cand.dtype != ref.dtype:  # upcast, judged at the lower precision
            row.dtype, row.candidate_dtype = coarser_dtype(cand.dtype, ref.dtype), cand.dtype
        pair.cand, pair.ref = open_tensor(cand), open_tensor(ref)
        row.shape = tuple(pair.ref.shape)
        if pair.cand.shape != pair.ref.shape:
            row.problem = f"shape {list(pair.cand.shape)} (file) vs reference {list(pair.ref.shape)}"
            pair.cand = pair.ref = None
        else:
            pair.logits = ref.is_logits and len(pair.ref.shape) > 0 and pair.ref.shape[-1] > 0
            if row.dtype is None:
                row.dtype = "bfloat16" if pair.ref.bfloat16 else str(pair.ref.stored)
    return pair


def _segments(ref: TensorFile, logits: bool, cfg: LogitsConfig) -> list[tuple[int, int, int, int | None]]:
    """(start, stop, chunk, vocab) units of work; chunks of whole rows for logits."""
    size = ref.size
    vocab = ref.shape[-1] if logits else None
    chunk = max(1, cfg.chunk_elements // vocab) * vocab if vocab else cfg.chunk_elements
    step = chunk * SEGMENT_CHUNKS
    return [(start, min(size, start + step), chunk, vocab) for start in range(0, max(size, 1), step)]


def compare_dumps(candidate: str | Path, reference: str | Path, cfg: LogitsConfig) -> DumpComparison:
    """Compare every tensor of `candidate` with `reference`, in the reference's execution order."""
    started = time.perf_counter()
    cand_parts, ref_parts = open_dump(candidate), open_dump(reference)
    if set(cand_parts) != set(ref_parts) and len(cand_parts) == len(ref_parts) == 1:
        cand_parts = dict(zip(ref_parts, cand_parts.values(), strict=True))
    entries: list[tuple[TensorEntry | None, TensorEntry]] = []
    for part, ref_entries in ref_parts.items():
        cand_by_name = {e.name: e for e in cand_parts.get(part, [])}
        entries += [(cand_by_name.get(ref_entry.name), ref_entry) for ref_entry in ref_entries]
    pairs: list[_Pair] = []
    pending: list[tuple[_Pair, Future[ChunkSums]]] = []

    def settle(limit: int) -> None:
        while len(pending) > limit:
            pair, future = pending.pop(0)
            try:
                pair.sums.merge(future.result())
            except (PtFormatError, OSError) as exc:
                files = f"{pair.cand.path if pair.cand else ''} or {pair.ref.path if pair.ref else ''}"
                raise UsageError(f"{files}: cannot read tensor {pair.row.name!r} ({exc}); the dump is corrupt or "
                                 "truncated") from exc

    with ThreadPoolExecutor(max_workers=cfg.workers) as pool:
        for cand_entry, ref_entry in entries:  # each file indexed while the workers compare earlier ones
            pair = _prepare(len(pairs), cand_entry, ref_entry)
            pairs.append(pair)
            if pair.cand is None or pair.ref is None:
                continue
            tolerance = dtype_tolerance(pair.row.dtype)
            for start, stop, chunk, vocab in _segments(pair.ref, pair.logits, cfg):
                pending.append((pair, pool.submit(segment_sums, pair.cand, pair.ref, start, stop, chunk,
                                                  tolerance, vocab, cfg.top_k)))
                settle(2 * cfg.workers)
        settle(0)
    for pair in pairs:
        if pair.cand is not None:
            pair.row.metrics = pair.sums.metrics(pair.logits)
            pair.row.problem = _problem(pair.row.metrics, cfg)
            if pair.row.problem is not None:
                pair.row.rule = "absolute"
    rows = [pair.row for pair in pairs]
    routing, unchecked = apply_routing(entries, pairs, cfg)
    apply_relative_rules(rows, cfg)
    read = [(pair.cand, pair.ref, pair.sums) for pair in pairs if pair.cand is not None and pair.ref is not None]
    return DumpComparison(rows=rows, seconds=time.perf_counter() - started,
                          bytes_read=sum(cand.nbytes + ref.nbytes for cand, ref, _ in read),
                          largest_read=max((sums.largest_read for _, _, sums in read), default=0),
                          amplification=cfg.amplification, routing=routing, routing_unchecked=unchecked)


# ---------------------------------------------------------------- routing


@dataclass
class _RouterOp:
    """One call of an MoE router in both dumps: its rows (pair indices) by section and key."""

    path: str
    step: int
    rows: dict[tuple[str, str], int] = field(default_factory=dict)


def _router_ops(entries: list[tuple[TensorEntry | None, TensorEntry]]) -> tuple[list[_RouterOp], list[str]]:
    """The router calls of the reference's dump, in execution order, and the MoE blocks that have none."""
    ops: dict[tuple[int, str], _RouterOp] = {}
    blocks: dict[tuple[int, str], str] = {}
    for index, (_, ref) in enumerate(entries):
        match = _OP_NAME.match(ref.module or "")
        tensor = _TENSOR_NAME.search(ref.name)
        if match is None or tensor is None:
            continue
        path, cls = match.group("path"), match.group("cls")
        if path.rsplit(".", 1)[-1] == "gate":
            op = ops.setdefault((ref.step, ref.module or ""), _RouterOp(path, ref.step))
            op.rows[(tensor.group("section"), tensor.group("key"))] = index
        elif cls.endswith(_MOE_BLOCKS):
            blocks[(ref.step, path)] = cls
    routed = {(op.step, op.path.rsplit(".", 1)[0]) for op in ops.values()}
    missing = [f"{path} ({cls})" for (step, path), cls in blocks.items() if (step, path) not in routed]
    return list(ops.values()), missing


def _read(entry: TensorEntry | None) -> np.ndarray | None:
    return None if entry is None else np.asarray(open_tensor(entry).read_all())


def _router_side(op: _RouterOp, entries: list[tuple[TensorEntry | None, TensorEntry]], side: int) -> RouterSide | None:
    """One side's router arrays (None without its logits or its chosen ids on both sides)."""
    def entry(section: str, key: str) -> TensorEntry | None:
        index = op.rows.get((section, key))
        return None if index is None else entries[index][side]

    outputs = sorted(key for section, key in op.rows if section == "output")
    logits_entry = entry("output", outputs[0]) if outputs else None
    if logits_entry is None:
        return None
    logits = _read(logits_entry)
    if logits is None or logits.ndim < 2:
        return None
    experts = logits.shape[-1]
    logits = logits.reshape(-1, experts).astype(np.float64)
    ids = weights = None
    for key in outputs[1:]:
        found = entry("output", key)
        if found is None:
            continue
        array = _read(found)
        if array is None or array.ndim < 1:
            continue
        array = array.reshape(logits.shape[0], -1) if array.size % logits.shape[0] == 0 else array
        if (found.dtype or "").startswith(_INTEGER_DTYPES):
            ids = array
        else:
            weights = array.astype(np.float64)
    inputs = [entry("input", key) for section, key in sorted(op.rows) if section == "input"]
    hidden = _read(inputs[0]) if inputs and inputs[0] is not None else None
    bias = _read(entry("parameters", "e_score_correction_bias"))
    sigmoid = bias is not None or any(name in (logits_entry.module or "").lower() for name in ("deepseek", "glm4moe"))
    return RouterSide(logits=logits, logits_dtype=logits_entry.dtype or "float32", ids=ids, weights=weights,
                      input=hidden.reshape(logits.shape[0], -1).astype(np.float64)
                      if hidden is not None and hidden.size % logits.shape[0] == 0 else None,
                      input_dtype=inputs[0].dtype if inputs and inputs[0] is not None else None,
                      bias=bias.astype(np.float64).reshape(-1) if bias is not None else None, sigmoid=sigmoid)


def apply_routing(entries: list[tuple[TensorEntry | None, TensorEntry]], pairs: list[_Pair],
                  cfg: LogitsConfig) -> tuple[list[RoutingReport], list[str]]:
    """Compare each MoE layer's routing (`routing`): the router's ids and weights leave the float rules; a
    router whose flips rounding cannot explain diverges at the router; flips within the noise are taken
    out of every token-shaped tensor after them, which the rules then judge on the tokens that routed
    alike. Returns the reports and, in words, the MoE layers whose routing could not be checked."""
    ops, unchecked = _router_ops(entries)
    reports: list[RoutingReport] = []
    flipped: dict[int, set[int]] = {}
    masks_from: list[tuple[int, int, set[int], int]] = []
    for op in ops:
        cand, ref = _router_side(op, entries, 0), _router_side(op, entries, 1)
        if cand is None or ref is None or (cand.ids is None and ref.ids is None):
            unchecked.append(f"{op.path} (no router logits and chosen experts on both sides)")
            continue
        report = compare_routing(cand, ref, op.path)
        reports.append(report)
        first = min(index for (section, _), index in op.rows.items() if section == "output")
        for (section, key), index in op.rows.items():
            row = pairs[index].row
            if section == "output" and key != min(k for s, k in op.rows if s == "output"):
                row.role, row.problem, row.rule = ROUTING, None, None
                row.metrics = {"rerouted": len(report.flips) / max(1, report.tokens)} if (
                    row.dtype or "").startswith(_INTEGER_DTYPES) else row.metrics
        finding = report.finding
        if finding is not None:
            row = pairs[first].row
            row.problem, row.rule = finding, "routing"
        elif report.flips:
            _leave_out_expert_calls(pairs, op, first)
            tokens = flipped.setdefault(op.step, set())
            tokens.update(report.flipped_tokens)
            masks_from.append((max(op.rows.values()), op.step, set(tokens), report.tokens))
    for start, step, tokens, count in masks_from:
        for pair in pairs[start + 1:]:
            if pair.row.step == step and pair.cand is not None and pair.ref is not None:
                _judge_on_alike(pair, tokens, count, cfg)
    return reports, unchecked


def _leave_out_expert_calls(pairs: list[_Pair], op: _RouterOp, start: int) -> None:
    """The calls inside the experts (one per expert, over the tokens routed to it) of this layer and the
    later ones hold other tokens, or tokens carrying a flip, on the two sides once a token flipped: they
    are left to the routing comparison, which explains them."""
    for pair in pairs[start:]:
        match = _OP_NAME.match(pair.row.module or "")
        if pair.row.step == op.step and match is not None and ".experts." in match.group("path"):
            pair.row.role, pair.row.problem, pair.row.rule = ROUTING, None, None


def _judge_on_alike(pair: _Pair, flipped: set[int], tokens: int, cfg: LogitsConfig) -> None:
    """Re-measure a tensor of `tokens` rows without the tokens that flipped (a later router's mask, a
    superset, is applied after an earlier one's)."""
    assert pair.cand is not None and pair.ref is not None
    shape = list(pair.ref.shape)
    while len(shape) > 2 and shape[0] == 1:
        shape.pop(0)
    if pair.row.role == ROUTING or not shape or shape[0] != tokens or pair.row.dtype is None \
            or pair.row.dtype.startswith(_INTEGER_DTYPES):
        return
    keep = np.ones(shape[0], dtype=bool)
    keep[sorted(flipped)] = False
    cand = np.ascontiguousarray(pair.cand.read_all().reshape(shape[0], -1)[keep], dtype=np.float32).reshape(-1)
    ref = np.ascontiguousarray(pair.ref.read_all().reshape(shape[0], -1)[keep], dtype=np.float32).reshape(-1)
    sums = ChunkSums()
    vocab = pair.ref.shape[-1] if pair.logits else None
    sums.add_chunk(cand, ref, dtype_tolerance(pair.row.dtype), vocab, cfg.top_k,
                   Scratch(max(1, cand.size), max(pair.cand.stored.itemsize, pair.ref.stored.itemsize)))
    pair.row.metrics = {**sums.metrics(pair.logits), "tokens_left_out": float(len(flipped))}
    pair.row.problem = _problem(pair.row.metrics, cfg)
    pair.row.rule = "absolute" if pair.row.problem is not None else None


def judge_logits(obs: Observation, reference: Observation | None, cfg: LogitsConfig) -> Verdict:
    """Bad when a tensor of the candidate's dump diverges from the reference's; names the first one."""
    if reference is None or not reference.logits_dump:
        return Verdict(kind=VerdictKind.SKIP, reason="logits oracle needs a reference observation with a dump")
    if not obs.logits_dump:
        return Verdict(kind=VerdictKind.SKIP, reason="observation has no logits_dump to compare")
    return verdict_from_comparison(compare_dumps(obs.logits_dump, reference.logits_dump, cfg))


def verdict_from_comparison(result: DumpComparison) -> Verdict:
    """Names the first divergent tensor, the rule that fired, its metrics next to its input's, and what
    carried the drift after it."""
    first = result.first_divergent
    worst = result.worst_cosine
    figures: dict[str, Any] = {"tensors_compared": len(result.rows), "seconds": round(result.seconds, 3)}
    if worst is not None:
        figures["worst_cosine"] = _round(worst.metrics["cosine"])
        figures["worst_cosine_tensor"] = worst.name
    routing = routing_words(result)
    if result.routing or result.routing_unchecked:
        figures["routing"] = {"layers": [report.to_dict() for report in result.routing],
                              "unchecked": result.routing_unchecked}
    if first is None:
        return Verdict(kind=VerdictKind.GOOD, figures=figures,
                       reason=f"all {len(result.rows)} tensors within the pass lines{routing}")
    carriers, also = result.after_first()
    figures["first_divergent"] = first.to_dict()
    figures["carried_by"] = {"count": len(carriers), "tensors": [row.name for row in carriers[:10]]}
    figures["also_divergent"] = {"count": len(also), "tensors": [row.name for row in also[:10]]}
    where = f"layer {first.layer}, " if first.layer is not None else ""
    carried = f"; {len(carriers)} later outputs carry the drift" if carriers else ""
    return Verdict(kind=VerdictKind.BAD, figures=figures,
                   reason=f"first divergent tensor #{first.index} {first.name} ({where}step {first.step}): "
                          f"{first.problem} [{first.rule or 'mismatch'} rule]{carried}{routing}")


def routing_words(result: DumpComparison) -> str:
    """The routing's part of a verdict: flips taken as noise, layers not checked ("" without MoE routers)."""
    noise = [report for report in result.routing if report.flips and report.finding is None]
    words = ""
    if noise:
        flips = sum(len(report.flips) for report in noise)
        tokens = sum(report.tokens for report in noise)
        explainable = sum(report.explainable for report in noise)
        words += (f"; routing: {flips} of {tokens} token choices in {len(noise)} MoE layers went to another "
                  f"expert set, each at a margin within its rounding noise (rounding explains up to "
                  f"{explainable}); the MoE blocks judged on the tokens that routed alike")
    elif result.routing and all(report.finding is None for report in result.routing):
        words += f"; routing: every token routed alike in {len(result.routing)} MoE layers"
    if result.routing_unchecked:
        words += (f"; routing could not be checked at {len(result.routing_unchecked)} MoE layers "
                  f"({', '.join(result.routing_unchecked[:3])}): judged as dense")
    return words
