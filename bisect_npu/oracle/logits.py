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
  torch (`oracle/ptfile.py`).

Metrics follow msprobe's compare: cosine similarity, max absolute error, max relative error
(|a - b| / (|b| + eps), b the reference), shares of elements with relative error below 1/1000 and
5/1000. A tensor diverges when it breaks a pass line from LogitsConfig, has a different shape or
dtype, is missing, or holds NaN/Inf where the reference does not.

Why streamed: real dumps hold hundreds of tensors; we load one pair at a time (memory-mapped for
.npy), reduce it in fixed-size chunks, and keep `workers` pairs in flight (numpy releases the GIL),
so memory stays near the largest tensor and both cores work.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bisect_npu.contracts import Observation, Verdict, VerdictKind
from bisect_npu.errors import UsageError
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.ptfile import PtFormatError, load_pt

OWN_FORMAT = "bisect-npu-dump"
CHUNK = 1 << 20
_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)(?:\.|$)")
_STEP_DIR = re.compile(r"^step(\d+)$")
# A run that is not distributed writes `rank` (vllm-ascend's msprobe guide) or `proc{PID}` (what
# mindstudio-probe 26.2 wrote here) where a distributed one writes `rank{ID}`: all name rank 0.
_SINGLE_PROCESS_DIR = re.compile(r"(?<![^/])(?:proc\d+|rank)(?![^/])")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a dump: where it lives and what its manifest says it is."""

    name: str
    file: Path
    shape: tuple[int, ...] | None
    dtype: str | None
    step: int = 0
    kind: str = "hidden"

    @property
    def layer(self) -> int | None:
        match = _LAYER.search(self.name)
        return int(match.group(1)) if match else None

    @property
    def is_logits(self) -> bool:
        return self.kind == "logits" or "logits" in self.name or "lm_head" in self.name


@dataclass
class TensorDiff:
    """Comparison of one tensor pair; `problem` is set when it diverges."""

    name: str
    index: int
    step: int
    layer: int | None
    metrics: dict[str, float] = field(default_factory=dict)
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "index": self.index, "step": self.step, "layer": self.layer,
                "problem": self.problem, **{k: _round(v) for k, v in self.metrics.items()}}


@dataclass
class DumpComparison:
    rows: list[TensorDiff]
    seconds: float
    bytes_read: int

    @property
    def first_divergent(self) -> TensorDiff | None:
        return next((row for row in self.rows if row.problem is not None), None)

    @property
    def worst_cosine(self) -> TensorDiff | None:
        scored = [row for row in self.rows if "cosine" in row.metrics]
        return min(scored, key=lambda row: row.metrics["cosine"], default=None)


def _round(value: float) -> float:
    return value if not math.isfinite(value) else float(f"{value:.6g}")


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
        entries.append(TensorEntry(name=str(item["name"]), file=manifest_path.parent / str(item["file"]),
                                   shape=tuple(shape) if shape is not None else None,
                                   dtype=item.get("dtype"), step=int(item.get("step", 0)),
                                   kind=str(item.get("kind", "hidden"))))
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
                                           kind="logits" if "lm_head" in op_name else "hidden"))
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


def load_tensor(entry: TensorEntry) -> np.ndarray:
    """One tensor as a numpy array: .npy memory-mapped, .pt read without torch (bfloat16 -> float32)."""
    try:
        if entry.file.suffix == ".npy":
            return np.load(entry.file, mmap_mode="r", allow_pickle=False)
        return load_pt(entry.file)
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


def _chunked_metrics(cand: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Cosine, errors and relative-error shares over the elements finite in both, chunk by chunk.

    float32 with BLAS dot products per chunk, summed in Python floats: float64 copies cost more time
    than the comparison itself, and cosine to 1e-6 is far finer than any pass line.
    """
    flat_c, flat_r = cand.reshape(-1), ref.reshape(-1)
    eps = np.float32(np.finfo(np.float32).eps)
    dot = norm_c = norm_r = 0.0
    max_abs = max_rel = 0.0
    within_1e3 = within_5e3 = 0
    nonfinite_c = nonfinite_r = 0
    for start in range(0, flat_c.size, CHUNK):
        c = np.asarray(flat_c[start:start + CHUNK], dtype=np.float32)
        r = np.asarray(flat_r[start:start + CHUNK], dtype=np.float32)
        sums = (float(c @ r), float(c @ c), float(r @ r))
        if not all(math.isfinite(x) for x in sums):  # NaN/Inf somewhere (or float32 overflow): mask, widen
            fin_c, fin_r = np.isfinite(c), np.isfinite(r)
            nonfinite_c += int(c.size - np.count_nonzero(fin_c))
            nonfinite_r += int(r.size - np.count_nonzero(fin_r))
            both = fin_c & fin_r
            c, r = c[both].astype(np.float64), r[both].astype(np.float64)
            sums = (float(c @ r), float(c @ c), float(r @ r))
        dot, norm_c, norm_r = dot + sums[0], norm_c + sums[1], norm_r + sums[2]
        if c.size:
            diff = np.subtract(c, r)
            np.abs(diff, out=diff)
            max_abs = max(max_abs, float(diff.max()))
            denom = np.abs(r)
            denom += eps
            np.divide(diff, denom, out=diff)
            max_rel = max(max_rel, float(diff.max()))
            within_1e3 += int(np.count_nonzero(diff < 1e-3))
            within_5e3 += int(np.count_nonzero(diff < 5e-3))
    size = max(1, flat_c.size)
    if norm_c == 0.0 and norm_r == 0.0:
        cosine = 1.0
    elif norm_c == 0.0 or norm_r == 0.0:
        cosine = 0.0
    else:
        cosine = min(1.0, dot / math.sqrt(norm_c * norm_r))
    return {"cosine": cosine, "max_abs_error": max_abs, "max_rel_error": max_rel,
            "within_1e3": within_1e3 / size, "within_5e3": within_5e3 / size,
            "nonfinite_candidate": float(nonfinite_c), "nonfinite_reference": float(nonfinite_r)}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _logits_metrics(cand: np.ndarray, ref: np.ndarray, top_k: int) -> dict[str, float]:
    """Mean KL(reference || candidate) over rows (last axis = vocabulary) and top-k overlap."""
    vocab = ref.shape[-1] if ref.ndim else 1
    rows_c = np.asarray(cand, dtype=np.float64).reshape(-1, vocab)
    rows_r = np.asarray(ref, dtype=np.float64).reshape(-1, vocab)
    if not (np.isfinite(rows_c).all() and np.isfinite(rows_r).all()):
        return {}
    k = min(top_k, vocab)
    kl_sum, overlap_sum = 0.0, 0.0
    step = max(1, CHUNK // vocab)
    for s in range(0, len(rows_r), step):
        lp_r, lp_c = _log_softmax(rows_r[s:s + step]), _log_softmax(rows_c[s:s + step])
        kl_sum += float((np.exp(lp_r) * (lp_r - lp_c)).sum())
        top_r = np.argpartition(-rows_r[s:s + step], k - 1, axis=-1)[:, :k]
        top_c = np.argpartition(-rows_c[s:s + step], k - 1, axis=-1)[:, :k]
        overlap_sum += sum(len(np.intersect1d(a, b)) for a, b in zip(top_r, top_c, strict=True)) / k
    n_rows = max(1, len(rows_r))
    return {"kl": kl_sum / n_rows, "top_k_overlap": overlap_sum / n_rows}


def _problem(metrics: dict[str, float], cfg: LogitsConfig) -> str | None:
    """The first pass line a tensor breaks, in words, or None."""
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


def compare_pair(index: int, cand: TensorEntry, ref: TensorEntry, cfg: LogitsConfig) -> tuple[TensorDiff, int]:
    """Compare one tensor pair; returns the diff and the bytes read."""
    row = TensorDiff(name=ref.name, index=index, step=ref.step, layer=ref.layer)
    if cand.shape is not None and ref.shape is not None and cand.shape != ref.shape:
        row.problem = f"shape {list(cand.shape)} vs reference {list(ref.shape)}"
        return row, 0
    if cand.dtype and ref.dtype and cand.dtype != ref.dtype:
        row.problem = f"dtype {cand.dtype} vs reference {ref.dtype}"
        return row, 0
    a, b = load_tensor(cand), load_tensor(ref)
    if a.shape != b.shape:
        row.problem = f"shape {list(a.shape)} (file) vs reference {list(b.shape)}"
        return row, 0
    row.metrics = _chunked_metrics(a, b)
    if ref.is_logits and b.ndim:
        row.metrics.update(_logits_metrics(a, b, cfg.top_k))
    row.problem = _problem(row.metrics, cfg)
    return row, int(a.nbytes + b.nbytes)


def compare_dumps(candidate: str | Path, reference: str | Path, cfg: LogitsConfig) -> DumpComparison:
    """Compare every tensor of `candidate` with `reference`, in the reference's execution order."""
    started = time.perf_counter()
    cand_parts, ref_parts = open_dump(candidate), open_dump(reference)
    if set(cand_parts) != set(ref_parts) and len(cand_parts) == len(ref_parts) == 1:
        cand_parts = dict(zip(ref_parts, cand_parts.values(), strict=True))
    rows: list[TensorDiff] = []
    pending: list[tuple[int, Future[tuple[TensorDiff, int]]]] = []
    bytes_read = 0
    index = 0
    with ThreadPoolExecutor(max_workers=cfg.workers) as pool:
        for part, ref_entries in ref_parts.items():
            cand_by_name = {e.name: e for e in cand_parts.get(part, [])}
            for ref_entry in ref_entries:
                cand_entry = cand_by_name.get(ref_entry.name)
                if cand_entry is None:
                    rows.append(TensorDiff(name=ref_entry.name, index=index, step=ref_entry.step,
                                           layer=ref_entry.layer, problem="missing from the candidate dump"))
                else:
                    pending.append((len(rows), pool.submit(compare_pair, index, cand_entry, ref_entry, cfg)))
                    rows.append(TensorDiff(name=ref_entry.name, index=index, step=ref_entry.step,
                                           layer=ref_entry.layer))
                index += 1
                while len(pending) > cfg.workers:
                    slot, future = pending.pop(0)
                    rows[slot], nbytes = future.result()
                    bytes_read += nbytes
        for slot, future in pending:
            rows[slot], nbytes = future.result()
            bytes_read += nbytes
    return DumpComparison(rows=rows, seconds=time.perf_counter() - started, bytes_read=bytes_read)


def judge_logits(obs: Observation, reference: Observation | None, cfg: LogitsConfig) -> Verdict:
    """Bad when a tensor of the candidate's dump diverges from the reference's; names the first one."""
    if reference is None or not reference.logits_dump:
        return Verdict(kind=VerdictKind.SKIP, reason="logits oracle needs a reference observation with a dump")
    if not obs.logits_dump:
        return Verdict(kind=VerdictKind.SKIP, reason="observation has no logits_dump to compare")
    return verdict_from_comparison(compare_dumps(obs.logits_dump, reference.logits_dump, cfg))


def verdict_from_comparison(result: DumpComparison) -> Verdict:
    first = result.first_divergent
    worst = result.worst_cosine
    figures: dict[str, Any] = {"tensors_compared": len(result.rows), "seconds": round(result.seconds, 3)}
    if worst is not None:
        figures["worst_cosine"] = _round(worst.metrics["cosine"])
        figures["worst_cosine_tensor"] = worst.name
    if first is None:
        return Verdict(kind=VerdictKind.GOOD, figures=figures,
                       reason=f"all {len(result.rows)} tensors within the pass lines")
    figures["first_divergent"] = first.to_dict()
    where = f"layer {first.layer}, " if first.layer is not None else ""
    return Verdict(kind=VerdictKind.BAD, figures=figures,
                   reason=f"first divergent tensor #{first.index} {first.name} ({where}step {first.step}): "
                          f"{first.problem}")
