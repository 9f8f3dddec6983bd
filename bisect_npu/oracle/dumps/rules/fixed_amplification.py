"""The fixed line, for outputs no peer line covers: the cosine distance `amplification` times its input's."""

from __future__ import annotations

from typing import Any, ClassVar

from bisect_npu.oracle.dumps.noise import own_rounding
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import Context, Finding, ModuleRule


class FixedAmplification(ModuleRule):
    name: ClassVar[str] = "cosine_amplification"
    measures: ClassVar[str] = ("output cosine distance above `amplification` times its input's plus one rounding "
                               "to the judged dtype; only where no peer line covers the output")

    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        if ctx.lines is not None and ctx.lines.covers(row):
            return None
        out = row.metrics
        distance, distance_in = 1.0 - out["cosine"], 1.0 - base["cosine"]
        # The output's own rounding adds to what its input carries (small errors' squared norms add), and
        # where the baseline is the recorded neighbour before, the unrecorded steps between (attention's
        # scores, softmax, weighted sum) round too: one rounding's distance on top of the amplified input's.
        if distance < ctx.cfg.amplification * distance_in + own_rounding(row):
            return None
        return Finding(self.name, f"cosine distance {distance:.4g} vs {distance_in:.4g} of its input's "
                                  f"(cosine {out['cosine']:.7g} vs {base['cosine']:.7g})",
                       f"config amplification {ctx.cfg.amplification:g} (fixed line: no peers)")
