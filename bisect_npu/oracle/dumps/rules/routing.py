"""The routing rule: MoE routers compared by the expert sets they chose (`oracle/dumps/routing.py`).

A router is a module named `...gate` in a MindStudio Probe layout dump (ours or msprobe's), its
output 0 the logits, an integer output the chosen ids, a float one the routing weights, its
`input_args` the hidden states it routed and its `parameters` a score-correction bias. Its ids and
weights leave the float rules (role `routing`); a router whose flips rounding cannot explain is the
first divergent tensor at its logits; flips within the noise are left out of the token-shaped
tensors after the router, which the rules then judge on the tokens that routed alike, against
inputs measured on the same tokens, except where attention mixes tokens (it spreads the flipped
tokens' drift to the others, so its input is measured whole);
the calls inside the experts (one per expert, over other tokens once one flipped) are left to
this rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np

from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.entries import EXPERT_CALL, INPUT, ROUTING, TensorEntry, open_tensor
from bisect_npu.oracle.dumps.formats import TensorFile
from bisect_npu.oracle.dumps.metrics import ChunkSums, Scratch
from bisect_npu.oracle.dumps.precision import dtype_tolerance
from bisect_npu.oracle.dumps.routing import RouterSide, RoutingReport, compare_routing
from bisect_npu.oracle.dumps.rows import TensorDiff

OP_NAME = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[A-Za-z_]\w*)\.forward\.(?P<call>\d+)$")
_TENSOR_NAME = re.compile(r"\.(?P<section>input|output|parameters)\.(?P<key>\w+)$")
_INTEGER_DTYPES = ("int", "uint", "bool")
# Class names of an MoE block (HF's Qwen3MoeSparseMoeBlock, DeepseekV3MoE; vLLM's alike).
_MOE_BLOCKS = ("MoeBlock", "MoE")


class MeasuredPair(Protocol):
    """A compared tensor pair as `compare_dumps` holds it: its row and, when both were read, their files."""

    row: TensorDiff
    cand: TensorFile | None
    ref: TensorFile | None
    logits: bool


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
        match = OP_NAME.match(ref.module or "")
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


class Routing:
    """The routing rule: runs over the whole dump pair (it reads the routers' tensors), after the tensor
    rules and before the module rules, which then judge the MoE blocks on the tokens that routed alike."""

    name: ClassVar[str] = "routing"
    measures: ClassVar[str] = ("the tokens each MoE router sends to another expert set, each flip's margin against "
                               "the noise the pair's precisions and the router's input explain")
    provenance: ClassVar[str] = ("noise bound: half an ulp of each side's router precision and 4 sigma of the "
                                 "input's effect; flips allowed past it: bench/moe_family_bench.py, tune split "
                                 "(seeds 0-2)")


def apply_routing(entries: list[tuple[TensorEntry | None, TensorEntry]], pairs: Sequence[MeasuredPair],
                  cfg: LogitsConfig, rejudge: Callable[[TensorDiff], None]) -> tuple[list[RoutingReport], list[str]]:
    """Compare each MoE layer's routing (`routing`): the router's ids and weights leave the float rules; a
    router whose flips rounding cannot explain diverges at the router; flips within the noise are taken
    out of the token-shaped tensors after the router, which the rules then judge on the tokens that
    routed alike. Returns the reports and, in words, the MoE layers whose routing could not be checked."""
    ops, unchecked = _router_ops(entries)
    reports: list[RoutingReport] = []
    flipped: dict[int, set[int]] = {}
    masks: list[tuple[int, list[int], int, set[int], int]] = []
    centred: set[int] = set()
    for op in ops:
        cand, ref = _router_side(op, entries, 0), _router_side(op, entries, 1)
        if cand is None or ref is None or (cand.ids is None and ref.ids is None):
            unchecked.append(f"{op.path} (no router logits and chosen experts on both sides)")
            continue
        report = compare_routing(cand, ref, op.path, frozenset(flipped.get(op.step, set())))
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
            row.problem, row.rule, row.provenance = finding, Routing.name, Routing.provenance
        else:
            _leave_out_expert_calls(pairs, op, first)
            if not ref.sigmoid and "cosine" in pairs[first].row.metrics and pairs[first].row.dtype is not None:
                _softmax_logits(pairs[first].row, cand, ref, flipped.get(op.step, set()))
                centred.add(first)
                rejudge(pairs[first].row)
        if finding is None and report.flips:
            flipped.setdefault(op.step, set()).update(report.flipped_tokens)
            inputs = [index for (section, _), index in op.rows.items() if section == "input"]
            masks.append((first, inputs, op.step, set(flipped[op.step]), report.tokens))
        _weights_by_expert(pairs, op, first, (cand, ref), flipped.get(op.step, set()))
        _hand_on(pairs, op, first, ref)
    for start, inputs, step, tokens, count in masks:  # a later router's mask holds an earlier one's: after it
        for index in inputs + list(range(start + 1, len(pairs))):
            pair = pairs[index]
            if pair.row.step == step and pair.cand is not None and pair.ref is not None and index not in centred \
                    and pair.row.role not in (ROUTING, EXPERT_CALL) and pair.row.rule != Routing.name:
                _judge_on_alike(pair, tokens, count, cfg, rejudge)
    return reports, unchecked


def _hand_on(pairs: Sequence[MeasuredPair], op: _RouterOp, first: int, ref: RouterSide) -> None:
    """The router's ids and weights where another module of its MoE block takes them as inputs (msprobe dumps
    every module's inputs: HF's experts are called with the hidden state, the ids and the weights) are the
    routing again, left to this rule: the ids compared by equality would call every noise flip a divergence.
    The weights handed on are the router's, measured as the router's are (per expert id); they stay part of
    the experts' baseline (`rules.apply_relative_rules`)."""
    block = op.path.rsplit(".", 1)[0] + "."
    routed_shape = tuple(ref.ids.shape) if ref.ids is not None else None
    weights = next((pairs[index].row for (section, _), index in op.rows.items()
                    if section == "output" and index != first and "cosine" in pairs[index].row.metrics), None)
    for pair in pairs[first:]:
        row = pair.row
        match = OP_NAME.match(row.module or "")
        if row.step != op.step or row.role != INPUT or match is None or not match.group("path").startswith(block) \
                or match.group("path") == op.path:
            continue
        shape = tuple(dim for dim in (row.shape or ()) if dim != 1) if row.shape is not None else None
        if row.integer or (routed_shape is not None and shape == tuple(d for d in routed_shape if d != 1)):
            row.role, row.problem, row.rule = ROUTING, None, None
            if not row.integer and weights is not None and "cosine" in row.metrics:
                row.metrics, row.carried_metrics = dict(weights.metrics), weights.carried_metrics


