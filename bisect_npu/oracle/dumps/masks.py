"""Attention masks compared as what they say: which positions each query may attend to, in any encoding.

Why: the mask is how a kernel was called, not data that carries an error. SDPA takes a boolean mask
(or none: `is_causal`), eager attention an additive float mask in the model's dtype (0 where a query
attends, the dtype's most negative value where it may not). A bf16 SDPA candidate against an fp32
eager golden holds the same mask as `bool` on one side and `float32` on the other, and an fp16 mask
against an fp32 one differs by 10^34 where both mask a position. Compared by cosine, or refused as
another dtype, either is a divergence at the first attention of a correct model. So a mask is read as
the positions it keeps and compared element by element; a mask one side passes and the other leaves
to the kernel (a causal SDPA call) is left out.
"""

from __future__ import annotations

import re

import numpy as np

from bisect_npu.oracle.dumps.entries import INPUT, TensorEntry
from bisect_npu.oracle.dumps.formats import TensorFile

# An input whose name's last part names a mask (HF's `attention_mask`, `attn_mask`, `causal_mask`).
_MASK_NAME = re.compile(r"(?:^|\.)\w*mask$")
# An additive mask keeps a position where its value lies above this: half the most negative fp16 value (an
# fp16 model's masked value); bf16's, fp32's and -inf lie below, a bias a model adds (ALiBi) far above.
MASKED_BELOW = float(np.finfo(np.float16).min) / 2


def is_mask(entry: TensorEntry) -> bool:
    """Whether a dump entry is a module's attention mask (an input named as one)."""
    return entry.role == INPUT and _MASK_NAME.search(entry.name) is not None


def kept(tensor: TensorFile) -> np.ndarray:
    """The positions a mask lets a query attend to, flat: a boolean or integer mask where it is nonzero, an
    additive float mask where it is above `MASKED_BELOW`."""
    values = tensor.read_all().reshape(-1)
    return np.asarray(values != 0 if values.dtype.kind in "iub" else values > MASKED_BELOW)


def mask_metrics(cand: TensorFile, ref: TensorFile) -> dict[str, float]:
    """The share of positions both masks treat alike, as an integer tensor's metrics (element by element)."""
    c, r = kept(cand), kept(ref)
    if c.size != r.size:
        return {"equal": 0.0, "rows": 1.0, "rows_differ": 1.0}
    equal = int(np.count_nonzero(c == r))
    return {"equal": equal / max(1, r.size), "rows": 1.0, "rows_differ": float(equal != r.size)}
