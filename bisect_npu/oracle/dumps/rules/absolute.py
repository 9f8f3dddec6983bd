"""The absolute pass lines: msprobe compare's cosine rule and the optional lines of LogitsConfig."""

from __future__ import annotations

from typing import ClassVar

from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import Context, Finding, TensorRule


class Absolute(TensorRule):
    name: ClassVar[str] = "absolute"
    measures: ClassVar[str] = ("NaN/Inf the reference lacks; the cosine (msprobe: below 0.99 with a max absolute "
                               "error above 0.001, or below 0.9), and any optional line set in the config")

    def judge(self, row: TensorDiff, ctx: Context) -> Finding | None:
        if row.integer:
            return None
        metrics, cfg = row.metrics, ctx.cfg
        if metrics["nonfinite_candidate"] > metrics["nonfinite_reference"]:
            return Finding(self.name, f"{int(metrics['nonfinite_candidate'])} NaN/Inf values (reference has "
                                      f"{int(metrics['nonfinite_reference'])})", "any NaN/Inf the reference lacks")
        cosine_line = cfg.min_cosine if metrics.get("max_abs_error", float("inf")) > cfg.cosine_abs_floor \
            else cfg.min_cosine_always
        lines = [("cosine", cosine_line, "<"), ("max_abs_error", cfg.max_abs_error, ">"),
                 ("max_rel_error", cfg.max_rel_error, ">"), ("within_1e3", cfg.min_within_1e3, "<"),
                 ("within_5e3", cfg.min_within_5e3, "<"), ("kl", cfg.max_kl, ">")]
        for key, line, broken_when in lines:
            if line is None or key not in metrics:
                continue
            value = metrics[key]
            if (value < line) if broken_when == "<" else (value > line):
                source = ("msprobe compare's cosine pass line (config min_cosine, min_cosine_always)"
                          if key == "cosine" else f"config line {key}")
                return Finding(self.name, f"{key} {value:.6g} {broken_when} {line:g}", source)
        return None
