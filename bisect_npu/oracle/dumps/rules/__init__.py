"""The dump rules, one class a file, run in the order declared here; the first that fires names the tensor.

A new rule is one file with a `TensorRule` or `ModuleRule` subclass and one entry below.
Tensor rules judge every compared pair on its own metrics. Module rules judge each output not
already divergent against its baseline (its inputs shaped like it, or the output before it) and,
with `noise_from_peers`, the noise lines its kind's other layers draw; an output whose max
absolute error is at most `cosine_abs_floor` is not judged by them (a near-zero tensor says little).
"""

from __future__ import annotations

from typing import Any

from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.entries import EXPERT_CALL, INPUT, ROUTING, TensorEntry
from bisect_npu.oracle.dumps.noise import PeerLines, baseline, mixes_tokens, own_rounding, transformed_inputs
from bisect_npu.oracle.dumps.routing import RoutingReport
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.absolute import Absolute
from bisect_npu.oracle.dumps.rules.base import Context, Finding, ModuleRule, TensorRule
from bisect_npu.oracle.dumps.rules.fixed_amplification import FixedAmplification
from bisect_npu.oracle.dumps.rules.integer_equality import IntegerEquality
from bisect_npu.oracle.dumps.rules.msprobe_amplification import MsprobeAmplification
from bisect_npu.oracle.dumps.rules.peer_cosine import PeerCosine
from bisect_npu.oracle.dumps.rules.peer_norm import PeerNorm
from bisect_npu.oracle.dumps.rules.routing import MeasuredPair, Routing, apply_routing

TENSOR_RULES: tuple[TensorRule, ...] = (IntegerEquality(), Absolute())
# Runs over the whole dump pair between the tensor rules and the module rules (`rules/routing.py`).
DUMP_RULES = (Routing,)
MODULE_RULES: tuple[ModuleRule, ...] = (MsprobeAmplification(), PeerCosine(), PeerNorm(), FixedAmplification())


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


def noise_line(row: TensorDiff, base: dict[str, Any], ctx: Context) -> float:
    """The cosine distance an output may reach before its distance rule fires: its peers' line where one
    covers it, else the fixed line (`amplification` times its input's, plus one rounding)."""
    allowed = ctx.lines.allowed_distance(row, base) if ctx.lines is not None else None
    if allowed is not None:
        return allowed
    return ctx.cfg.amplification * (1.0 - float(base["cosine"])) + own_rounding(row)


def apply_relative_rules(rows: list[TensorDiff], cfg: LogitsConfig) -> None:
    """Judge each output not already divergent against its module's inputs, or the output before it."""
    inputs: dict[tuple[int, str | None], list[TensorDiff]] = {}
    previous: list[TensorDiff] = []
    measured: list[tuple[TensorDiff, dict[str, Any]]] = []
    for row in rows:
        if row.role == INPUT:
            inputs.setdefault((row.step, row.module), []).append(row)
            continue
        if row.role == EXPERT_CALL:
            continue
        if row.role == ROUTING:  # never judged here; the experts combine the router's input by its weights
            if "cosine" in row.metrics:
                previous = [*inputs.get((row.step, row.module), []), row]
            continue
        base_rows = transformed_inputs(row, inputs.get((row.step, row.module), [])) or previous
        base = baseline(base_rows, routed_alike=row.carried_metrics is not None and not mixes_tokens(row))
        if base is not None and "cosine" in row.metrics:
            measured.append((row, base))
        if base is not None and row.problem is not None and not row.integer:
            row.baseline = base
        if not row.integer:
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
