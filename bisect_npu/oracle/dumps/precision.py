"""What each side's precision can hold: the rounding a dtype explains, and the precision a pair is judged at."""

from __future__ import annotations

from bisect_npu.oracle.dumps.peers import rounding_distance

# Relative spacing of the dumped dtype's values (one ulp at the top of a binade).
DTYPE_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "float32": 2.0**-23, "float64": 2.0**-52}


def dtype_tolerance(dtype: str | None) -> float:
    """Relative error that rounding to `dtype` explains: one ulp, never tighter than msprobe's 1/1000."""
    return max(1e-3, DTYPE_EPS.get(dtype or "", 0.0))


def coarser_dtype(a: str, b: str) -> str | None:
    """The lower precision of two floating dtypes (the one a pair is judged at), None unless both are floats."""
    if a not in DTYPE_EPS or b not in DTYPE_EPS:
        return None
    return a if DTYPE_EPS[a] >= DTYPE_EPS[b] else b


def cosine_floor(dtype: str | None) -> float:
    """Cosine distance that rounding to `dtype` can leave in one module's output: half its tolerance, squared."""
    return rounding_distance(dtype_tolerance(dtype))


def resolves(dtype: str | None, relative: float) -> bool:
    """Whether `dtype`'s values are spaced finer than `relative`: a share within `relative` then measures error,
    where for a coarser dtype (bf16 keeps ~3 significant digits) it only counts bit-identical elements."""
    return DTYPE_EPS.get(dtype or "", 0.0) <= relative


def share_at(dtype: str | None) -> tuple[str, str]:
    """(metric, its words) of the share of elements within msprobe's 1/1000, or within one ulp of `dtype`
    where `dtype` cannot hold 1/1000: what the judged precision can show."""
    return ("within_1e3", "1/1000") if resolves(dtype, 1e-3) else ("within_tol", f"one {dtype} ulp")
