"""Precision alignment against MindStudio Probe: detection on graded errors, then speed and memory.

    .venv/bin/python bench/dump_compare_bench.py [--msprobe .venv-msprobe/bin/msprobe] \
        [--work /tmp/dump-compare-bench] [--tokens 512] [--layers 28] [--out docs/benchmarks-precision.md]

mindstudio-probe goes in a venv of its own (it needs torch):
    python3 -m venv .venv-msprobe && .venv-msprobe/bin/pip install torch==2.13.0 mindstudio-probe==26.2.0

Dumps are generated in MindStudio Probe's layout (step0/rank0/dump.json + dump_tensor_data/*.pt),
shaped like a vLLM Qwen3-0.6B prefill: 28 decoder layers, each with its self_attn and mlp modules
(inputs and outputs [1, 512, 1024]), the final norm, and in the speed pair the lm_head logits
[1, 512, 151936]. The candidate runs the same model with a perturbation below the dtype's
precision before every rounding (what another device's kernels give), so clean pairs carry bf16
rounding noise that grows layer after layer. Errors are injected as Gaussian noise whose norm is
0.5% to 10% of the module output's, with the error propagated to the later layers or not.

Both tools run as processes on the same pairs, timed from start to exit (the verdict), with the
peak resident memory of the process tree (sampled from /proc every 20 ms). Ours is the user's
path: `python -m bisect_npu judge --recipe ... --reference ref.json cand.json --json`.
msprobe's first flagged module is the first row (execution order) whose Result is error or
warning; ours is the verdict's first divergent module.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 151_936
BLOCK = 64  # the generated model mixes hidden units in blocks of 64 (cheap, and errors spread)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


@dataclass(frozen=True)
class Case:
    name: str
    dtype: str  # "bfloat16" or "float32"
    place: str | None = None  # module whose output gets the error
    size: float = 0.0  # error norm / output norm
    propagate: bool = True
    seed: int = 1
    logits: bool = False
    submodules: bool = True


class Model:
    """A Qwen3-shaped forward pass in numpy: RMSNorm, attention and MLP stand-ins, residual stream."""

    def __init__(self, layers: int, tokens: int, hidden: int, dtype: str) -> None:
        rng = np.random.default_rng(0)
        self.layers, self.tokens, self.hidden, self.dtype = layers, tokens, hidden, dtype
        self.embedding = rng.standard_normal((1, tokens, hidden)).astype(np.float32)
        scale = np.float32(1 / np.sqrt(BLOCK))
        self.weights = [{name: (rng.standard_normal((BLOCK, BLOCK)) * scale).astype(np.float32)
                         for name in ("attn", "gate", "up", "down")} for _ in range(layers)]
        self.gains = [(1 + 0.1 * rng.standard_normal((2, hidden))).astype(np.float32) for _ in range(layers)]
        self.lm_in = (rng.standard_normal((hidden, 32)) / np.sqrt(hidden)).astype(np.float32)
        self.lm_out = (rng.standard_normal((32, VOCAB)) * 2).astype(np.float32)

    def mix(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return (x.reshape(-1, BLOCK) @ w).reshape(x.shape)

    def forward(self, case: Case | None, candidate: bool):
        """(module, inputs, outputs) in the order msprobe's forward hooks fire (a module when it returns)."""
        noise = np.random.default_rng(case.seed if case else 1)
        bf16 = self.dtype == "bfloat16"
        jitter = 2.0**-12 if bf16 else 1e-6  # another device's accumulation order, below one bf16 ulp

        def emit(x: np.ndarray) -> np.ndarray:
            if candidate:
                x = x * (1 + jitter * noise.standard_normal(x.shape).astype(np.float32))
            return round_bf16(x) if bf16 else x.astype(np.float32)

        def injected(module: str, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(dumped output, output passed on)"""
            if not candidate or case is None or case.place != module:
                return out, out
            err = noise.standard_normal(out.shape).astype(np.float32)
            err *= case.size * np.linalg.norm(out) / np.linalg.norm(err)
            bad = emit(out + err) if bf16 else out + err
            return bad, (bad if case.propagate else out)

        def rms(x: np.ndarray, gain: np.ndarray) -> np.ndarray:
            return emit(x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * gain)

        submodules = case.submodules if case else True
        state = round_bf16(self.embedding) if bf16 else self.embedding
        yield "Module.model.embed_tokens.VocabParallelEmbedding.forward.0", [], [state]
        for layer in range(self.layers):
            prefix = f"Module.model.layers.{layer}"
            w, gain = self.weights[layer], self.gains[layer]
            layer_in = state
            normed = rms(state, gain[0])
            attn_name = f"{prefix}.self_attn.Qwen3Attention.forward.0"
            attn_dump, attn = injected(attn_name, emit(np.tanh(self.mix(normed, w["attn"])) * 0.5))
            if submodules:
                yield attn_name, [normed], [attn_dump]
            state = emit(state + attn)
            normed = rms(state, gain[1])
            mlp_name = f"{prefix}.mlp.Qwen3MLP.forward.0"
            gate = self.mix(normed, w["gate"])
            hidden = gate / (1 + np.exp(-gate)) * self.mix(normed, w["up"])
            mlp_dump, mlp = injected(mlp_name, emit(self.mix(hidden, w["down"]) * 0.3))
            if submodules:
                yield mlp_name, [normed], [mlp_dump]
            state = emit(state + mlp)
            layer_name = f"{prefix}.Qwen3DecoderLayer.forward.0"
            layer_dump, state = injected(layer_name, state)
            yield layer_name, [layer_in], [layer_dump]
        norm_name = "Module.model.norm.Qwen3RMSNorm.forward.0"
        final = rms(state, np.float32(1))
        yield norm_name, [state], [final]
        if case is not None and case.logits:
            logits = emit((final.reshape(-1, self.hidden) @ self.lm_in @ self.lm_out).reshape(1, self.tokens, VOCAB))
            name = "Module.lm_head.ParallelLMHead.forward.0"
            yield name, [final], [injected(name, logits)[0]]


def write_msprobe_dump(root: Path, model: Model, case: Case | None, candidate: bool) -> int:
    """Write one side's dump; returns the bytes of tensor data."""
    import torch

    dtype = torch.bfloat16 if model.dtype == "bfloat16" else torch.float32
    rank = root / "step0" / "rank0"
    data_dir = rank / "dump_tensor_data"
    data_dir.mkdir(parents=True)
    data: dict[str, dict] = {}
    total = 0
    for module, inputs, outputs in model.forward(case, candidate):
        entry: dict[str, list] = {"input_args": [], "input_kwargs": {}, "output": []}  # type: ignore[dict-item]
        for section, arrays, kind in (("input_args", inputs, "input"), ("output", outputs, "output")):
            for i, array in enumerate(arrays):
                tensor = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
                data_name = f"{module}.{kind}.{i}.pt"
                torch.save(tensor, data_dir / data_name)
                total += tensor.numel() * tensor.element_size()
                wide = tensor.float()
                entry[section].append({"type": "torch.Tensor", "dtype": str(tensor.dtype), "shape": list(tensor.shape),
                                       "Max": float(wide.max()), "Min": float(wide.min()),
                                       "Mean": float(wide.mean()), "Norm": float(wide.norm()),
                                       "requires_grad": False, "data_name": data_name})
        data[module] = entry
    (rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L0", "framework": "pytorch",
                                                "dump_data_dir": str(data_dir), "data": data}), encoding="utf-8")
    return total


