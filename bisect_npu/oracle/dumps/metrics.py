"""Per-tensor metrics, streamed: a pair of tensors read chunk by chunk into sums that merge.

Metrics follow msprobe's compare: cosine similarity, max absolute error, max relative error
(|a - b| / (|b| + eps), b the reference), shares of elements with relative error below 1/1000 and
5/1000; plus the share within the judged dtype's own precision (`within_tol`), the norm ratio
(a gain cosine cannot see), and for logits KL divergence and top-k overlap.

Why streamed: real dumps hold hundreds of tensors and a 152K-vocabulary logits tensor. Each file
is read `chunk_elements` at a time by positioned reads; peak memory is a few chunks per worker,
whatever the largest tensor. Why buffers: each worker reads every chunk into the same arrays and
computes every metric in place (`out=`); fresh arrays per chunk cost more in page faults than the
arithmetic done on them, and a chunk of the default size keeps them in a core's cache.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import numpy as np

from bisect_npu.oracle.dumps.formats import TensorFile

_EPS32 = np.float32(np.finfo(np.float32).eps)


@dataclass
class ChunkSums:
    """What the metrics need, summed or maxed over chunks; two halves of a tensor merge into its whole."""

    size: int = 0
    cand_sq: float = 0.0
    ref_sq: float = 0.0
    diff_sq: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    within_1e3: int = 0
    within_5e3: int = 0
    within_tol: int = 0
    nonfinite_c: int = 0
    nonfinite_r: int = 0
    kl: float = 0.0
    overlap: float = 0.0
    rows: int = 0
    rows_skipped: int = 0
    largest_read: int = 0

    def merge(self, other: ChunkSums) -> None:
        for name in ("size", "cand_sq", "ref_sq", "diff_sq", "within_1e3", "within_5e3", "within_tol",
                     "nonfinite_c", "nonfinite_r", "kl", "overlap", "rows", "rows_skipped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_rel = max(self.max_rel, other.max_rel)
        self.largest_read = max(self.largest_read, other.largest_read)

    def add_chunk(self, c: np.ndarray, r: np.ndarray, tolerance: float, vocab: int | None, top_k: int,
                  scratch: Scratch) -> None:
        """Fold one chunk in (rows of `vocab` for logits); the NaN/Inf pairs are counted, the sums cover the
        finite ones, and a tensor with such a chunk gets no KL (over NaN/Inf it says nothing)."""
        self.size += c.size
        diff = np.subtract(c, r, out=scratch.d[:c.size])
        sums = (float(c @ c), float(r @ r), float(diff @ diff))
        if not all(math.isfinite(x) for x in sums):  # NaN/Inf somewhere (or float32 overflow): mask, widen
            fin_c, fin_r = np.isfinite(c), np.isfinite(r)
            self.nonfinite_c += int(c.size - np.count_nonzero(fin_c))
            self.nonfinite_r += int(r.size - np.count_nonzero(fin_r))
            both = fin_c & fin_r
            c, r = c[both].astype(np.float64), r[both].astype(np.float64)
            diff = c - r
            sums = (float(c @ c), float(r @ r), float(diff @ diff))
            self.rows_skipped += vocab is not None
            vocab, denom, mask = None, np.empty_like(r), np.empty(r.size, np.bool_)
        else:
            denom, mask = scratch.t[:c.size], scratch.mask[:c.size]
        self.cand_sq += sums[0]
        self.ref_sq += sums[1]
        self.diff_sq += sums[2]
        if vocab:
            self.add_rows(c.reshape(-1, vocab), r.reshape(-1, vocab), diff.reshape(-1, vocab), top_k, denom)
        if not diff.size:
            return
        np.abs(diff, out=diff)
        self.max_abs = max(self.max_abs, float(diff.max()))
        np.abs(r, out=denom)
        denom += _EPS32
        np.divide(diff, denom, out=diff)
        self.max_rel = max(self.max_rel, float(diff.max()))
        self.within_1e3 += int(np.count_nonzero(np.less(diff, 1e-3, out=mask)))
        self.within_5e3 += int(np.count_nonzero(np.less(diff, 5e-3, out=mask)))
        self.within_tol += int(np.count_nonzero(np.less_equal(diff, tolerance, out=mask)))

    def add_rows(self, c: np.ndarray, r: np.ndarray, diff: np.ndarray, top_k: int, scratch: np.ndarray) -> None:
        """KL(reference || candidate) and top-k overlap of rows over the vocabulary; `diff` is c - r.

        float32 throughout, one exp and one BLAS dot per row and side, in `scratch` (a row's worth):
        KL = log(sum_c / sum_r) - (exp_r . diff) / sum_r - (max_r - max_c), with exp_x = e^(x - max_x)
        and sum_x its sum. KL of identical rows stays exactly 0, and float32 sums of a 152K-vocabulary
        row are far finer than any pass line on KL.
        """
        max_r, max_c = r.max(axis=1), c.max(axis=1)
        work = scratch[:r.shape[1]]
        for row in range(r.shape[0]):
            np.exp(np.subtract(r[row], max_r[row], out=work), out=work)
            sum_r, moved = float(work.sum()), float(work @ diff[row])
            np.exp(np.subtract(c[row], max_c[row], out=work), out=work)
            sum_c = float(work.sum())
            self.kl += (math.log(sum_c) - math.log(sum_r) - moved / sum_r
                        - (float(max_r[row]) - float(max_c[row])))
        k = min(top_k, r.shape[1])
        top_r, top_c = top_k_indices(r, k), top_k_indices(c, k)
        self.overlap += float((top_r[:, :, None] == top_c[:, None, :]).any(axis=2).sum()) / k
        self.rows += r.shape[0]

    def norm_ratio(self) -> float:
        """|candidate| / |reference| (L2): a gain or a lost scale, which cosine cannot see."""
        if self.ref_sq == 0.0:
            return 1.0 if self.cand_sq == 0.0 else math.inf
        return math.sqrt(self.cand_sq / self.ref_sq)

    def metrics(self, logits: bool) -> dict[str, float]:
        size = max(1, self.size)
        if self.cand_sq == 0.0 and self.ref_sq == 0.0:
            cosine = 1.0
        elif self.cand_sq == 0.0 or self.ref_sq == 0.0:
            cosine = 0.0
        else:  # 1 - cos from the squared difference: exact near 1, where c.r / |c||r| loses digits
            norm_c, norm_r = math.sqrt(self.cand_sq), math.sqrt(self.ref_sq)
            distance = (self.diff_sq - (norm_c - norm_r) ** 2) / (2 * norm_c * norm_r)
            cosine = min(1.0, max(-1.0, 1.0 - distance))
        out = {"cosine": cosine, "max_abs_error": self.max_abs, "max_rel_error": self.max_rel,
               "within_1e3": self.within_1e3 / size, "within_5e3": self.within_5e3 / size,
               "within_tol": self.within_tol / size, "norm_ratio": self.norm_ratio(),
               "nonfinite_candidate": float(self.nonfinite_c), "nonfinite_reference": float(self.nonfinite_r),
               "reference_energy": self.ref_sq}
        if logits and self.rows and not self.rows_skipped:
            out["kl"] = self.kl / self.rows
            out["top_k_overlap"] = self.overlap / self.rows
        return out


def top_k_indices(rows: np.ndarray, k: int, block: int = 2048) -> np.ndarray:
    """Indices of each row's k largest values (in no order).

    Why blocks: partitioning every whole row of a large vocabulary is the slow part; the k largest
    values lie in the k blocks with the largest maxima, so one max-reduction finds those blocks,
    and the same search within them (blocks of 64) leaves a few hundred values to partition.
    """
    n_rows, vocab = rows.shape
    n_blocks = vocab // block
    if n_blocks < 4 * k or vocab <= 1024:
        return np.argpartition(rows, vocab - k, axis=1)[:, vocab - k:]
    whole = n_blocks * block
    head = rows[:, :whole].reshape(n_rows, n_blocks, block)
    best = np.argpartition(head.max(axis=2), n_blocks - k, axis=1)[:, n_blocks - k:]
    line = np.arange(n_rows)[:, None]
    values = head[line, best].reshape(n_rows, -1)
    candidates = (best[:, :, None] * block + np.arange(block)).reshape(n_rows, -1)
    if vocab > whole:
        values = np.concatenate([values, rows[:, whole:]], axis=1)
        candidates = np.concatenate([candidates, np.tile(np.arange(whole, vocab), (n_rows, 1))], axis=1)
    chosen: np.ndarray = candidates[line, top_k_indices(values, k, max(1, block // 32))]
    return chosen


class Scratch:
    """One worker's buffers for a chunk, reused for every chunk it reads (see `TensorFile.read_into`)."""

    def __init__(self, elements: int, itemsize: int) -> None:
        self.c, self.r, self.d, self.t = (np.empty(elements, np.float32) for _ in range(4))
        self.mask = np.empty(elements, np.bool_)
        self.raw = np.empty(elements * itemsize, np.uint8)

    def fits(self, elements: int, itemsize: int) -> bool:
        return self.c.size >= elements and self.raw.size >= elements * itemsize


_worker = threading.local()


def _scratch(elements: int, itemsize: int) -> Scratch:
    """This thread's buffers, grown when a chunk needs more (a worker thread's die with it)."""
    scratch: Scratch | None = getattr(_worker, "scratch", None)
    if scratch is None or not scratch.fits(elements, itemsize):
        if scratch is not None:
            elements, itemsize = max(elements, scratch.c.size), max(itemsize, scratch.raw.size // scratch.c.size)
        scratch = _worker.scratch = Scratch(elements, itemsize)
    return scratch


def segment_sums(cand: TensorFile, ref: TensorFile, start: int, stop: int, chunk: int, tolerance: float,
                 vocab: int | None, top_k: int) -> ChunkSums:
    """Elements [start, stop) of a pair, `chunk` at a time (whole rows of `vocab` for logits)."""
    sums = ChunkSums()
    itemsize = max(cand.stored.itemsize, ref.stored.itemsize)
    scratch = _scratch(min(chunk, stop - start), itemsize)
    fd_c = cand.open()
    try:
        fd_r = ref.open()
        try:
            for at in range(start, stop, chunk):
                count = min(chunk, stop - at)
                c = cand.read_into(fd_c, at, count, scratch.c, scratch.raw)
                r = ref.read_into(fd_r, at, count, scratch.r, scratch.raw)
                sums.largest_read = max(sums.largest_read, count * itemsize)
                sums.add_chunk(c, r, tolerance, vocab, top_k, scratch)
        finally:
            if fd_r is not None:
                os.close(fd_r)
    finally:
        if fd_c is not None:
            os.close(fd_c)
    return sums