def _sums(cand: np.ndarray, ref: np.ndarray, dtype: str) -> dict[str, float]:
    """The float metrics of two arrays, as the streamed comparison measures them."""
    cand32 = np.ascontiguousarray(cand, dtype=np.float32).reshape(-1)
    ref32 = np.ascontiguousarray(ref, dtype=np.float32).reshape(-1)
    sums = ChunkSums()
    sums.add_chunk(cand32, ref32, dtype_tolerance(dtype), None, 1, Scratch(max(1, cand32.size), 4))
    return sums.metrics(False)


def _softmax_logits(row: TensorDiff, cand: RouterSide, ref: RouterSide, flipped: set[int]) -> None:
    """Measure a softmax router's logits as softmax reads them: each token's logits less their mean, on the
    tokens that routed alike so far, whole beside (`carried_metrics`). Why: a part every expert shares
    (large in a trained router) changes neither the choice nor the weights, yet it leads the logits' norm
    and cosine, and its rounding moves them by more than the router's input explains."""
    assert row.dtype is not None
    cand_centred = cand.logits - cand.logits.mean(axis=1, keepdims=True)
    ref_centred = ref.logits - ref.logits.mean(axis=1, keepdims=True)
    keep = np.ones(int(ref.logits.shape[0]), dtype=np.bool_)
    keep[sorted(flipped)] = False
    row.carried_metrics = _sums(cand_centred, ref_centred, row.dtype)
    # The logits are stored, and rounded, at their whole magnitude: one rounding of them leaves a distance in
    # the centred part larger by the ratio of the two's squared norms.
    scale = float(np.sum(ref.logits**2) / max(np.sum(ref_centred**2), np.finfo(np.float64).tiny))
    row.metrics = {**_sums(cand_centred[keep], ref_centred[keep], row.dtype), "tokens_left_out": float(len(flipped)),
                   "rounding_scale": max(1.0, scale)}
    row.problem = row.rule = row.provenance = None


