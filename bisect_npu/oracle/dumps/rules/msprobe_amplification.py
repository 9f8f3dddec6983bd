"""msprobe compare's amplification rule, at the precision the pair is judged at: inputs agree, the output does not.

msprobe's own lines read the share of elements within 1/1000. A bf16 value holds ~3 significant
digits (one ulp is 2**-7 relative), so below that the share counts only bit-identical elements:
an input exact at bf16 (the embedding of bf16 weights, upcast in the fp32 golden) has all of them,
and any bf16 computation after it few. Where the judged precision (the coarser side's) cannot
hold 1/1000, the same lines read the share within one of its ulps.
"""

from __future__ import annotations

from typing import Any, ClassVar

from bisect_npu.oracle.dumps.precision import share_at
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import Context, Finding, ModuleRule


class MsprobeAmplification(ModuleRule):
    name: ClassVar[str] = "msprobe_amplification"
    measures: ClassVar[str] = ("the share of elements within 1/1000 (within one ulp where the judged precision is "
                               "coarser): the inputs' above 0.9, the output's below 0.1")

    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        share, within = share_at(row.dtype)
        out = row.metrics
        if not ctx.cfg.msprobe_rule or not (base[share] > 0.9 and out[share] < 0.1):
            return None
        at = "" if share == "within_1e3" else f" at {row.precisions()}, whose resolution is coarser than 1/1000"
        return Finding(self.name, f"{share} {out[share]:.4g} while its input's is {base[share]:.4g} "
                                  "(msprobe: input > 0.9, output < 0.1)",
                       f"MindStudio Probe compare's own lines (0.9, 0.1) on the share within {within}{at}")