# ---------------------------------------------------------------- running the tools


def tree_rss_kib(pid: int) -> int:
    """Resident memory of a process and its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/status", encoding="ascii") as handle:
                total += next((int(line.split()[1]) for line in handle if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as handle:
                    todo.extend(int(child) for child in handle.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_measured(argv: list[str], cwd: Path, pythonpath: Path = ROOT) -> tuple[float, int, float, str]:
    """(wall seconds from start to exit, peak tree RSS in KiB, CPU seconds of the tree, stdout)."""
    started = time.perf_counter()
    out_path = cwd / "stdout.txt"
    with out_path.open("w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(pythonpath)})
        peak = 0
        while True:  # wait4, not poll: its rusage holds the CPU time of the child and what it reaped
            pid, _, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, tree_rss_kib(proc.pid))
            time.sleep(0.02)
        proc.returncode = 0
    seconds = time.perf_counter() - started
    return seconds, peak, usage.ru_utime + usage.ru_stime, out_path.read_text(errors="replace")


RECIPE = """name: dump-compare-bench
model: {{path: /models/Qwen3-0.6B}}
cases:
  - id: prefill
    prompt: hello
oracle:
  kinds: [logits]
"""


def run_ours(cand: Path, ref: Path, work: Path, code: Path = ROOT) -> tuple[float, int, float, str | None, str | None]:
    work.mkdir(parents=True, exist_ok=True)
    recipe = work / "recipe.yaml"
    recipe.write_text(RECIPE.format(), encoding="utf-8")
    for name, dump in (("cand.json", cand), ("ref.json", ref)):
        (work / name).write_text(json.dumps({"logits_dump": str(dump)}), encoding="utf-8")
    argv = [sys.executable, "-m", "bisect_npu", "judge", "--recipe", str(recipe), "--reference",
            str(work / "ref.json"), str(work / "cand.json"), "--json"]
    seconds, peak, cpu, stdout = run_measured(argv, work, code)
    start = stdout.find("{")
    if start < 0:
        raise SystemExit(f"bisect-npu judge gave no verdict:\n{stdout[-3000:]}")
    verdict = json.loads(stdout[start:])
    first = verdict["figures"].get("first_divergent")
    if first is None:
        return seconds, peak, cpu, None, None
    return seconds, peak, cpu, first.get("module") or module_of(first["name"]), first.get("rule")


def module_of(tensor_name: str) -> str:
    for marker in (".input.", ".output.", ".parameters.", ".input_kwargs."):
        if marker in tensor_name:
            return tensor_name.split(marker)[0]
    return tensor_name


def run_msprobe(msprobe: Path, cand: Path, ref: Path, work: Path) -> tuple[float, int, float, str | None, str | None]:
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out"
    argv = [str(msprobe), "compare", "-tp", str(cand / "step0"), "-gp", str(ref / "step0"), "-o", str(out)]
    seconds, peak, cpu, stdout = run_measured(argv, work)
    results = sorted(out.rglob("compare_result*.csv"))
    if not results:
        raise SystemExit(f"msprobe compare wrote no result:\n{stdout[-3000:]}")
    with results[0].open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row.get("Result") in ("error", "warning"):
                return seconds, peak, cpu, module_of(row["NPU Name"]), row.get("Err_message")
    return seconds, peak, cpu, None, None


# ---------------------------------------------------------------- the bench


def short(module: str | None) -> str:
    if module is None:
        return "-"
    return module.removeprefix("Module.").removeprefix("model.").rsplit(".forward.", 1)[0]


def detection_cases(layers: int) -> list[Case]:
    places = {"attn": "Module.model.layers.0.self_attn.Qwen3Attention.forward.0",
              "mlp": f"Module.model.layers.{min(20, layers - 1)}.mlp.Qwen3MLP.forward.0"}
    cases = [Case("clean bf16 #1", "bfloat16", seed=11), Case("clean bf16 #2", "bfloat16", seed=12),
             Case("clean fp32", "float32", seed=13)]
    for where in ("attn", "mlp"):
        for propagate in (False, True):
            for size in (0.005, 0.01, 0.02, 0.05, 0.10):
                cases.append(Case(f"bf16 {where} {size:.1%} {'prop' if propagate else 'local'}", "bfloat16",
                                  places[where], size, propagate, seed=20))
    for size in (0.005, 0.01, 0.02, 0.05):
        cases.append(Case(f"fp32 mlp {size:.1%} prop", "float32", places["mlp"], size, True, seed=30))
    return cases


def machine() -> str:
    """CPU model, cores and memory, from /proc."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), 0)
    return f"{os.cpu_count()} cores of {cpu}, {kib / 2**20:.0f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--msprobe", type=Path, default=ROOT / ".venv-msprobe" / "bin" / "msprobe")
    parser.add_argument("--work", type=Path, default=Path("/tmp/dump-compare-bench"))
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tokens", type=int, default=512, help="tokens of the speed pair")
    parser.add_argument("--detection-tokens", type=int, default=128,
                        help="tokens of the detection pairs (msprobe takes ~1 minute per 512-token pair here)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--only", choices=["detection", "speed"], default=None)
    parser.add_argument("--cases", default="", help="only the detection pairs whose name contains this")
    parser.add_argument("--previous", type=Path, default=None,
                        help="a directory holding a previous bisect_npu package, measured on the speed pair too "
                             "(e.g. git archive 21bcfa8 bisect_npu | tar -x -C /tmp/previous)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="speed: run the tools this many times in turn on the same pair (the median ratio "
                             "is the figure; one run on a shared machine is not)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures (Markdown) here")
    args = parser.parse_args()
    args.msprobe = args.msprobe.absolute()  # it runs in the work directory
    if not args.msprobe.exists():
        raise SystemExit(f"{args.msprobe} not found: install mindstudio-probe into .venv-msprobe (see --help)")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    lines = [f"Measured {date.today().isoformat()} on {machine()}, Python {sys.version.split()[0]}, "
             "mindstudio-probe 26.2.0 (default rules), both tools as processes in turn on the same pairs. "
             "Reproduce with `.venv/bin/python bench/dump_compare_bench.py`.", ""]
    try:
        if args.only != "speed":
            detection(args, lines)
        if args.only != "detection":
            speed(args, lines)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


def detection(args: argparse.Namespace, lines: list[str]) -> None:
    tokens = args.detection_tokens
    models = {dtype: Model(args.layers, tokens, args.hidden, dtype) for dtype in ("bfloat16", "float32")}
    refs: dict[str, Path] = {}
    lines += [f"### Detection: {args.layers} decoder layers with self_attn and mlp, inputs and outputs "
              f"[1, {tokens}, {args.hidden}]", "",
              "| pair | injected at | msprobe's first flagged module | ours | our rule | same |",
              "|---|---|---|---|---|---|"]
    clean_fp = {"msprobe": 0, "ours": 0, "pairs": 0}
    missed_by_msprobe: list[str] = []
    agree = flagged_by_msprobe = 0
    for case in detection_cases(args.layers):
        if args.cases not in case.name:
            continue
        if case.dtype not in refs:
            refs[case.dtype] = args.work / f"ref-{case.dtype}"
            write_msprobe_dump(refs[case.dtype], models[case.dtype], None, candidate=False)
        cand = args.work / "cand"
        shutil.rmtree(cand, ignore_errors=True)
        write_msprobe_dump(cand, models[case.dtype], case, candidate=True)
        theirs = run_msprobe(args.msprobe, cand, refs[case.dtype], args.work / "ms")[3]
        _, _, _, ours, rule = run_ours(cand, refs[case.dtype], args.work / "ours")
        shutil.rmtree(args.work / "ms", ignore_errors=True)
        if case.place is None:
            clean_fp["pairs"] += 1
            clean_fp["msprobe"] += theirs is not None
            clean_fp["ours"] += ours is not None
        else:
            if theirs is not None:
                flagged_by_msprobe += 1
                agree += theirs == ours
            elif ours == case.place:
                missed_by_msprobe.append(case.name)
        same = "-" if theirs is None else ("yes" if theirs == ours else "NO")
        lines.append(f"| {case.name} | {short(case.place)} | {short(theirs)} | {short(ours)} | {rule or '-'} "
                     f"| {same} |")
        print(lines[-1], flush=True)
    lines += ["", f"Same first module on {agree} of the {flagged_by_msprobe} injected pairs msprobe flags. "
              f"False positives on the {clean_fp['pairs']} clean pairs: msprobe {clean_fp['msprobe']}, "
              f"ours {clean_fp['ours']}. "
              f"Caught by ours at the injected module, missed by msprobe: "
              f"{', '.join(missed_by_msprobe) or 'none'}.", ""]


def speed(args: argparse.Namespace, lines: list[str]) -> None:
    model = Model(args.layers, args.tokens, args.hidden, "bfloat16")
    place = f"Module.model.layers.{args.layers // 2}.Qwen3DecoderLayer.forward.0"
    case = Case("speed", "bfloat16", place, 0.05, propagate=False, seed=40, logits=True, submodules=False)
    ref, cand = args.work / "speed-ref", args.work / "speed-cand"
    total = write_msprobe_dump(ref, model, case, candidate=False)
    total += write_msprobe_dump(cand, model, case, candidate=True)
    mb = total / 1e6
    runs: list[tuple[str, tuple[float, int, float, str | None, str | None]]] = []
    ratios: list[tuple[float, float, float]] = []  # (wall ratio, CPU ratio, load average) per round
    peaks: list[tuple[int, int]] = []  # (msprobe's, ours) per round
    for round_ in range(1, args.repeat + 1):
        label = f" (run {round_})" if args.repeat > 1 else ""
        theirs = run_msprobe(args.msprobe, cand, ref, args.work / "speed-ms")
        shutil.rmtree(args.work / "speed-ms", ignore_errors=True)
        runs.append((f"msprobe compare{label}", theirs))
        if args.previous:
            runs.append((f"bisect-npu judge, previous{label}",
                         run_ours(cand, ref, args.work / "speed-previous", args.previous)))
        ours = run_ours(cand, ref, args.work / "speed-ours")
        runs.append((f"bisect-npu judge{label}", ours))
        ratios.append((theirs[0] / ours[0], theirs[2] / ours[2], os.getloadavg()[0]))
        peaks.append((theirs[1], ours[1]))
    lines += [f"### End to end on the real-shaped pair: {args.layers} decoder layers' inputs and outputs "
              f"[1, {args.tokens}, {args.hidden}] and the lm_head logits [1, {args.tokens}, {VOCAB}], bf16, "
              f"{mb:.0f} MB over both sides; 5% error at {short(place)}'s output, not propagated", "",
              f"Load average (1 minute) after each run: {', '.join(f'{load:.1f}' for _, _, load in ratios)} "
              f"on {os.cpu_count()} cores.", "",
              "| tool | wall, start to verdict | throughput | CPU time (process tree) | peak RSS (process tree) "
              "| first flagged module |",
              "|---|---|---|---|---|---|"]
    for name, (seconds, peak, cpu, first, _) in runs:
        lines.append(f"| {name} | {seconds:.2f} s | {mb / seconds:.0f} MB/s | {cpu:.1f} s | {peak / 1024:.0f} MiB "
                     f"| {short(first)} |")
    walls, cpus = sorted(r[0] for r in ratios), sorted(r[1] for r in ratios)
    ours_peak, theirs_peak = max(peak for _, peak in peaks), max(peak for peak, _ in peaks)
    each = f" (runs: {', '.join(f'{r[0]:.1f}x' for r in ratios)})" if len(ratios) > 1 else ""
    lines += ["", f"Ours: {walls[len(walls) // 2]:.1f}x msprobe's throughput end to end, median of {len(ratios)} "
              f"run{'s' if len(ratios) > 1 else ''}{each}; {cpus[len(cpus) // 2]:.1f}x in CPU time; "
              f"{ours_peak / theirs_peak:.2f} of its peak memory.", ""]


if __name__ == "__main__":
    main()