def _weights_by_expert(pairs: Sequence[MeasuredPair], op: _RouterOp, first: int, sides: tuple[RouterSide, RouterSide],
                       flipped: set[int]) -> None:
    """Measure the routing weights per expert id (`[tokens, experts]`, zero where an expert was not chosen), on
    the tokens that routed alike and whole (`carried_metrics`). Why: they are part of the experts' baseline, and
    slot by slot two experts of near-equal weight that trade places under rounding read as the whole weight
    moving; per expert id the same set with the same weights is the same routing."""
    cand, ref = sides
    if cand.ids is None or ref.ids is None or cand.weights is None or ref.weights is None \
            or cand.weights.shape != cand.ids.shape or ref.weights.shape != ref.ids.shape:
        return
    row = next((pairs[index].row for (section, _), index in op.rows.items()
                if section == "output" and index != first and "cosine" in pairs[index].row.metrics), None)
    if row is None or row.dtype is None:
        return
    dense: list[np.ndarray] = []
    for ids, weights in ((cand.ids, cand.weights), (ref.ids, ref.weights)):
        out = np.zeros(ref.logits.shape, dtype=np.float64)
        np.put_along_axis(out, ids.astype(np.int64), weights, axis=1)
        dense.append(out)
    keep = np.ones(int(ref.logits.shape[0]), dtype=np.bool_)
    keep[sorted(flipped)] = False
    row.carried_metrics = _sums(dense[0], dense[1], row.dtype)
    row.metrics = {**_sums(dense[0][keep], dense[1][keep], row.dtype), "tokens_left_out": float(len(flipped))}


def _leave_out_expert_calls(pairs: Sequence[MeasuredPair], op: _RouterOp, start: int) -> None:
    """The calls inside the experts (one per expert, over the tokens routed to it, in the order routing
    hits them) follow the routing: once a token flips here or before, they hold other tokens on the two
    sides. They are left to the routing comparison; the experts' output is compared whole."""
    for pair in pairs[start:]:
        match = OP_NAME.match(pair.row.module or "")
        if pair.row.step == op.step and match is not None and ".experts." in match.group("path"):
            pair.row.role, pair.row.problem, pair.row.rule = EXPERT_CALL, None, None


def _judge_on_alike(pair: MeasuredPair, flipped: set[int], tokens: int, cfg: LogitsConfig,
                    rejudge: Callable[[TensorDiff], None]) -> None:
    """Re-measure a tensor of `tokens` rows without the tokens that flipped; the whole tensor's metrics are
    kept beside (`carried_metrics`): the baseline of an output that mixes tokens (attention, which spreads
    a flipped token's drift to the others) and of one measured whole."""
    assert pair.cand is not None and pair.ref is not None
    shape = list(pair.ref.shape)
    while len(shape) > 2 and shape[0] == 1:
        shape.pop(0)
    if not shape or shape[0] != tokens or pair.row.dtype is None or "cosine" not in pair.row.metrics \
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
    pair.row.carried_metrics = pair.row.carried_metrics or pair.row.metrics
    pair.row.metrics = {**sums.metrics(pair.logits), "tokens_left_out": float(len(flipped))}
    pair.row.problem = pair.row.rule = pair.row.provenance = None
    rejudge(pair.row)
