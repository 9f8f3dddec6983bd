"""What a comparison answers: one row per tensor pair, and the rows of a whole dump pair."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bisect_npu.oracle.dumps.entries import OUTPUT
from bisect_npu.oracle.dumps.precision import cosine_floor
from bisect_npu.oracle.dumps.routing import RoutingReport


@dataclass
class TensorDiff:
    """Comparison of one tensor pair; `problem` is set when it diverges, `rule` says which rule fired,
    `provenance` where that rule's thresholds came from, and `baseline` what it was measured against
    (the module's inputs or the neighbour before it). `carried_metrics`: the whole tensor's metrics where
    `metrics` leave some tokens out (the routing rule's), what the tensors after it are measured against."""

    name: str
    index: int
    step: int
    layer: int | None
    module: str | None = None
    role: str = OUTPUT
    dtype: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    problem: str | None = None
    rule: str | None = None
    provenance: str | None = None
    baseline: dict[str, Any] | None = None
    candidate_dtype: str | None = None
    shape: tuple[int, ...] | None = None
    carried_metrics: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "index": self.index, "step": self.step, "layer": self.layer,
                               "problem": self.problem, "rule": self.rule,
                               **{k: round_figure(v) for k, v in self.metrics.items()}}
        if self.provenance is not None:
            out["provenance"] = self.provenance
        if self.module is not None:
            out["module"] = self.module
        if self.candidate_dtype is not None:
            out["dtype"], out["candidate_dtype"] = self.dtype, self.candidate_dtype
        if self.baseline is not None:
            out["baseline"] = rounded(self.baseline)
        return out


@dataclass
class DumpComparison:
    rows: list[TensorDiff]
    seconds: float
    bytes_read: int
    largest_read: int = 0
    amplification: float = 5.0
    routing: list[RoutingReport] = field(default_factory=list)
    routing_unchecked: list[str] = field(default_factory=list)

    @property
    def first_divergent(self) -> TensorDiff | None:
        return next((row for row in self.rows if row.problem is not None), None)

    @property
    def worst_cosine(self) -> TensorDiff | None:
        scored = [row for row in self.rows if "cosine" in row.metrics]
        return min(scored, key=lambda row: row.metrics["cosine"], default=None)

    def after_first(self) -> tuple[list[TensorDiff], list[TensorDiff]]:
        """(carriers, also divergent) after the first divergent tensor: outputs whose cosine distance is
        `amplification` times what the first one's input had (and above the dtype's floor) without a
        rule of their own, and tensors where a rule fires again (a second source, or a module
        enclosing the first one)."""
        first = self.first_divergent
        if first is None:
            return [], []
        later = self.rows[first.index + 1:]
        before = 1.0 - first.baseline["cosine"] if first.baseline else 0.0
        also = [row for row in later if row.problem is not None]
        carriers = [row for row in later if row.problem is None and row.role == OUTPUT and row.metrics
                    and 1.0 - row.metrics["cosine"] >= max(cosine_floor(row.dtype), self.amplification * before)]
        return carriers, also


def round_figure(value: float) -> float:
    return value if not math.isfinite(value) else float(f"{value:.6g}")


def rounded(figures: dict[str, Any]) -> dict[str, Any]:
    """`figures` with every float (nested mappings too) rounded to six digits."""
    return {k: round_figure(v) if isinstance(v, float) else rounded(v) if isinstance(v, dict) else v
            for k, v in figures.items()}
