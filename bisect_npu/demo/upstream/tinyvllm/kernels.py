"""ctypes bindings of the compiled kernels (csrc/, built by `python tools/build_kernels.py`)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

_LIBRARY = Path(__file__).resolve().parent / "_kernels.so"


def _load() -> ctypes.CDLL:
    if not _LIBRARY.exists():
        raise ImportError(f"{_LIBRARY} is missing: run `python tools/build_kernels.py` first")
    lib = ctypes.CDLL(str(_LIBRARY))
    lib.tv_argmax.argtypes = [ctypes.c_void_p, ctypes.c_long]
    lib.tv_argmax.restype = ctypes.c_long
    lib.tv_bin_counts.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long]
    lib.tv_bin_counts.restype = None
    return lib


_lib = _load()


def argmax(values: torch.Tensor) -> int:
    """Index of the first maximum of a 1-D float tensor (torch.argmax's tie rule)."""
    values = values.detach().to(torch.float32).contiguous()
    return int(_lib.tv_argmax(values.data_ptr(), values.numel()))


def bin_counts(ids: list[int], vocab_size: int) -> torch.Tensor:
    """Occurrences of each id in [0, vocab_size); negative ids (placeholders) are skipped."""
    counts = torch.zeros(vocab_size, dtype=torch.float32)
    if ids:
        id_tensor = torch.tensor(ids, dtype=torch.int64)
        _lib.tv_bin_counts(id_tensor.data_ptr(), id_tensor.numel(), counts.data_ptr(), vocab_size)
    return counts
