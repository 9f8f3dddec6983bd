"""Read a tensor saved by `torch.save` without importing torch.

Why: importing torch costs ~300 MB of resident memory and seconds of start-up, more than the
tensors of a whole layer; the dump diff only needs the numbers. A `.pt` file (torch >= 1.6) is a
zip archive: `<name>/data.pkl` pickles a call to `torch._utils._rebuild_tensor_v2` whose storage
is a persistent reference to `<name>/data/<key>` (raw little-endian bytes). We unpickle with an
allow-list of exactly those globals and map the storage to numpy; bfloat16 becomes float32.
Anything else (legacy non-zip files, other pickled objects) raises PtFormatError.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": np.uint16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class PtFormatError(ValueError):
    """The file is not a zip-format torch tensor this reader understands."""


class _StorageType:
    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


def _rebuild_tensor(storage: tuple[np.ndarray, str], offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                    *_ignored: Any) -> np.ndarray:
    flat, name = storage
    itemsize = flat.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(flat[offset:], shape=tuple(size),
                                           strides=tuple(s * itemsize for s in stride))
    if name == "BFloat16Storage":  # bfloat16 is the top half of a float32
        return (view.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(view)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str) -> None:
        import io

        super().__init__(io.BytesIO(data))
        self.archive = archive
        self.prefix = prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise PtFormatError(f"unsupported object {module}.{name} in the pickle")

    def persistent_load(self, pid: Any) -> tuple[np.ndarray, str]:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise PtFormatError(f"unsupported storage reference {pid!r}")
        storage_type, key = pid[1], pid[2]
        raw = self.archive.read(f"{self.prefix}/data/{key}")
        return np.frombuffer(raw, dtype=storage_type.dtype.newbyteorder("<")), storage_type.name


def load_pt(path: str | Path) -> np.ndarray:
    """The tensor in a `.pt` file as a numpy array (bfloat16 widened to float32)."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise PtFormatError("not a zip-format .pt file (truncated, or saved by torch < 1.6)") from exc
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise PtFormatError("no single data.pkl in the archive")
        prefix = pickles[0].removesuffix("/data.pkl")
        byteorder = f"{prefix}/byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise PtFormatError("big-endian tensor files are not supported")
        try:
            result = _Unpickler(archive.read(pickles[0]), archive, prefix).load()
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError, zipfile.BadZipFile, OSError) as exc:
            raise PtFormatError(f"cannot unpickle the tensor ({exc})") from exc
    if not isinstance(result, np.ndarray):
        raise PtFormatError(f"the file holds a {type(result).__name__}, not a single tensor")
    return result
