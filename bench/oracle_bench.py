"""Oracle speed and memory, each measured against a baseline in the same run.

    .venv/bin/python bench/oracle_bench.py [--layers 28] [--tokens 512] [--out /tmp/team/readme-oracle.md]

(1) streaming loop detector vs a direct re-implementation of vLLM's repetition_detection rule
    (every L checked against the previous blocks after each token), at min 4 / max 20 / count 3
    and at max 256;
(2) offline judging of a 32,768-token observation, periods 1..2,048, vs a full numpy scan;
(3) dump comparison of two MindStudio Probe-layout dumps of a 28-layer Qwen3-0.6B-shaped model
    (hidden 1024, 512 tokens, bf16) vs `msprobe compare` (package mindstudio-probe, installed
    into .venv-bench by this script), each in its own process: wall time, throughput and peak
    RSS, and the first tensor each flags (cosine < 0.99).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bisect_npu.oracle.config import RepetitionConfig  # noqa: E402
from bisect_npu.oracle.repetition import find_loop, judge_repetition  # noqa: E402
from bisect_npu.probe.loop import StreamingLoopDetector  # noqa: E402

BENCH_VENV = ROOT / ".venv-bench"
INJECTED_LAYER = 17


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
    from bisect_npu.contracts import Observation

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


# ---------------------------------------------------------------- (3) dumps


def write_model_dumps(root: Path, layers: int, tokens: int, hidden: int = 1024) -> tuple[Path, Path, int]:
    """Reference and candidate dumps in MindStudio Probe's layout; the candidate's attention output at
    INJECTED_LAYER carries an error that propagates through the residual stream."""
    import torch

    rng = np.random.default_rng(0)
    noise = np.random.default_rng(1)
    total = 0
    dirs = []
    for which in ("reference", "candidate"):
        rank = root / which / "step0" / "rank0"
        data_dir = rank / "dump_tensor_data"
        data_dir.mkdir(parents=True)
        rng = np.random.default_rng(0)
        state = rng.standard_normal((1, tokens, hidden)).astype(np.float32)
        data: dict[str, dict] = {}

        def save(op: str, kind: str, array: np.ndarray, data_dir: Path = data_dir,
                 data: dict[str, dict] = data) -> None:
            nonlocal total
            tensor = torch.from_numpy(array).to(torch.bfloat16)
            data_name = f"{op}.{kind}.0.pt"
            torch.save(tensor, data_dir / data_name)
            total += tensor.numel() * 2
            entry = {"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": list(tensor.shape),
                     "Max": float(tensor.max()), "Min": float(tensor.min()), "Mean": float(tensor.float().mean()),
                     "Norm": float(tensor.float().norm()), "requires_grad": False, "data_name": data_name}
            section = "input_args" if kind == "input" else "output"
            data.setdefault(op, {"input_args": [], "input_kwargs": {}, "output": []})[section].append(entry)

        def rms(x: np.ndarray) -> np.ndarray:
            return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)

        for layer in range(layers):
            prefix = f"Module.model.layers.{layer}"
            layer_input = state
            normed = rms(state)
            save(f"{prefix}.input_layernorm.Qwen3RMSNorm.forward.0", "output", normed)
            attn = np.tanh(normed * rng.standard_normal(hidden).astype(np.float32)) * 0.5
            if which == "candidate" and layer == INJECTED_LAYER:
                attn = attn + 0.2 * noise.standard_normal(attn.shape).astype(np.float32)
            save(f"{prefix}.self_attn.Qwen3Attention.forward.0", "output", attn)
            state = state + attn
            normed = rms(state)
            save(f"{prefix}.post_attention_layernorm.Qwen3RMSNorm.forward.0", "output", normed)
            mlp = np.tanh(normed * rng.standard_normal(hidden).astype(np.float32)) * 0.5
            save(f"{prefix}.mlp.Qwen3MLP.forward.0", "output", mlp)
            state = state + mlp
            # A module's forward hook fires when it returns: the layer's entry follows its children's.
            save(f"{prefix}.Qwen3DecoderLayer.forward.0", "input", layer_input)
            save(f"{prefix}.Qwen3DecoderLayer.forward.0", "output", state)
        save("Module.model.norm.Qwen3RMSNorm.forward.0", "output", rms(state))
        (rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L0", "framework": "pytorch",
                                                    "dump_data_dir": str(data_dir), "data": data}, indent=1))
        dirs.append(root / which)
    return dirs[1], dirs[0], total


MEASURE = r"""
import json, resource, sys, time
def hwm_kib():
    # VmHWM belongs to this process image only; ru_maxrss on Linux also carries the parent's RSS at fork.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0
kind, cand, ref, out = sys.argv[1:5]
if kind == "ours":
    from bisect_npu.oracle.config import LogitsConfig
    from bisect_npu.oracle.logits import compare_dumps
    rss_after_import = hwm_kib()
    t0 = time.perf_counter()
    result = compare_dumps(cand, ref, LogitsConfig())
    first = result.first_divergent.name if result.first_divergent else None
