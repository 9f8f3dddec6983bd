"""Integer tensors (token ids, positions, expert indices, masks) compared as what they are: by equality.

Why not cosine: an id is a label, not a magnitude. Expert 7 chosen where the reference chose 6 is
as wrong as expert 70, and a top-k that lists the same experts in another order chose the same
ones, yet cosine sees a small change in the first case and a large one in the second. So:
* a tensor of choices per row (two or more dimensions, a last dimension of at most
  `SET_WIDTH`: the top-k expert ids of each token) is compared row by row as a set of values;
* any other integer or boolean tensor (ids, positions, masks) element by element.
Integer tensors are small beside the activations, so each is read whole.
"""

from __future__ import annotations

import numpy as np

from bisect_npu.oracle.dumps.formats import TensorFile

# The widest top-k compared as a set per row (DeepSeek-V3 routes to 8, large MoEs to 16 or 32 experts).
SET_WIDTH = 32


def is_integer(tensor: TensorFile) -> bool:
    """Stored as an integer or a boolean (bfloat16 is stored as 16-bit words and is not one)."""
    return not tensor.bfloat16 and tensor.stored.kind in "iub"


def integer_dtype(name: str) -> bool:
    """Whether a dump index's dtype name (`int64`, `torch.int32` read as `int32`, `bool`) is an integer one."""
    return name.startswith(("int", "uint")) or name == "bool"


def compared_as_sets(shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and 0 < shape[-1] <= SET_WIDTH


def integer_metrics(cand: TensorFile, ref: TensorFile) -> dict[str, float]:
    """The share of equal elements, and the rows (of a choice tensor: each the set it chose) that differ."""
    c, r = cand.read_all(), ref.read_all()
    size = max(1, r.size)
    out = {"equal": float(np.count_nonzero(c == r)) / size, "rows": 1.0, "rows_differ": float(not np.array_equal(c, r))}
    if compared_as_sets(tuple(ref.shape)):
        width = ref.shape[-1]
        c_rows, r_rows = np.sort(c.reshape(-1, width), axis=1), np.sort(r.reshape(-1, width), axis=1)
        out["rows"] = float(r_rows.shape[0])
        out["rows_differ"] = float(np.count_nonzero((c_rows != r_rows).any(axis=1)))
    return out
