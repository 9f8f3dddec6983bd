"""Tensor-dump diff: compare two dumps tensor by tensor and name the first tensor, in execution order,
that diverges.

The jobs live apart: reading the two formats (`entries`), the streamed per-tensor metrics
(`metrics`), what a precision can hold (`precision`), the noise model (`noise`, `peers`) and the
rules, one class a file run in a declared order (`rules`). This module pairs the entries, has
the workers compute the metrics, runs the rules and turns the rows into a verdict.

A tensor diverges when it has a different shape (or a float against a non-float dtype), is
missing, holds NaN/Inf where the reference does not, or breaks a rule. A lower-precision float
candidate (bf16/fp16 against an fp32 golden) is upcast and judged at its own precision. The first
divergent tensor in execution order is where the drift enters; the outputs after it whose drift
its input did not have, without a rule of their own, are its carriers.

Why workers: each file is indexed (`formats.open_pt` / `open_npy`) while the workers compare the
tensors before it, and large tensors are split into segments so `workers` threads (numpy releases
the GIL) share one tensor too.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.entries import OUTPUT, TensorEntry, open_dump, open_tensor, write_dump
from bisect_npu.oracle.dumps.formats import PtFormatError, TensorFile
from bisect_npu.oracle.dumps.integers import integer_dtype, integer_metrics, is_integer
from bisect_npu.oracle.dumps.masks import is_mask, mask_metrics
from bisect_npu.oracle.dumps.metrics import ChunkSums, segment_sums, top_k_indices
from bisect_npu.oracle.dumps.precision import coarser_dtype, dtype_tolerance
from bisect_npu.oracle.dumps.rows import DumpComparison, TensorDiff, round_figure
from bisect_npu.oracle.dumps.rules import apply_dump_rules, apply_relative_rules, apply_tensor_rules

# What other rooms import from here, whichever module now holds it.
__all__ = ["OUTPUT", "ChunkSums", "DumpComparison", "TensorDiff", "TensorEntry", "compare_dumps", "dtype_tolerance",
           "judge_logits", "open_dump", "open_tensor", "segment_sums", "top_k_indices", "verdict_from_comparison",
           "write_dump"]
# Chunks per unit of work: a tensor larger than this is shared between the workers.
SEGMENT_CHUNKS = 8
# A MoE router's module: `mlp.gate` (vLLM, DeepSeek) or `mlp.gate.<Class>` (msprobe), not `gate_proj`.
_ROUTER = re.compile(r"(?:^|\.)(?:gate|router)(?:\.|$)")



@dataclass
class _Pair:
    row: TensorDiff
    cand: TensorFile | None = None
    ref: TensorFile | None = None
    logits: bool = False
    mask: bool = False
    sums: ChunkSums = field(default_factory=ChunkSums)


def _prepare(index: int, cand: TensorEntry | None, ref: TensorEntry) -> _Pair:
    row = TensorDiff(name=ref.name, index=index, step=ref.step, layer=ref.layer, module=ref.module, role=ref.role,
                     dtype=ref.dtype, shape=ref.shape, reference_dtype=ref.dtype)
    pair = _Pair(row)
    if is_mask(ref):  # which positions attend, whatever the encoding; absent on one side: left to its kernel
        if cand is not None:
            pair.cand, pair.ref, pair.mask = open_tensor(cand), open_tensor(ref), True
            row.integer, row.dtype, row.shape = True, "bool", (pair.ref.size,)
        return pair
    if cand is None:
        row.problem = "missing from the candidate dump"
    elif cand.shape is not None and ref.shape is not None and cand.shape != ref.shape:
        row.problem = f"shape {list(cand.shape)} vs reference {list(ref.shape)}"
    elif cand.dtype and ref.dtype and cand.dtype != ref.dtype and coarser_dtype(cand.dtype, ref.dtype) is None \
            and not (integer_dtype(cand.dtype) and integer_dtype(ref.dtype)):
        row.problem = f"dtype {cand.dtype} vs reference {ref.dtype}"
    else:
        if cand.dtype and ref.dtype and cand.dtype != ref.dtype and coarser_dtype(cand.dtype, ref.dtype):
            # a float upcast: judged at the lower precision
            row.dtype, row.candidate_dtype = coarser_dtype(cand.dtype, ref.dtype), cand.dtype
        pair.cand, pair.ref = open_tensor(cand), open_tensor(ref)
        row.shape = tuple(pair.ref.shape)
        if pair.cand.shape != pair.ref.shape:
            row.problem = f"shape {list(pair.cand.shape)} (file) vs reference {list(pair.ref.shape)}"
            pair.cand = pair.ref = None
        elif is_integer(pair.cand) != is_integer(pair.ref):
            row.problem = f"dtype {pair.cand.stored} vs reference {pair.ref.stored} (an integer against a float)"
            pair.cand = pair.ref = None
        elif is_integer(pair.ref):
            row.integer, row.dtype = True, str(pair.ref.stored)
        else:
            pair.logits = ref.is_logits and len(pair.ref.shape) > 0 and pair.ref.shape[-1] > 0
            if row.dtype is None:
                row.dtype = "bfloat16" if pair.ref.bfloat16 else str(pair.ref.stored)
    return pair


def refuse_other_models(entries: list[tuple[TensorEntry | None, TensorEntry]]) -> None:
    """Refuse, in one line, dumps of two model configs: a router whose expert count or top-k differs, or most
    tensors of other shapes. One tensor of another shape is a finding (a bug that reshapes); these are not."""
    both = [(cand, ref) for cand, ref in entries if cand is not None and cand.shape is not None
            and ref.shape is not None]
    other = [(cand, ref) for cand, ref in both if cand.shape != ref.shape]
    router = next(((cand, ref) for cand, ref in other if _ROUTER.search(ref.module or ref.name)), None)
    if router is not None:
        cand, ref = router
        raise UsageError(f"dumps of two model configs: {ref.name} is {list(cand.shape or ())} in the candidate and "
                         f"{list(ref.shape or ())} in the reference (another expert count or top-k); compare dumps "
                         "of one model config")
    if both and 2 * len(other) > len(both):
        cand, ref = other[0]
        raise UsageError(f"dumps of different shapes: {len(other)} of {len(both)} tensors differ (first {ref.name}: "
                         f"{list(cand.shape or ())} vs reference {list(ref.shape or ())}); compare dumps of one model "
                         "and one prompt")


def _read_integers(name: str, cand: TensorFile, ref: TensorFile, mask: bool = False) -> dict[str, float]:
    try:
        return mask_metrics(cand, ref) if mask else integer_metrics(cand, ref)
    except (PtFormatError, OSError, ValueError) as exc:
        raise UsageError(f"{cand.path} or {ref.path}: cannot read tensor {name!r} ({exc}); the dump is corrupt or "
                         "truncated") from exc


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
    refuse_other_models(entries)
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
            if pair.row.integer:
                pair.row.metrics = _read_integers(pair.row.name, pair.cand, pair.ref, pair.mask)
                continue
            tolerance = dtype_tolerance(pair.row.dtype)
            for start, stop, chunk, vocab in _segments(pair.ref, pair.logits, cfg):
                pending.append((pair, pool.submit(segment_sums, pair.cand, pair.ref, start, stop, chunk,
                                                  tolerance, vocab, cfg.top_k)))
                settle(2 * cfg.workers)
        settle(0)
    for pair in pairs:
        if pair.cand is not None and not pair.row.integer:
            pair.row.metrics = pair.sums.metrics(pair.logits)
    rows = [pair.row for pair in pairs]
    apply_tensor_rules(rows, cfg)
    routing, unchecked = apply_dump_rules(entries, list(pairs), cfg)
    apply_relative_rules(rows, cfg)
    read = [(pair.cand, pair.ref, pair.sums) for pair in pairs if pair.cand is not None and pair.ref is not None]
    return DumpComparison(rows=rows, seconds=time.perf_counter() - started,
                          bytes_read=sum(cand.nbytes + ref.nbytes for cand, ref, _ in read),
                          largest_read=max((sums.largest_read for _, _, sums in read), default=0),
                          amplification=cfg.amplification, routing=routing, routing_unchecked=unchecked)


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
    figures: dict[str, Any] = {"tensors_compared": len(result.rows), "seconds": round(result.seconds, 3),
                               "layers": result.layer_profile()}
    if worst is not None:
        figures["worst_cosine"] = round_figure(worst.metrics["cosine"])
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
    provenance = f"; {first.provenance}" if first.provenance else ""
    carried = f"; {len(carriers)} later outputs carry the drift" if carriers else ""
    return Verdict(kind=VerdictKind.BAD, figures=figures,
                   reason=f"first divergent tensor #{first.index} {first.name} ({where}step {first.step}): "
                          f"{first.problem} [{first.rule or 'mismatch'} rule{provenance}]{carried}{routing}")


def routing_words(result: DumpComparison) -> str:
    """The routing's part of a verdict: the MoE layers whose flips are noise, named apart from a router the
    verdict names for its finding; the layers not checked ("" without MoE routers)."""
    noise = [report for report in result.routing if report.flips and report.finding is None]
    found = any(report.finding is not None for report in result.routing)
    words = ""
    if noise:
        flips = sum(len(report.flips) for report in noise)
        tokens = sum(report.tokens for report in noise)
        close = sum(report.explainable for report in noise)
        where = ", ".join(report.module for report in noise[:3]) + (
            f" and {len(noise) - 3} more" if len(noise) > 3 else "")
        blocks = "that MoE block" if len(noise) == 1 else "those MoE blocks"
        words += (f"; {'apart from that router, ' if found else ''}routing noise at {where}: {flips} of {tokens} "
                  f"token choices went to another expert set, each closer to a tie than rounding can move it "
                  f"({close} of the {tokens} lie that close); {blocks} judged on the tokens that routed alike")
    elif result.routing and not found:
        words += f"; routing: every token routed alike in {len(result.routing)} MoE layers"
    if result.routing_unchecked:
        words += (f"; routing could not be checked at {len(result.routing_unchecked)} MoE layers "
                  f"({', '.join(result.routing_unchecked[:3])}): judged as dense")
    return words
