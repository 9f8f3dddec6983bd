"""The noise model: what a module's output is measured against, and the lines its pair's own noise draws.

A module's output is measured against its baseline: the worst agreement of its inputs shaped like
it (the hidden state it transforms; all its inputs when none is) or, for a dump without inputs,
the output before it in execution order. Two statistics per output (see `peers`): the cosine
distance's amplification over the baseline's (for an input exact to within one rounding, the
output's distance itself), and the norm ratio's change beyond the baseline's. Each is judged
against the same module kind in the other layers of the pair (`PeerLines`): the pair's own noise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.peers import Line, few_peer_lines, leave_one_out_lines, log_ratio, module_kind
from bisect_npu.oracle.dumps.precision import cosine_floor, dtype_tolerance
from bisect_npu.oracle.dumps.rows import TensorDiff


def baseline(rows: list[TensorDiff], routed_alike: bool = False) -> dict[str, Any] | None:
    """The worst agreement among `rows`, metric by metric (None when none was measured): over their whole
    tensors, or, for an output measured on the tokens that routed alike (`routed_alike`), over the same
    tokens where an input was measured on them too. Why: an amplification is only a ratio of like with
    like; the flipped tokens' drift in a whole input over an output without them shrinks every MoE layer's
    ratio after the first flip, and the peer lines drawn from those ratios call the first MoE layer bad."""
    measured = [(row.name, row.metrics if routed_alike else (row.carried_metrics or row.metrics))
                for row in rows if "cosine" in row.metrics]
    if not measured:
        return None
    return {"tensors": [name for name, _ in measured],
            "cosine": min(metrics["cosine"] for _, metrics in measured),
            "within_1e3": min(metrics["within_1e3"] for _, metrics in measured),
            "within_tol": min(metrics["within_tol"] for _, metrics in measured),
            "max_rel_error": max(metrics["max_rel_error"] for _, metrics in measured),
            "norm_change": max(log_ratio(metrics.get("norm_ratio", 1.0)) for _, metrics in measured)}


_ATTENTION = re.compile(r"\.(?:self_attn|attention|attn)(?:\.o_proj|\.out_proj|\.dense)?\.[A-Za-z_]\w*\.forward\.\d+$")


def mixes_tokens(row: TensorDiff) -> bool:
    """Whether the output is attention's (its module, or the output projection after its core): the step to
    it mixes tokens, so a flipped token's drift reaches the tokens that routed alike, and its input is
    measured whole. The projections before the core (query, key, value, their norms) work token by token."""
    return _ATTENTION.search((row.module or row.name).lower()) is not None


def transformed_inputs(row: TensorDiff, inputs: list[TensorDiff]) -> list[TensorDiff]:
    """The inputs shaped like the output (the hidden state a layer, attention or MLP transforms), or all of
    them when none is. Why: auxiliary inputs (the rotary cos/sin, position ids, masks) and the weights are
    not what the module transforms; a bf16 model's rotary tables, cast from its own bf16 `inv_freq`, differ
    from an fp32 golden's by about one rounding, and an output judged against them looks amplified."""
    shaped = [item for item in inputs if "cosine" in item.metrics and row.shape is not None and item.shape == row.shape]
    return shaped or inputs


def own_rounding(row: TensorDiff) -> float:
    """The cosine distance one rounding to the row's dtype leaves in it: `cosine_floor`, scaled where the row
    measures a part of the stored tensor (`rounding_scale`: a softmax router's logits less their shared part,
    rounded at the whole logits' magnitude)."""
    return cosine_floor(row.dtype) * float(row.metrics.get("rounding_scale", 1.0))


def input_is_exact(row: TensorDiff, base: dict[str, Any]) -> bool:
    """Whether the module's input agrees to within one rounding (bit-identical, or just cast): its
    amplification then says nothing, and its output distance is judged against its peers' instead."""
    return bool(1.0 - base["cosine"] < cosine_floor(row.dtype))


def distance_statistic(row: TensorDiff, base: dict[str, Any]) -> tuple[str, float]:
    """("amplification", log(output's cosine distance / its input's)) or, for an exact input,
    ("distance", log(output's cosine distance)); distances floored at one rounding to the row's dtype."""
    floor = cosine_floor(row.dtype)
    out = math.log(max(1.0 - row.metrics["cosine"], own_rounding(row)))
    if input_is_exact(row, base):
        return "distance", out
    return "amplification", out - math.log(max(1.0 - base["cosine"], floor))


