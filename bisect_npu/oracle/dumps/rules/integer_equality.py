"""Integer tensors by equality: a choice tensor's rows as sets, any other element by element (`integers`)."""

from __future__ import annotations

from typing import ClassVar

from bisect_npu.oracle.dumps.integers import compared_as_sets
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import Context, Finding, TensorRule


class IntegerEquality(TensorRule):
    name: ClassVar[str] = "integer_equality"
    measures: ClassVar[str] = ("ids, indices and masks: the rows of a choice tensor (top-k ids) as sets, any other "
                               "integer tensor element by element; any difference diverges")

    def judge(self, row: TensorDiff, ctx: Context) -> Finding | None:
        if not row.integer or row.metrics["rows_differ"] == 0:
            return None
        differ, rows = int(row.metrics["rows_differ"]), int(row.metrics["rows"])
        if row.shape is not None and compared_as_sets(row.shape):
            what = f"{differ} of {rows} rows chose another set of values (compared as sets: order aside)"
        else:
            what = f"{1.0 - row.metrics['equal']:.4g} of the elements differ (integers compared element by element)"
        return Finding(self.name, what, "exact: integers have no rounding noise")
