"""Read a tensor saved by `torch.save` without importing torch.

Why: importing torch costs more resident memory and start-up time than the tensors of a whole
layer; the dump diff only needs the numbers. A `.pt` file (torch >= 1.6) is a zip archive:
`<name>/data.pkl` pickles a call to `torch._utils._rebuild_tensor_v2` whose storage is a
persistent reference to `<name>/data/<key>` (raw little-endian bytes). We unpickle with an
allow-list of exactly those globals and map the storage to numpy; bfloat16 becomes float32.
Anything else (legacy non-zip files, other pickled objects) raises PtFormatError.

Why byte ranges: a dump's largest tensor (the logits of a whole vocabulary over every token)
would otherwise set the peak memory. torch stores each storage uncompressed, so
`open_pt` reads only the pickle and the member's position in the archive, and
`TensorFile.read` then fetches any run of elements with one positioned read (`os.pread`, not
mmap: mapped pages count as resident memory until the kernel drops them); `read_into` does the
same into buffers the caller keeps from chunk to chunk.
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
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
        self.dtype = np.dtype(_STORAGE_DTYPES[name]).newbyteorder("<")


@dataclass(frozen=True)
class _Storage:
    type: _StorageType
    key: str


@dataclass(frozen=True)
class _Rebuilt:
    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                    *_ignored: Any) -> _Rebuilt:
    return _Rebuilt(storage, int(offset), tuple(int(n) for n in size), tuple(int(n) for n in stride))


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise PtFormatError(f"unsupported object {module}.{name} in the pickle")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise PtFormatError(f"unsupported storage reference {pid!r}")
        return _Storage(pid[1], str(pid[2]))


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _widen(raw: np.ndarray, bfloat16: bool) -> np.ndarray:
    """bfloat16 is the top half of a float32: shift it into place."""
    if not bfloat16:
        return raw
    wide = raw.astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


@dataclass(frozen=True)
class TensorFile:
    """A tensor's elements, in C order, at a byte offset of a file; `array` instead when it had to be
    loaded whole (a strided view, a compressed member). `read` returns float32 for bfloat16."""

    path: Path
    shape: tuple[int, ...]
    stored: np.dtype[Any]
    bfloat16: bool
    data_offset: int = 0
    array: np.ndarray | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.stored.itemsize

    def read(self, start: int, count: int) -> np.ndarray:
        """Elements [start, start + count) as a flat array: one positioned read of exactly those bytes."""
        count = max(0, min(count, self.size - start))
        if self.array is not None:
            return self.array.reshape(-1)[start:start + count]
        nbytes = count * self.stored.itemsize
        fd = os.open(self.path, os.O_RDONLY)
        try:
            raw = os.pread(fd, nbytes, self.data_offset + start * self.stored.itemsize)
        finally:
            os.close(fd)
        if len(raw) != nbytes:
            raise PtFormatError(f"file ends {nbytes - len(raw)} bytes early (truncated)")
        return _widen(np.frombuffer(raw, dtype=self.stored), self.bfloat16)

    def read_all(self) -> np.ndarray:
        return self.read(0, self.size).reshape(self.shape)

    def open(self) -> int | None:
        """A descriptor for `read_into` (None for a tensor held in memory); the caller closes it."""
        return None if self.array is not None else os.open(self.path, os.O_RDONLY)

    def read_into(self, fd: int | None, start: int, count: int, out: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """Elements [start, start + count) as float32 in `out[:count]`, read through `raw` (bytes, at
        least count * itemsize) unless stored as float32: the same buffers chunk after chunk, since
        fresh multi-megabyte arrays cost more in page faults than the arithmetic done on them."""
        count = max(0, min(count, self.size - start))
        dest = out[:count]
        if fd is None:
            np.copyto(dest, self.read(start, count), casting="unsafe")
            return dest
        nbytes = count * self.stored.itemsize
        direct = self.stored == np.dtype("<f4")
        target = dest.view(np.uint8) if direct else raw[:nbytes]
        got = os.preadv(fd, [target.data], self.data_offset + start * self.stored.itemsize)
        if got != nbytes:
            raise PtFormatError(f"file ends {nbytes - got} bytes early (truncated)")
        if self.bfloat16:  # bfloat16 is the top half of a float32: widen, then shift it into place
            wide = dest.view(np.uint32)
            np.copyto(wide, target.view(np.uint16))
            wide <<= 16
        elif not direct:
            np.copyto(dest, target.view(self.stored), casting="unsafe")
        return dest


def _member_offset(path: Path, info: zipfile.ZipInfo) -> int:
    """Byte offset of a stored member's data: after its local header, whose extra field (torch pads
    it for alignment) may differ from the central directory's."""
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        header = handle.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise PtFormatError("bad local header in the archive")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return int(info.header_offset + 30 + name_len + extra_len)


