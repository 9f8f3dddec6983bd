"""Oracle speed and memory, each measured against a baseline in the same run.

    .venv/bin/python bench/oracle_bench.py [--out /tmp/team/readme-oracle.md]

(1) streaming loop detector vs a direct re-implementation of vLLM's repetition_detection rule
    (every L checked against the previous blocks after each token), at min 4 / max 20 / count 3
    and at max 256;
(2) offline judging of a 32,768-token observation, periods 1..2,048, vs a full numpy scan;
The dump comparison against `msprobe compare` lives in bench/dump_compare_bench.py.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bisect_npu.oracle.config import RepetitionConfig  # noqa: E402
from bisect_npu.oracle.repetition import find_loop, judge_repetition  # noqa: E402
from bisect_npu.probe.loop import StreamingLoopDetector  # noqa: E402


def text_like(n: int, seed: int, vocab: int = 32_000) -> np.ndarray:
    """Zipf-distributed token ids: common tokens recur the way they do in text."""
    weights = 1.0 / np.arange(1, vocab + 1) ** 1.1
    return np.random.default_rng(seed).choice(vocab, size=n, p=weights / weights.sum())


# ---------------------------------------------------------------- (1) streaming


def vllm_rule(tokens: list[int], lo: int, hi: int, count: int) -> bool:
    """vLLM's check, re-implemented: for each L, compare the last L tokens with the previous blocks."""
    n = len(tokens)
    for period in range(lo, hi + 1):
        if period * count > n:
            return False
        repeating = True
        for k in range(1, period + 1):
            target = tokens[-k]
            for m in range(1, count):
                if tokens[-(period * m + k)] != target:
                    repeating = False
                    break
            if not repeating:
                break
        if repeating:
            return True
    return False


def bench_streaming(lines: list[str]) -> None:
    tokens = text_like(4_000, seed=1).tolist()
    lines.append("### (1) Streaming loop detector, per token (4,000 text-like tokens, no loop)")
    lines.append("")
    lines.append("| rule | direct re-implementation | StreamingLoopDetector | speed-up |")
    lines.append("|---|---|---|---|")
    for lo, hi, count in ((4, 20, 3), (4, 256, 3)):
        started = time.perf_counter()
        seen: list[int] = []
        for token in tokens:
            seen.append(token)
            if vllm_rule(seen, lo, hi, count):
                raise SystemExit("text-like sequence unexpectedly loops")
        direct = (time.perf_counter() - started) / len(tokens)
        detector = StreamingLoopDetector(lo, hi, count)
        started = time.perf_counter()
        for token in tokens:
            detector.push(token)
        ours = (time.perf_counter() - started) / len(tokens)
        lines.append(f"| min {lo} / max {hi} / count {count} | {direct * 1e6:.2f} µs | {ours * 1e6:.2f} µs "
                     f"| {direct / ours:.1f}x |")
    lines.append("")


# ---------------------------------------------------------------- (2) offline


def full_scan(a: np.ndarray, hi: int, count: int, covered: int) -> tuple[int, int] | None:
    """Baseline: every period over the whole array, earliest firing (the rule with min_covered)."""
    best = None
    for period in range(1, hi + 1):
        need = max((count - 1) * period, covered - period)
        eq = a[period:] == a[:-period]
        falses = np.flatnonzero(~eq)
        bounds = np.concatenate(([-1], falses, [len(eq)]))
        long_runs = np.flatnonzero(np.diff(bounds) - 1 >= need)
        if len(long_runs):
            n = period + int(bounds[long_runs[0]]) + 1 + need
            if best is None or n < best[0]:
                best = (n, period)
    return best


def best_of(fn, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bench_offline(lines: list[str]) -> None:
    from bisect_npu.observations import Observation

    text = text_like(32_768, seed=2)
    looped = np.concatenate([text[:30_000], np.tile(text[7:20], 300)])[:32_768]
    cfg = RepetitionConfig()
    lines.append("### (2) Offline judge, 32,768 tokens, periods 1..2,048, min_count 3, min_loop_tokens 32 "
                 "(best of 5)")
    lines.append("")
    lines.append("| observation | full numpy scan | find_loop | judge_repetition (exact + near-loop) | hit |")
    lines.append("|---|---|---|---|---|")
    for name, a in (("text, no loop", text), ("loop at 30,000, period 13", looped)):
        expected = full_scan(a, 2048, cfg.min_count, cfg.min_loop_tokens)
        hit = find_loop(a, cfg)
        got = None if hit is None else (hit.end, hit.period)
        if got != expected:
            raise SystemExit(f"offline detector disagrees with the full scan: {got} vs {expected}")
        obs = Observation(output_token_ids=a.tolist(), finish_reason="length")
        scan_s = best_of(lambda a=a: full_scan(a, 2048, cfg.min_count, cfg.min_loop_tokens), repeat=2)
        find_s = best_of(lambda a=a: find_loop(a, cfg))
        judge_s = best_of(lambda obs=obs: judge_repetition(obs, cfg))
        said = "none" if hit is None else f"start {hit.start}, period {hit.period}, {hit.covered_tokens} tokens"
        lines.append(f"| {name} | {scan_s * 1e3:.1f} ms | {find_s * 1e3:.1f} ms | {judge_s * 1e3:.1f} ms | {said} |")
    lines.append("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures (Markdown) here")
    args = parser.parse_args()
    random.seed(0)
    lines = [f"Measured on {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}.", ""]
    bench_streaming(lines)
    bench_offline(lines)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
