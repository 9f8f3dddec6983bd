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
    integer: bool = False
    noise_line: float | None = None
    reference_dtype: str | None = None
    shape: tuple[int, ...] | None = None
    carried_metrics: dict[str, float] | None = None

    def precisions(self) -> str:
        """Both sides' precisions in words: the candidate's against the reference's (the judged one when alike)."""
        candidate = self.candidate_dtype or self.dtype
        return f"{candidate} against {self.reference_dtype or self.dtype}"

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
        carriers = [row for row in later if row.problem is None and row.role == OUTPUT and "cosine" in row.metrics
                    and 1.0 - row.metrics["cosine"] >= max(cosine_floor(row.dtype), self.amplification * before)]
        return carriers, also


    def layer_profile(self) -> list[dict[str, Any]]:
        """Per layer, the output that stands closest to (or furthest above) its noise line: its cosine distance
        and the distance its line allows, in execution order of the layers; where drift enters, the first
        distance above its line."""
        worst: dict[int, TensorDiff] = {}
        for row in self.rows:
            if row.layer is None or row.noise_line is None or "cosine" not in row.metrics or row.noise_line <= 0:
                continue
            held = worst.get(row.layer)
            if held is None or _over_line(row) > _over_line(held):
                worst[row.layer] = row
        return [{"layer": layer, "tensor": row.name, "distance": round_figure(1.0 - row.metrics["cosine"]),
                 "line": round_figure(row.noise_line or 0.0), "diverged": row.problem is not None}
                for layer, row in sorted(worst.items())]


def _over_line(row: TensorDiff) -> float:
    return (1.0 - row.metrics["cosine"]) / (row.noise_line or 1.0)


def round_figure(value: float) -> float:
    return value if not math.isfinite(value) else float(f"{value:.6g}")


def rounded(figures: dict[str, Any]) -> dict[str, Any]:
    """`figures` with every float (nested mappings too) rounded to six digits."""
    return {k: round_figure(v) if isinstance(v, float) else rounded(v) if isinstance(v, dict) else v
            for k, v in figures.items()}