else:
    from msprobe.msprobe import main
    rss_after_import = hwm_kib()
    sys.argv = ["msprobe", "compare", "-tp", cand, "-gp", ref, "-o", out]
    t0 = time.perf_counter()
    try:
        main()
    except SystemExit:
        pass
    first = None
seconds = time.perf_counter() - t0
peak = max(hwm_kib(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print("RESULT " + json.dumps({"seconds": seconds, "peak_kib": peak, "import_kib": rss_after_import, "first": first}))
"""


def ensure_msprobe() -> Path | None:
    """The bench venv's python with mindstudio-probe installed (torch and numpy come from .venv)."""
    python = BENCH_VENV / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import msprobe"], capture_output=True).returncode == 0:
        return python
    base = subprocess.run([sys.executable, "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                          text=True, check=True).stdout.strip()
    subprocess.run([f"{base}/bin/python3", "-m", "venv", str(BENCH_VENV)], check=True)
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    ours = subprocess.run([sys.executable, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "main-venv.pth").write_text(ours + "\n")
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "mindstudio-probe"], check=False)
    return python if done.returncode == 0 else None


def measure(python: str, kind: str, cand: Path, ref: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, "-c", MEASURE, kind, str(cand), str(ref), str(out)], capture_output=True,
                          text=True, env=env, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{kind} compare failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(line.removeprefix("RESULT "))


def msprobe_first_flagged(out: Path) -> tuple[str | None, int]:
    """First row (execution order) of msprobe's result whose cosine is below 0.99, and the row count."""
    files = sorted(out.rglob("compare_result*.csv")) + sorted(out.rglob("compare_result*.xlsx"))
    if not files:
        return None, 0
    if files[0].suffix == ".csv":
        with files[0].open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    else:
        import pandas as pd  # only present when msprobe wrote xlsx, i.e. in the bench venv's deps

        rows = pd.read_excel(files[0]).to_dict("records")
    for row in rows:
        value = row.get("Cosine")
        try:
            if float(value) < 0.99:
                return str(row.get("NPU Name")), len(rows)
        except (TypeError, ValueError):
            continue
    return None, len(rows)


def bench_dumps(lines: list[str], layers: int, tokens: int) -> None:
    lines.append(f"### (3) Dump comparison: {layers}-layer Qwen3-0.6B-shaped model, hidden 1024, {tokens} tokens, "
                 "bf16, MindStudio Probe layout")
    lines.append("")
    work = Path(tempfile.mkdtemp(prefix="oracle-bench-"))
    try:
        cand, ref, total = write_model_dumps(work, layers, tokens)
        ours = measure(sys.executable, "ours", cand, ref, work / "ours-out")
        python = ensure_msprobe()
        baseline_name = "msprobe compare"
        if python is None:
            lines.append("mindstudio-probe could not be installed here; no baseline measured.")
            return
        (work / "ms-out").mkdir()
        theirs = measure(str(python), "msprobe", cand / "step0", ref / "step0", work / "ms-out")
        theirs["first"], rows = msprobe_first_flagged(work / "ms-out")
        mib = total / 2**20
        lines.append(f"Tensor data: {mib:.0f} MiB over both dumps ({rows} rows in msprobe's result).")
        lines.append("")
        lines.append("| tool | wall | throughput | peak RSS | peak RSS above imports | first flagged tensor |")
        lines.append("|---|---|---|---|---|---|")
        for name, r in (("bisect-npu compare_dumps", ours), (baseline_name, theirs)):
            lines.append(f"| {name} | {r['seconds']:.2f} s | {mib / r['seconds']:.0f} MiB/s | "
                         f"{r['peak_kib'] / 1024:.0f} MiB | {(r['peak_kib'] - r['import_kib']) / 1024:.0f} MiB | "
                         f"{r['first']} |")
        lines.append("")
        above_ours = ours["peak_kib"] - ours["import_kib"]
        above_theirs = max(1, theirs["peak_kib"] - theirs["import_kib"])
        lines.append(f"Throughput ratio: {theirs['seconds'] / ours['seconds']:.1f}x msprobe; peak memory ratio: "
                     f"{ours['peak_kib'] / theirs['peak_kib']:.2f} of msprobe's "
                     f"({above_ours / above_theirs:.2f} above imports).")
        same = theirs["first"] is not None and theirs["first"] == ours["first"]
        lines.append(f"Same first flagged tensor: {'yes' if same else 'NO'} (injected at layer {INJECTED_LAYER}).")
        lines.append("")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures (Markdown) here")
    parser.add_argument("--skip-dumps", action="store_true")
    args = parser.parse_args()
    random.seed(0)
    lines = [f"Measured on {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}.", ""]
    bench_streaming(lines)
    bench_offline(lines)
    if not args.skip_dumps:
        bench_dumps(lines, args.layers, args.tokens)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
