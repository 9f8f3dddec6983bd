"""The norm ratio's change (a gain cosine cannot see) against the module's peers.

A gain moves the output along itself. The baseline's own norm change is taken off, but that holds
for a map that keeps norm ratios; a projection onto few directions (a router's logits, whose experts
share a large part; attention's output, led by a few tokens whose hidden state drifted) can turn its
input's error, of any direction, into a norm change up to that error's size. So a norm change within
the input's error size, sqrt(2 x its cosine distance) (an error of relative size e leaves a distance
of about e^2 / 2), is no gain of this module's and is left to the distance rules.

Attention's output is the exception where its own error says more: measured on the tokens that routed
alike, its baseline is its whole input, with the flipped tokens' drift that reaches those tokens only
through attention's weights, so the input's error size overstates what reached the output. An error
carried in from the input has no reason to lie along the output: the part of it across the output
(sqrt(2 x the output's cosine distance)) is at least the part along it. A norm change beyond the
output's own error across it lies mostly along the output: a gain, whatever the input's error size.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from bisect_npu.oracle.dumps.noise import mixes_tokens, norm_change, own_rounding
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import PEER_SETTINGS_SOURCE, Context, Finding, ModuleRule


def _error_size(distance: float) -> float:
    """The relative size of an error that leaves a cosine distance `distance` across the reference."""
    return math.sqrt(2.0 * max(0.0, distance))


class PeerNorm(ModuleRule):
    name: ClassVar[str] = "norm_ratio"
    measures: ClassVar[str] = ("|log(candidate norm / reference norm)| beyond its input's, against the same module "
                               "kind in the other layers: median + peer_mads MADs, at least half the dtype's "
                               "tolerance, and beyond its input's error size sqrt(2 x the input's cosine distance) "
                               "or, for attention's output, beyond its own error across it")

    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        if ctx.lines is None or row.index not in ctx.lines.norm:
            return None
        line = ctx.lines.norm[row.index]
        value = norm_change(row, base)
        error_size = _error_size(1.0 - float(base["cosine"]))
        across = _error_size(max(1.0 - float(row.metrics["cosine"]), own_rounding(row)))
        along_output = mixes_tokens(row) and value > across
        if value <= line.line or (value <= error_size and not along_output):
            return None
        noise = {"statistic": "norm_change", "value": value, "peer_median": line.median, "line": line.line,
                 "peers": line.peers, "above_line": value / line.line if line.line > 0 else math.inf}
        beyond = (f"beyond its input's error size {error_size:.3g}" if value > error_size else
                  f"within its input's error size {error_size:.3g} but beyond its own error across it {across:.3g} "
                  "(along the output: a gain)")
        return Finding(self.name, f"norm ratio {row.metrics['norm_ratio']:.5g} (its input's moved "
                                  f"{base['norm_change']:.3g} in log): moved {value:.4g} where its {line.peers} "
                                  f"peers' noise reaches {line.line:.3g} (median {line.median:.3g}), "
                                  f"{noise['above_line']:.3g} times the line and {beyond}",
                       f"measured on the pair: {line.peers} peers and the input's and output's cosine distances; "
                       f"peer_mads {ctx.cfg.peer_mads:g} from {PEER_SETTINGS_SOURCE}", noise)
