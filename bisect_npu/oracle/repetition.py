"""Endless repetition: exact loops (vLLM's rule, periods up to thousands of tokens) and near-loops.

Exact loops use the rule of `bisect_npu.probe.loop` (re-exported here): period L fires at output
length n when out[j] == out[j - L] for every j in [n - need(L), n), with
need(L) = max((min_count - 1) * L, min_covered_tokens - L). `find_loop` returns the *first* firing
over a whole observation (smallest n, then smallest L), which is exactly the first hit the
streaming detector would report with max_pattern_size = offline_max_period; it then extends
`covered_tokens` to the end of that periodic stretch, which the stream cannot yet see.

Why sampling: checking every L up to 2,048 at every position is 67M comparisons for 32K tokens.
A qualifying run for L is at least need(L) >= L long, so it contains a multiple of any stride
s <= need(L). We test only those sampled positions, for a block of periods at once, drop the
candidates whose neighbours already disagree, and verify the few survivors exactly. The answer is
the same as the full scan (property-tested against a straightforward implementation).

Near-loops (a counter that changes each round: "item 1, item 2, ...") have no exact period. Two
windowed signals catch them: the *periodic share* (best L: share of positions in a window where
out[j] == out[j - L]) and the distinct n-gram ratio. Thresholds come from RepetitionConfig.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.config import RepetitionConfig
from bisect_npu.probe.loop import LoopHit, StreamingLoopDetector, needed_run

__all__ = ["LoopHit", "NearLoop", "StreamingLoopDetector", "detector_for", "find_loop", "find_near_loop",
           "judge_repetition"]

# Neighbours checked on each side of a sampled hit before exact verification.
PREFILTER_WIDTH = 8
# More surviving samples than this for one period: scan that period in full instead of verifying each.
SCAN_OVER_SURVIVORS = 4
# Elements per (samples x periods) comparison matrix, to bound memory.
MATRIX_BUDGET = 1 << 20


def detector_for(cfg: RepetitionConfig) -> StreamingLoopDetector:
    """The streaming detector the probe runs, with the recipe's thresholds."""
    return StreamingLoopDetector(cfg.min_pattern_size, cfg.max_pattern_size, cfg.min_count,
                                 min_covered_tokens=cfg.min_loop_tokens)


def _first_long_run(eq: np.ndarray, need: int) -> int:
    """Index of the first run of at least `need` True values in `eq`, or -1."""
    falses = np.flatnonzero(~eq)
    bounds = np.empty(len(falses) + 2, dtype=np.int64)
    bounds[0] = -1
    bounds[1:-1] = falses
    bounds[-1] = len(eq)
    long_runs = np.flatnonzero(np.diff(bounds) - 1 >= need)
    return -1 if len(long_runs) == 0 else int(bounds[long_runs[0]] + 1)


def _run_length_from(a: np.ndarray, start: int, period: int) -> int:
    """How many j >= start satisfy a[j] == a[j - period] in a row (chunked, doubling)."""
    n = len(a)
    j, chunk = start, 1024
    while j < n:
        stop = min(n, j + chunk)
        falses = np.flatnonzero(a[j:stop] != a[j - period:stop - period])
        if len(falses):
            return j + int(falses[0]) - start
        j, chunk = stop, chunk * 2
    return n - start


def _verify(a: np.ndarray, p: int, period: int, stride: int, need: int) -> int:
    """Run start r if the run of out[j] == out[j - period] through p is >= need long (seen from p), else -1.

    The left scan covers `stride` positions: for the first sampled position of a run that is enough.
    """
    lo = max(period, p - stride + 1)
    left = a[lo:p + 1] == a[lo - period:p + 1 - period]
    falses = np.flatnonzero(~left)
    left_len = (p - lo + 1) if len(falses) == 0 else p - lo - int(falses[-1])
    hi = min(len(a), p + need)
    right = a[p:hi] == a[p - period:hi - period]
    falses = np.flatnonzero(~right)
    right_len = len(right) if len(falses) == 0 else int(falses[0])
    if left_len + right_len - 1 >= need:
        return p - left_len + 1
    return -1


