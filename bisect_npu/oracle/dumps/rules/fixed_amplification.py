"""The fixed line, for outputs no peer line covers: the cosine distance `amplification` times its input's."""

from __future__ import annotations

from typing import Any, ClassVar

from bisect_npu.oracle.dumps.noise import input_is_exact, own_rounding
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
        if distance < fixed_line(row, base, ctx.cfg.amplification):
            return None
        inner = float(base.get("inner_distance", 0.0)) if input_is_exact(row, base) else 0.0
        parts = f"; its parts' worst {inner:.4g}" if inner > 0 else ""
        return Finding(self.name, f"cosine distance {distance:.4g} vs {distance_in:.4g} of its input's "
                                  f"(cosine {out['cosine']:.7g} vs {base['cosine']:.7g}){parts}",
                       f"config amplification {ctx.cfg.amplification:g} (fixed line: no peers)")


def fixed_line(row: TensorDiff, base: dict[str, Any], amplification: float) -> float:
    """The distance the fixed line allows: `amplification` times the input's, plus one rounding. The output's
    own rounding adds to what its input carries (small errors' squared norms add), and where the baseline is
    the recorded neighbour before, the unrecorded steps between (attention's scores, softmax, weighted sum)
    round too. For an input exact to within one rounding, the outputs recorded inside the module (a decoder
    layer's attention and MLP, each rounding on its own) measure on the pair what its parts carried."""
    line = amplification * (1.0 - float(base["cosine"]))
    if input_is_exact(row, base):
        line = max(line, float(base.get("inner_distance", 0.0)))
    return line + own_rounding(row)