_NORMALISES = re.compile(r"(?:^|[._])(?:\w*norm)(?:\.[A-Za-z_]\w*norm\.forward\.\d+)?$", re.IGNORECASE)


def normalises(row: TensorDiff) -> bool:
    """Whether the output is a normalisation's (an RMSNorm or LayerNorm module: `input_layernorm`, `q_norm`,
    `model.norm`), whose output norm does not follow its input's."""
    return _NORMALISES.search(row.module or row.name) is not None


def norm_change(row: TensorDiff, base: dict[str, Any]) -> float:
    """How far the output's norm ratio moved from 1 (log), less what its inputs' had moved; a normalisation's
    own (its output is its input over the input's rms, times its weight: an input's norm change does not pass
    through). Why: taken off a norm's, the input's change left every norm after a gain upstream (an MoE layer's
    output moved by a router's flips or a fault) with a large negative value, a spread that hid a norm's own
    gain among its peers."""
    if normalises(row):
        return log_ratio(row.metrics["norm_ratio"])
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
        exact = {row.index for row, base in measured if input_is_exact(row, base)}
        for row, base in measured:
            # An amplification is a ratio of like with like: one measured on the tokens that routed alike is a
            # peer of its likes. A distance is the output's own: every layer's output of the kind is a peer of
            # an exact-input one, measured whole or on the tokens that routed alike (of the first MoE layers,
            # before any flip, a shallow model has too few for a line). A norm change is a gain, the same on
            # any set of tokens: every layer's output of the kind is its peer too (split, the attention after
            # the first router of a 5-layer model has two peers and meets the highest line of another kind).
            whole_kind = module_kind(row.module, row.name)
            kind = whole_kind + (" (routed alike)" if row.carried_metrics else "")
            statistic, value = distance_statistic(row, base)
            if statistic == "amplification":
                amp.setdefault(kind, []).append((row.index, value))
                value = math.log(max(1.0 - row.metrics["cosine"], own_rounding(row)))
            dist.setdefault(whole_kind, []).append((row.index, value))
            change = norm_change(row, base)
            if math.isfinite(change):
                norm.setdefault(whole_kind, []).append((row.index, change))
        amp_lines = _lines(amp, cfg, lambda _: floor)
        dist_lines = _lines(dist, cfg, lambda _: floor)
        distance = {index: ("distance", line) for index, line in dist_lines.items() if index in exact}
        distance.update({index: ("amplification", line) for index, line in amp_lines.items() if index not in exact})
        return PeerLines(distance, _lines(norm, cfg, lambda index: dtype_tolerance(dtypes[index]) / 2))

    def allowed_distance(self, row: TensorDiff, base: dict[str, Any]) -> float | None:
        """The cosine distance the row's distance line allows it (its input's times the amplification line, or
        the distance line itself for an exact input); None when no distance line covers it."""
        if row.index not in self.distance:
            return None
        statistic, line = self.distance[row.index]
        if statistic == "distance":
            return math.exp(line.line)
        return math.exp(line.line) * max(1.0 - float(base["cosine"]), cosine_floor(row.dtype))

    def covers(self, row: TensorDiff) -> bool:
        return row.index in self.distance or row.index in self.norm


def _lines(kinds: dict[str, list[tuple[int, float]]], cfg: LogitsConfig,
           min_spread: Callable[[int], float]) -> dict[int, Line]:
    """Each member's line from its kind's other layers; for members of kinds too small for a spread, the higher
    of the highest line of any kind and the line their few peers' worst draws (none at all where no kind has
    enough peers: the fixed line then judges)."""
    lines = leave_one_out_lines(kinds, cfg.peer_mads, cfg.min_peers, min_spread)
    if not lines:
        return lines
    highest = max(lines.values(), key=lambda line: line.line)
    few = few_peer_lines(kinds, cfg.min_peers, min_spread)
    out: dict[int, Line] = {}
    for members in kinds.values():
        for index, _ in members:
            own = lines.get(index)
            if own is None:
                own = max(highest, few.get(index, highest), key=lambda line: line.line)
            out[index] = own
    return out