def _sampled_block(a: np.ndarray, periods: np.ndarray, needs: np.ndarray, limit: int,
                   best: tuple[int, int] | None) -> tuple[int, int] | None:
    """Earliest firing (n, L) for the periods of one block with n < limit, given the best so far."""
    stride = int(needs.min())
    first = -(-int(periods[0]) // stride) * stride
    last_j = min(len(a), limit - 1)  # a run firing before `limit` has a sample below limit - 1
    samples = np.arange(first, last_j, stride, dtype=np.int64)
    if len(samples) == 0:
        return best
    width = min(PREFILTER_WIDTH, stride // 2)
    rows_per_chunk = max(1, MATRIX_BUDGET // len(periods))
    found: dict[int, int] = {}
    for c0 in range(0, len(samples), rows_per_chunk):
        chunk = samples[c0:c0 + rows_per_chunk]
        back = chunk[:, None] - periods[None, :]
        valid = back >= 0
        eq = (a[chunk][:, None] == a[np.where(valid, back, 0)]) & valid
        rows, cols = np.nonzero(eq)
        if len(rows) == 0:
            continue
        ps, ls = chunk[rows], periods[cols]
        if width:
            offs = np.arange(1, width + 1, dtype=np.int64)
            right_idx = ps[:, None] + offs[None, :]
            right_ok = (right_idx < len(a)).all(axis=1)
            right_idx = np.minimum(right_idx, len(a) - 1)
            right_ok &= (a[right_idx] == a[right_idx - ls[:, None]]).all(axis=1)
            left_idx = ps[:, None] - offs[None, :]
            left_ok = (left_idx - ls[:, None] >= 0).all(axis=1)
            left_idx = np.maximum(left_idx, ls[:, None])
            left_ok &= (a[left_idx] == a[left_idx - ls[:, None]]).all(axis=1)
            keep = right_ok | left_ok
            ps, ls = ps[keep], ls[keep]
        if len(ps) == 0:
            continue
        order = np.lexsort((ps, ls))
        ps, ls = ps[order], ls[order]
        cuts = np.flatnonzero(np.diff(ls)) + 1
        for group_p, group_l in zip(np.split(ps, cuts), np.split(ls, cuts), strict=True):
            period = int(group_l[0])
            if period in found:
                continue
            need = int(needs[period - int(periods[0])])
            if len(group_p) > SCAN_OVER_SURVIVORS:  # near-loops: one vectorised scan beats many verifications
                stop = min(len(a), limit - 1)
                r = _first_long_run(a[period:stop] == a[:stop - period], need)
                if r >= 0:
                    found[period] = period + r + need
                continue
            for p in group_p.tolist():
                r = _verify(a, p, period, stride, need)
                if r >= 0:
                    found[period] = r + need
                    break
    for period in sorted(found):
        n = found[period]
        if n < limit and (best is None or n < best[0]):
            best, limit = (n, period), n
    return best


def first_firing(a: np.ndarray, min_period: int, max_period: int, min_count: int,
                 min_covered: int) -> tuple[int, int] | None:
    """(n, L): the smallest output length n at which the rule fires, and the smallest such L."""
    n_tokens = len(a)
    best: tuple[int, int] | None = None
    period = min_period
    while period <= max_period:
        limit = n_tokens + 1 if best is None else best[0]
        need = needed_run(period, min_count, min_covered)
        if period + need >= limit:  # period + need(period) never decreases with the period
            break
        block_end = min(max_period, 2 * period - 1)
        periods = np.arange(period, block_end + 1, dtype=np.int64)
        needs = np.maximum((min_count - 1) * periods, min_covered - periods)
        best = _sampled_block(a, periods, needs, limit, best)
        period = block_end + 1
    return best


def find_loop(tokens: list[int] | np.ndarray, cfg: RepetitionConfig, min_covered: int | None = None,
              max_period: int | None = None) -> LoopHit | None:
    """The first loop in a whole output, or None.

    A loop fires at length n with period L under the streaming rule (see module docstring), using
    periods cfg.min_pattern_size..max_period (default cfg.offline_max_period) and
    min_covered tokens (default cfg.min_loop_tokens; 0 is vLLM's rule). The hit's `start` is where
    the periodic stretch begins, `end` the length at which it first fired (as the stream would
    see it), `covered_tokens` the length of the whole periodic stretch, `count` whole repetitions.
    """
    a = np.asarray(tokens, dtype=np.int64)
    covered_min = cfg.min_loop_tokens if min_covered is None else min_covered
    top = cfg.offline_max_period if max_period is None else max_period
    fired = first_firing(a, cfg.min_pattern_size, top, cfg.min_count, covered_min)
    if fired is None:
        return None
    n, period = fired
    run_start = n - needed_run(period, cfg.min_count, covered_min)
    covered = period + _run_length_from(a, run_start, period)
    return LoopHit(start=run_start - period, period=period, count=covered // period,
                   covered_tokens=covered, end=n)


@dataclass(frozen=True)
class NearLoop:
    """Consecutive windows that look like a loop without an exact period."""

    start: int
    end: int
    period: int
    periodic_share: float
    distinct_ratio: float

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "period": self.period,
                "periodic_share": round(self.periodic_share, 4), "distinct_ratio": round(self.distinct_ratio, 4)}


def _blocked(a: np.ndarray, half: int) -> np.ndarray:
    """`a` padded to whole half-windows with distinct negative ids (they never match anything)."""
    n_blocks = max(2, -(-len(a) // half))
    padded = -np.arange(1, n_blocks * half + 1, dtype=np.int64)
    padded[:len(a)] = a
    return padded


def periodic_shares(a: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per window (length `window`, starting every window/2 tokens): the best period L <= window/2
    and the share of the window's positions j with a[j] == a[j - L].

    Returns (window starts, best periods, shares).
    """
    half = window // 2
    padded = _blocked(a, half)
    n_blocks = len(padded) // half
    counts = np.zeros((n_blocks, half + 1), dtype=np.int64)
    eq = np.zeros(len(padded), dtype=bool)
    for period in range(1, half + 1):
        eq[:period] = False
        np.equal(padded[period:], padded[:-period], out=eq[period:])
        # Bit-packing then popcount: cheaper than counting a bool matrix along an axis.
        packed = np.packbits(eq.reshape(n_blocks, half), axis=1)
        counts[:, period] = np.bitwise_count(packed).sum(axis=1, dtype=np.int64)
    per_window = counts[:-1] + counts[1:]
    best_period = per_window.argmax(axis=1)
    shares = per_window[np.arange(len(per_window)), best_period] / (2 * half)
    starts = np.arange(len(per_window), dtype=np.int64) * half
    return starts, best_period, shares


def distinct_ngram_ratios(a: np.ndarray, window: int, ngram: int) -> np.ndarray:
    """Per window (same windows as periodic_shares): distinct n-grams / n-grams starting in it."""
    half = window // 2
    padded = _blocked(a, half)
    n_keys = len(padded) - ngram + 1
    keys = np.zeros(n_keys, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(ngram):
            keys = keys * np.uint64(1000003) + padded[k:k + n_keys].astype(np.uint64)
    span = 2 * half - ngram + 1
    windows = np.lib.stride_tricks.sliding_window_view(keys, span)[::half]
    n_windows = len(padded) // half - 1
    windows = np.sort(windows[:n_windows], axis=1)
    distinct = 1 + (windows[:, 1:] != windows[:, :-1]).sum(axis=1)
    ratio: np.ndarray = distinct / span
    return ratio


def find_near_loop(tokens: list[int] | np.ndarray, cfg: RepetitionConfig) -> NearLoop | None:
    """The first stretch of >= cfg.near_min_windows consecutive windows flagged as loop-like."""
    a = np.asarray(tokens, dtype=np.int64)
    if len(a) < cfg.window:
        return None
    starts, periods, shares = periodic_shares(a, cfg.window)
    # Windows made mostly of padding (the tail) are not judged.
    judged = starts + cfg.window // 2 < len(a)
    starts, periods, shares = starts[judged], periods[judged], shares[judged]
    ratios = distinct_ngram_ratios(a, cfg.window, cfg.ngram)[judged]
    flagged = (shares >= cfg.max_periodic_share) | (ratios < cfg.min_distinct_ratio)
    run = 0
    for i, flag in enumerate(flagged.tolist()):
        run = run + 1 if flag else 0
        if run >= cfg.near_min_windows:
            first = i - run + 1
            end = i
            while end + 1 < len(flagged) and flagged[end + 1]:
                end += 1
            span = slice(first, end + 1)
            top = first + int(np.argmax(shares[span]))
            return NearLoop(start=int(starts[first]), end=int(min(len(a), starts[end] + cfg.window)),
                            period=int(periods[top]), periodic_share=float(shares[span].max()),
                            distinct_ratio=float(ratios[span].min()))
    return None


def judge_repetition(obs: Observation, cfg: RepetitionConfig) -> Verdict:
    """Bad when the output loops (exactly or nearly), or the engine itself stopped on repetition."""
    tokens = obs.output_token_ids
    figures: dict[str, Any] = {"output_tokens": len(tokens), "finish_reason": obs.finish_reason}
    engine_stop = obs.stop_reason == "repetition_detected"
    if not tokens and not engine_stop:
        return Verdict(kind=VerdictKind.SKIP, reason="observation has no output tokens to judge",
                       figures=figures)
    array = np.asarray(tokens, dtype=np.int64)
    hit = find_loop(array, cfg)
    near = None if hit is not None else find_near_loop(array, cfg)
    ran_out = obs.finish_reason == "length"
    if hit is not None:
        figures.update({f"loop_{k}": v for k, v in hit.to_dict().items()})
        figures["loop_share"] = round(hit.covered_tokens / len(tokens), 4)
    if near is not None:
        figures.update({f"near_loop_{k}": v for k, v in near.to_dict().items()})
    if engine_stop:
        figures["stop_reason"] = obs.stop_reason
    tail = "; finish_reason=length" if ran_out else ""
    if hit is not None and (ran_out or not cfg.require_length_finish):
        return Verdict(kind=VerdictKind.BAD, figures=figures,
                       reason=(f"loop from token {hit.start}: period {hit.period}, {hit.count} repetitions "
                               f"covering {hit.covered_tokens} of {len(tokens)} tokens{tail}"))
    if near is not None and (ran_out or not cfg.require_length_finish):
        return Verdict(kind=VerdictKind.BAD, figures=figures,
                       reason=(f"near-loop from token {near.start} to {near.end}: period ~{near.period}, "
                               f"periodic share {near.periodic_share:.2f}, distinct {cfg.ngram}-gram ratio "
                               f"{near.distinct_ratio:.2f}{tail}"))
    if engine_stop:
        return Verdict(kind=VerdictKind.BAD, figures=figures,
                       reason="the engine stopped the request with stop_reason=repetition_detected")
    return Verdict(kind=VerdictKind.GOOD, figures=figures,
                   reason=f"no loop in {len(tokens)} tokens (periods {cfg.min_pattern_size}.."
                          f"{cfg.offline_max_period}, >= {cfg.min_count} repetitions, >= "
                          f"{cfg.min_loop_tokens} tokens)")
