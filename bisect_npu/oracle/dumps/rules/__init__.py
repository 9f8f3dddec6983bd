"""The dump rules, one class a file, run in the order declared here; the first that fires names the tensor.

A new rule is one file with a `TensorRule` or `ModuleRule` subclass and one entry below.
Tensor rules judge every compared pair on its own metrics. Module rules judge each output not
already divergent against its baseline (its inputs shaped like it, or the output before it) and,
with `noise_from_peers`, the noise lines its kind's other layers draw; an output whose max
absolute error is at most `cosine_abs_floor` is not judged by them (a near-zero tensor says little).
"""

from __future__ import annotations

import math
from typing import Any

from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.entries import EXPERT_CALL, INPUT, ROUTING, TensorEntry
from bisect_npu.oracle.dumps.noise import PeerLines, baseline, mixes_tokens, transformed_inputs
from bisect_npu.oracle.dumps.routing import RoutingReport
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.absolute import Absolute
from bisect_npu.oracle.dumps.rules.base import Context, Finding, ModuleRule, TensorRule
from bisect_npu.oracle.dumps.rules.fixed_amplification import FixedAmplification, fixed_line
from bisect_npu.oracle.dumps.rules.integer_equality import IntegerEquality
from bisect_npu.oracle.dumps.rules.msprobe_amplification import MsprobeAmplification
from bisect_npu.oracle.dumps.rules.peer_cosine import PeerCosine
from bisect_npu.oracle.dumps.rules.peer_norm import PeerNorm
from bisect_npu.oracle.dumps.rules.routing import OP_NAME, MeasuredPair, Routing, apply_routing

TENSOR_RULES: tuple[TensorRule, ...] = (IntegerEquality(), Absolute())
# Runs over the whole dump pair between the tensor rules and the module rules (`rules/routing.py`).
DUMP_RULES = (Routing,)
MODULE_RULES: tuple[ModuleRule, ...] = (MsprobeAmplification(), PeerCosine(), PeerNorm(), FixedAmplification())


def _sum_of(parts: list[TensorDiff], total: dict[str, float]) -> float:
    """The cosine a sum of `parts` can show from their own errors alone, `total` its metrics: a layer's
    output is its input stream plus what its parts add, so its error is at most the sum of theirs (the
    triangle inequality), each part's error sqrt(2 x its distance x its energy). Why not the worst part's
    distance: an MoE output's, which varies from layer to layer with the tokens that flipped, is a small
    share of the stream it is added to; measured against it alone, the layer's ratio swings with it."""
    error = 0.0
    for part in parts:
        metrics = part.metrics if "tokens_left_out" in total else (part.carried_metrics or part.metrics)
        error += math.sqrt(2.0 * max(0.0, 1.0 - float(metrics["cosine"])) * float(metrics.get("reference_energy", 0.0)))
    energy = float(total.get("reference_energy", 0.0))
    if energy <= 0.0:
        return min(float(part.metrics["cosine"]) for part in parts)
    return max(-1.0, 1.0 - error**2 / (2.0 * energy))


def _factors_cosine(rows: list[TensorDiff], routed_alike: bool) -> float | None:
    """The cosine an output combining a hidden state by routing weights (the experts, an MoE block) can show from
    its two factors' errors together: their relative errors add (the triangle inequality), each the square root
    of its distance; None when `rows` hold no routing weights beside a hidden state. Why not the worse factor's
    distance: the weights' distance on the tokens that routed alike swings tenfold from layer to layer; where it
    lies far above the hidden state's the output follows it (a ratio near 1), and where it falls to the hidden
    state's the output carries both, so the worse one alone makes that layer's ratio triple against its peers'."""
    def worst(group: list[TensorDiff]) -> float:
        return max(max(0.0, 1.0 - float((row.metrics if routed_alike else (row.carried_metrics or row.metrics))
                                        ["cosine"])) for row in group)

    weights = [row for row in rows if row.role == ROUTING and not row.integer and "cosine" in row.metrics]
    hidden = [row for row in rows if row.role != ROUTING and "cosine" in row.metrics]
    if not weights or not hidden:
        return None
    return max(-1.0, 1.0 - (math.sqrt(worst(hidden)) + math.sqrt(worst(weights))) ** 2)


def _routing_of(row: TensorDiff, routing: list[TensorDiff]) -> list[TensorDiff]:
    """The routing weights a module combines, where its own inputs are in the dump (MindStudio Probe's): those
    handed to it (HF's experts take them as an input) or made by its router (an MoE block's gate). Why: the
    experts' output moves with the weights as much as with the hidden state, and its hidden state alone, a
    few roundings off, is not all it took in."""
    match = OP_NAME.match(row.module or "")
    if match is None:
        return []
    path = match.group("path")
    found = []
    for item in routing:
        source = OP_NAME.match(item.module or "")
        if item.step == row.step and source is not None and (
                (item.module == row.module and ".input." in item.name)
                or source.group("path").rsplit(".", 1)[0] == path):
            found.append(item)
    return found


def _record(row: TensorDiff, finding: Finding) -> None:
    row.rule, row.problem, row.provenance = finding.rule, finding.problem, finding.provenance


def apply_tensor_rules(rows: list[TensorDiff], cfg: LogitsConfig) -> None:
    """Judge every measured row on its own metrics (rows already divergent, a shape or a file, are left)."""
    ctx = Context(cfg)
    for row in rows:
        if not row.metrics or row.problem is not None:
            continue
        finding = next((found for rule in TENSOR_RULES if (found := rule.judge(row, ctx)) is not None), None)
        if finding is not None:
            _record(row, finding)