def open_pt(path: str | Path) -> TensorFile:
    """Index the tensor in a `.pt` file without reading its data (loaded whole only when strided)."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise PtFormatError("not a zip-format .pt file (truncated, or saved by torch < 1.6)") from exc
    with archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise PtFormatError("no single data.pkl in the archive")
        prefix = pickles[0].removesuffix("/data.pkl")
        byteorder = f"{prefix}/byteorder"
        if byteorder in names and archive.read(byteorder).strip() != b"little":
            raise PtFormatError("big-endian tensor files are not supported")
        try:
            rebuilt = _Unpickler(io.BytesIO(archive.read(pickles[0]))).load()
            if not isinstance(rebuilt, _Rebuilt):
                raise PtFormatError(f"the file holds a {type(rebuilt).__name__}, not a single tensor")
            info = archive.getinfo(f"{prefix}/data/{rebuilt.storage.key}")
            stype = rebuilt.storage.type
            bfloat16 = stype.name == "BFloat16Storage"
            size = int(np.prod(rebuilt.shape, dtype=np.int64))
            contiguous = size <= 1 or rebuilt.stride == _c_strides(rebuilt.shape)
            if contiguous and info.compress_type == zipfile.ZIP_STORED:
                if (rebuilt.offset + size) * stype.dtype.itemsize > info.file_size:
                    raise PtFormatError("the tensor reaches past its storage")
                return TensorFile(path, rebuilt.shape, stype.dtype, bfloat16,
                                  _member_offset(path, info) + rebuilt.offset * stype.dtype.itemsize)
            flat = np.frombuffer(archive.read(info), dtype=stype.dtype)
        except PtFormatError:
            raise
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError, zipfile.BadZipFile, OSError) as exc:
            raise PtFormatError(f"cannot unpickle the tensor ({exc})") from exc
    itemsize = flat.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(flat[rebuilt.offset:], shape=rebuilt.shape,
                                           strides=tuple(s * itemsize for s in rebuilt.stride))
    return TensorFile(path, rebuilt.shape, stype.dtype, bfloat16,
                      array=_widen(np.ascontiguousarray(view), bfloat16))


def open_npy(path: str | Path) -> TensorFile:
    """Index a `.npy` file (C order, no pickled objects) by its header."""
    path = Path(path)
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(handle)
        offset = handle.tell()
    if dtype.hasobject:
        raise PtFormatError("object arrays are not tensors")
    if fortran_order and len(shape) > 1:
        return TensorFile(path, tuple(shape), dtype, False,
                          array=np.ascontiguousarray(np.load(path, allow_pickle=False)))
    tensor = TensorFile(path, tuple(shape), dtype, False, offset)
    if path.stat().st_size < offset + tensor.nbytes:
        raise PtFormatError("file ends before its last element (truncated)")
    return tensor


def load_pt(path: str | Path) -> np.ndarray:
    """The tensor in a `.pt` file as a numpy array (bfloat16 widened to float32)."""
    return open_pt(path).read_all()
