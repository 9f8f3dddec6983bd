"""msprobe compare's amplification rule: inputs agree, the output does not."""

from __future__ import annotations

from typing import Any, ClassVar

from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import Context, Finding, ModuleRule


class MsprobeAmplification(ModuleRule):
    name: ClassVar[str] = "msprobe_amplification"
    measures: ClassVar[str] = "the share of elements within 1/1000: the inputs' above 0.9, the output's below 0.1"

    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        out = row.metrics
        if not ctx.cfg.msprobe_rule or not (base["within_1e3"] > 0.9 and out["within_1e3"] < 0.1):
            return None
        return Finding(self.name, f"within_1e3 {out['within_1e3']:.4g} while its input's is {base['within_1e3']:.4g} "
                                  "(msprobe: input > 0.9, output < 0.1)",
                       "MindStudio Probe compare's own lines (0.9, 0.1)")
