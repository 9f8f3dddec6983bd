"""The norm ratio's change (a gain cosine cannot see) against the module's peers."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from bisect_npu.oracle.dumps.noise import norm_change
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import PEER_SETTINGS_SOURCE, Context, Finding, ModuleRule


class PeerNorm(ModuleRule):
    name: ClassVar[str] = "norm_ratio"
    measures: ClassVar[str] = ("|log(candidate norm / reference norm)| beyond its input's, against the same module "
                               "kind in the other layers: median + peer_mads MADs, at least half the dtype's "
                               "tolerance")

    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        if ctx.lines is None or row.index not in ctx.lines.norm:
            return None
        line = ctx.lines.norm[row.index]
        value = norm_change(row, base)
        if value <= line.line:
            return None
        noise = {"statistic": "norm_change", "value": value, "peer_median": line.median, "line": line.line,
                 "peers": line.peers, "above_line": value / line.line if line.line > 0 else math.inf}
        return Finding(self.name, f"norm ratio {row.metrics['norm_ratio']:.5g} (its input's moved "
                                  f"{base['norm_change']:.3g} in log): moved {value:.4g} where its {line.peers} "
                                  f"peers' noise reaches {line.line:.3g} (median {line.median:.3g}), "
                                  f"{noise['above_line']:.3g} times the line",
                       f"measured on the pair: {line.peers} peers; peer_mads {ctx.cfg.peer_mads:g} from "
                       f"{PEER_SETTINGS_SOURCE}", noise)