def apply_dump_rules(entries: list[tuple[TensorEntry | None, TensorEntry]], pairs: list[MeasuredPair],
                     cfg: LogitsConfig) -> tuple[list[RoutingReport], list[str]]:
    """The routing rule over the dump pair; a tensor it re-measures is judged again by the tensor rules."""
    return apply_routing(entries, pairs, cfg, lambda row: apply_tensor_rules([row], cfg))


class _InnerDistances:
    """The outputs recorded so far, by module path: an enclosing module (a decoder layer) runs its parts
    (attention, MLP, norms) before it returns, so their outputs come first in the dump. Their distances, and
    what a layer of the stack (a path ending in its number) sums: the residual stream it took in (its input,
    or in a dump without inputs the output recorded before its first part) and the parts it adds to it (its
    direct parts other than norms: attention, the MLP or MoE block). Other enclosing modules (an MoE block,
    attention) return their last part's work: their input, or the output before them, stays their baseline."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, str], float] = {}
        self.before: dict[tuple[int, str], list[TensorDiff]] = {}
        self.outputs: list[tuple[int, str, str, TensorDiff]] = []

    def arrive(self, row: TensorDiff, previous: list[TensorDiff]) -> None:
        """`row` is next in execution order, `previous` the outputs just before it."""
        match = OP_NAME.match(row.module or "")
        if match is not None:
            self.before.setdefault((row.step, match.group("path")), previous)
            if "cosine" in row.metrics:
                self.outputs.append((row.step, match.group("path"), match.group("cls"), row))

    def layer_sum(self, row: TensorDiff, own: list[TensorDiff]) -> list[TensorDiff]:
        """For a layer of the stack: the stream it took in (its own inputs, or in a dump without them the output
        recorded before its first part) and its direct parts other than norms; [] for any other module, and for
        a layer with inputs but no parts recorded."""
        match = OP_NAME.match(row.module or "")
        if match is None or not match.group("path").rsplit(".", 1)[-1].isdigit():
            return []
        prefix = match.group("path") + "."
        stream = own or next((rows for (step, path), rows in self.before.items()
                              if step == row.step and path.startswith(prefix)), [])
        added = {path: part for step, path, cls, part in self.outputs  # the last output of each direct part
                 if step == row.step and path.startswith(prefix) and "." not in path[len(prefix):]
                 and "norm" not in cls.lower()}
        if not stream or (own and not added):
            return []
        return [*stream, *added.values()]

    def add(self, row: TensorDiff) -> None:
        match = OP_NAME.match(row.module or "")
        if match is not None:
            key = (row.step, match.group("path"))
            self.seen[key] = max(self.seen.get(key, 0.0), 1.0 - float(row.metrics["cosine"]))

    def worst_inside(self, row: TensorDiff) -> float:
        """The worst distance among the outputs recorded inside `row`'s module (0 without any)."""
        match = OP_NAME.match(row.module or "")
        if match is None:
            return 0.0
        prefix = match.group("path") + "."
        return max((distance for (step, path), distance in self.seen.items()
                    if step == row.step and path.startswith(prefix)), default=0.0)


def noise_line(row: TensorDiff, base: dict[str, Any], ctx: Context) -> float:
    """The cosine distance an output may reach before its distance rule fires: its peers' line where one
    covers it, else the fixed line (`amplification` times its input's, plus one rounding)."""
    allowed = ctx.lines.allowed_distance(row, base) if ctx.lines is not None else None
    if allowed is not None:
        return allowed
    return fixed_line(row, base, ctx.cfg.amplification)


def apply_relative_rules(rows: list[TensorDiff], cfg: LogitsConfig) -> None:
    """Judge each output not already divergent against its module's inputs, or the output before it."""
    inputs: dict[tuple[int, str | None], list[TensorDiff]] = {}
    previous: list[TensorDiff] = []
    measured: list[tuple[TensorDiff, dict[str, Any]]] = []
    inner = _InnerDistances()
    routing: list[TensorDiff] = []
    for row in rows:
        if row.role == INPUT:
            inputs.setdefault((row.step, row.module), []).append(row)
            continue
        if row.role == EXPERT_CALL:
            continue
        if row.role == ROUTING:  # never judged here; the experts combine the router's input by its weights
            if "cosine" in row.metrics:
                inner.arrive(row, previous)
                previous = [*inputs.get((row.step, row.module), []), row]
                routing.append(row)
            continue
        own = transformed_inputs(row, inputs.get((row.step, row.module), []))
        summed = inner.layer_sum(row, own)
        base_rows = summed or ([*own, *_routing_of(row, routing)] if own else previous)
        routed_alike = row.carried_metrics is not None and not mixes_tokens(row)
        base = baseline(base_rows, routed_alike=routed_alike)
        if summed and base is not None and "cosine" in row.metrics:
            base["cosine"] = _sum_of(summed, row.metrics)
        elif base is not None and (factors := _factors_cosine(base_rows, routed_alike)) is not None:
            base["cosine"] = factors
        if base is not None and "cosine" in row.metrics:
            measured.append((row, {**base, "inner_distance": inner.worst_inside(row)}))
            inner.add(row)
        if base is not None and row.problem is not None and not row.integer:
            row.baseline = base
        if not row.integer:
            inner.arrive(row, previous)
            previous = [row]
    if not cfg.relative:
        return
    ctx = Context(cfg, PeerLines.of(measured, cfg) if cfg.noise_from_peers else None)
    for row, base in measured:
        row.noise_line = noise_line(row, base, ctx)
        if row.problem is not None or row.metrics["max_abs_error"] <= cfg.cosine_abs_floor:
            continue
        finding = next((found for rule in MODULE_RULES if (found := rule.judge(row, base, ctx)) is not None), None)
        if finding is not None:
            _record(row, finding)
            row.baseline = base if finding.noise is None else {**base, "noise": finding.noise}
