"""The cosine distance's amplification (or, for an exact input, the distance) against the module's peers."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from bisect_npu.oracle.dumps.noise import distance_statistic, own_rounding
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import PEER_SETTINGS_SOURCE, Context, Finding, ModuleRule


class PeerCosine(ModuleRule):
    name: ClassVar[str] = "cosine_amplification"
    measures: ClassVar[str] = ("log(output cosine distance / input's) against the same module kind in the other "
                               "layers: median + peer_mads MADs, at least peer_min_factor times the median")

    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        if ctx.lines is None or row.index not in ctx.lines.distance:
            return None
        if 1.0 - row.metrics["cosine"] <= own_rounding(row):  # at its own rounding: its ratio is the floors'
            return None
        statistic, line = ctx.lines.distance[row.index]
        value = distance_statistic(row, base)[1]
        if value <= line.line:
            return None
        distance, distance_in = 1.0 - row.metrics["cosine"], 1.0 - base["cosine"]
        noise = {"statistic": statistic, "value": math.exp(value), "peer_median": math.exp(line.median),
                 "line": math.exp(line.line), "peers": line.peers, "above_line": math.exp(value - line.line)}
        peers, reach, median = line.peers, math.exp(line.line), math.exp(line.median)
        what = (f"amplified x{math.exp(value):.3g} where its {peers} peers' noise reaches x{reach:.3g} (median "
                f"x{median:.3g})") if statistic == "amplification" else (
            f"its input exact, where its {peers} peers' output distance reaches {reach:.3g} (median {median:.3g})")
        return Finding(self.name, f"cosine distance {distance:.4g} vs {distance_in:.4g} of its input's (cosine "
                                  f"{row.metrics['cosine']:.7g}): {what}, {noise['above_line']:.3g} times the line",
                       f"measured on the pair: {peers} peers; peer_mads {ctx.cfg.peer_mads:g}, peer_min_factor "
                       f"{ctx.cfg.peer_min_factor:g} from {PEER_SETTINGS_SOURCE}", noise)
