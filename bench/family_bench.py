"""The dump rules on model families they were not tuned on: leave one family out, beside msprobe compare.

    .venv/bin/python bench/family_bench.py [--work /tmp/family-bench] [--only FAMILY,...] [--no-msprobe]

Families are made here (HF transformers on the CPU, random init, 2-D weights x2.5 for a trained
model's activation sizes, then every weight rounded to bf16: a published checkpoint), each an
architecture, a size, a logit scale (the final norm's weight scaled: peaked logits) and a seed.
Each side is one prefill dumped by MindStudio Probe's `PrecisionDebugger` (task tensor, L0: every
decoder layer, attention, MLP, RMSNorm and the logits, inputs and outputs).

Clean pairs: a bf16 and an fp16 candidate against the fp32 golden (precision), bf16 eager against
bf16 SDPA attention (kernel), one thread against two. Faults, in a bf16 eager candidate against
the fp32 golden: in attention (one KV head's values zeroed; its output x1.05), a norm (the
post-attention RMSNorm's weight x1.1) and the MLP (tanh-GELU for SiLU); and one below what bf16
can show (the MLP's output x1.0005, a sixteenth of a bf16 ulp), listed apart with its size.

Leave one family out: for each family, the rules' spread settings (`peer_mads`,
`peer_min_factor`) are chosen on the other families' pairs (no false alarm first, then the most
faults named), and that family's pairs are judged with them: the report is the held-out
families'. Each tool judges each held-out pair in a process of its own, timed from start to exit,
with its peak resident memory (os.wait4): this tree's rules with the settings chosen, the rules of
git `BASELINE_COMMIT` (before the precision-aware noise) with their defaults, and `msprobe
compare`. A fault is named when the first flagged module is the one it sits in. MoE families
(a router in bf16 against fp32, routing weights downcast, expert faults) are one more entry of
`FAMILIES` with their own `build` and `FAULTS` entries.
"""

from __future__ import annotations

import argparse
import copy
import csv
import functools
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASELINE_COMMIT = "16d205c"
GRID = [(mads, factor) for mads in (6.0, 8.0, 12.0) for factor in (2.0, 3.0, 5.0)]
LAUNCHER = ("import os, subprocess, sys\n"
            "child = subprocess.Popen(sys.argv[2:])\n"
            "_, status, usage = os.wait4(child.pid, 0)\n"
            "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
            "sys.exit(os.waitstatus_to_exitcode(status))\n")
DUMPED = ["DecoderLayer", "Attention", "MLP", "RMSNorm", "lm_head"]


@dataclass(frozen=True)
class Family:
    name: str
    arch: str  # transformers' prefix: Qwen3, Llama
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    tokens: int
    logit_scale: float
    seed: int
    vocab: int = 2048
    head_dim: int = 32


FAMILIES = [
    Family("qwen3-s-flat", "Qwen3", 6, 128, 4, 2, 384, 48, 1.0, 10),
    Family("qwen3-m-peaked", "Qwen3", 8, 192, 6, 2, 512, 64, 4.0, 11),
    Family("llama-s-peaked", "Llama", 6, 160, 5, 1, 448, 56, 4.0, 12),
    Family("llama-m-flat", "Llama", 8, 256, 8, 4, 640, 64, 1.0, 13),
]

GOLDEN = ("float32", "sdpa", 2)
CLEAN = {"precision-bf16": (("bfloat16", "sdpa", 2), GOLDEN), "precision-fp16": (("float16", "sdpa", 2), GOLDEN),
         "kernel": (("bfloat16", "eager", 2), ("bfloat16", "sdpa", 2)),
         "threads": (("bfloat16", "sdpa", 1), ("bfloat16", "sdpa", 2))}
FAULT_SIDE = ("bfloat16", "eager", 2)
# name: (module part the fault sits in, relative size, whether bf16 can show it)
FAULTS = {"kv_head": ("self_attn", None, True), "attn_gain": ("self_attn", 0.05, True),
          "norm_gain": ("post_attention_layernorm", 0.1, True), "activation": ("mlp", None, True),
          "mlp_gain_tiny": ("mlp", 0.0005, False)}


@dataclass(frozen=True)
class Pair:
    family: Family
    name: str
    candidate: tuple[str, str, int]
    reference: tuple[str, str, int]
    fault: str | None = None

    @property
    def layer(self) -> int:
        return self.family.layers // 2

    @property
    def faulty_module(self) -> str | None:
        return None if self.fault is None else f"model.layers.{self.layer}.{FAULTS[self.fault][0]}"


def pairs(family: Family) -> list[Pair]:
    out = [Pair(family, name, cand, ref) for name, (cand, ref) in CLEAN.items()]
    out += [Pair(family, fault, FAULT_SIDE, GOLDEN, fault) for fault in FAULTS]
    return out


def build(family: Family, dtype: str, attn: str) -> Any:
    import torch
    import transformers

    config = getattr(transformers, f"{family.arch}Config")(
        vocab_size=family.vocab, hidden_size=family.hidden, intermediate_size=family.intermediate,
        num_hidden_layers=family.layers, num_attention_heads=family.heads, num_key_value_heads=family.kv_heads,
        head_dim=family.head_dim, tie_word_embeddings=True, max_position_embeddings=1024)
    torch.manual_seed(family.seed)
    model = getattr(transformers, f"{family.arch}ForCausalLM")(copy.deepcopy(config)).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(2.5)
        model.model.norm.weight.mul_(family.logit_scale)
        for param in model.parameters():  # a published checkpoint: bf16 weights
            param.copy_(param.to(torch.bfloat16).float())
    model.set_attn_implementation(attn)
    return model.to(getattr(torch, dtype))


def _wrap(module: Any, change: Callable[..., Any]) -> None:
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return change(original(*args, **kwargs))

    module.forward = forward


def inject(model: Any, fault: str, layer: int) -> None:
    import torch

    block = model.model.layers[layer]
    if fault == "kv_head":
        with torch.no_grad():
            block.self_attn.v_proj.weight[: block.self_attn.head_dim].zero_()
    elif fault == "attn_gain":
        _wrap(block.self_attn, lambda out: (out[0] * 1.05, *out[1:]))
    elif fault == "norm_gain":
        with torch.no_grad():
            block.post_attention_layernorm.weight.mul_(1.1)
    elif fault == "activation":
        block.mlp.act_fn = torch.nn.GELU(approximate="tanh")
    elif fault == "mlp_gain_tiny":
        _wrap(block.mlp, lambda out: out * 1.0005)
    else:
        raise ValueError(f"unknown fault {fault!r}")


@contextmanager
def _threads(count: int) -> Any:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def side_dump(work: Path, family: Family, side: tuple[str, str, int], fault: str | None, layer: int) -> Path:
    """One prefill of the family at `side` (dtype, attention, threads), with `fault`, dumped once into work."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    dtype, attn, threads = side
    out = work / "dumps" / f"{family.name}-{dtype}-{attn}-t{threads}" if fault is None else \
        work / "dumps" / f"{family.name}-{dtype}-{attn}-t{threads}-{fault}"
    if (out / "step0").is_dir():
        return out / "step0"
    model = build(family, dtype, attn)
    if fault is not None:
        inject(model, fault, layer)
    tokens = torch.randint(0, family.vocab, (1, family.tokens), generator=torch.Generator().manual_seed(family.seed))
    out.mkdir(parents=True, exist_ok=True)
    config = out / "msprobe_config.json"
    config.write_text(json.dumps({"task": "tensor", "dump_path": str(out), "rank": [], "step": [], "level": "L0",
                                  "tensor": {"scope": [], "list": DUMPED, "data_mode": ["all"]}}), encoding="utf-8")
    PrecisionDebugger._instance = None
    debugger = PrecisionDebugger(config_path=str(config))
    with _threads(threads), torch.no_grad():
        debugger.start(model)
        model(tokens)
        debugger.stop()
        debugger.step()
    return out / "step0"


def make_pair(work: Path, pair: Pair) -> tuple[Path, Path]:
    return (side_dump(work, pair.family, pair.candidate, pair.fault, pair.layer),
            side_dump(work, pair.family, pair.reference, None, pair.layer))


@functools.cache
def first_module(cand: Path, ref: Path, mads: float, factor: float) -> str | None:
    from bisect_npu.oracle.config import LogitsConfig
    from bisect_npu.oracle.dumps.compare import compare_dumps

    first = compare_dumps(cand, ref, LogitsConfig(peer_mads=mads, peer_min_factor=factor)).first_divergent
    return first.module if first is not None else None


def named(flagged: str | None, pair: Pair) -> bool:
    return flagged is not None and pair.faulty_module is not None and f".{pair.faulty_module}." in flagged


def score(results: list[tuple[Pair, str | None]]) -> tuple[int, int]:
    """(false alarms, above-noise faults named)."""
    false = sum(pair.fault is None and flagged is not None for pair, flagged in results)
    hits = sum(pair.fault is not None and FAULTS[pair.fault][2] and named(flagged, pair) for pair, flagged in results)
    return false, hits


def choose(tune: list[tuple[Pair, Path, Path]]) -> tuple[float, float]:
    """The grid's setting with the fewest false alarms and then the most faults named on the tune pairs; among
    settings tied on both, the widest (a held-out family's noise may spread wider than the tuned ones')."""
    scored = []
    for mads, factor in GRID:
        false, hits = score([(pair, first_module(cand, ref, mads, factor)) for pair, cand, ref in tune])
        scored.append(((false, -hits, -mads, -factor), (mads, factor)))
    return min(scored)[1]


def judge_once(cand: str, ref: str, mads: str, factor: str) -> None:
    print(json.dumps({"module": first_module(Path(cand), Path(ref), float(mads), float(factor))}))


def _msprobe_first(out: Path) -> str | None:
    for path in sorted(out.glob("compare_result_*.csv")):
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row["Result"].strip().lower() in ("error", "warning"):
                    return row["NPU Name"]
    return None


def run_tool(tool: str, pair: Pair, cand: Path, ref: Path, work: Path, setting: tuple[float, float],
             msprobe: str) -> tuple[str | None, float, int]:
    """(first flagged module, seconds, peak RSS bytes) of one tool on one pair, in a process of its own."""
    out = work / f"msprobe-out-{time.monotonic_ns()}"
    env = dict(os.environ)
    if tool == "msprobe":
        command = [msprobe, "compare", "-tp", str(cand), "-gp", str(ref), "-o", str(out)]
    else:
        command = [sys.executable, __file__, "--judge-once", str(cand), str(ref), *map(str, setting)]
        if tool == "before":
            env["PYTHONPATH"] = str(work / "baseline")
            command = [sys.executable, str(work / "baseline" / "judge_before.py"), str(cand), str(ref)]
    # A child forked from this process would inherit its peak RSS (the models built here): a small launcher
    # starts the tool and reports the tool's own peak.
    peak_file = work / f"peak-{time.monotonic_ns()}"
    launcher = [sys.executable, "-S", "-c", LAUNCHER, str(peak_file), *command]
    started = time.perf_counter()
    done = subprocess.run(launcher, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{tool} failed on {pair.family.name}/{pair.name} (status {done.returncode}); run it by hand")
    flagged = _msprobe_first(out) if tool == "msprobe" else json.loads(done.stdout.strip().splitlines()[-1])["module"]
    return flagged, seconds, int(peak_file.read_text()) * 1024


def baseline_tree(work: Path) -> None:
    """git BASELINE_COMMIT's bisect_npu under work/baseline, and a script that judges one pair with it."""
    target = work / "baseline"
    if (target / "judge_before.py").exists():
        return
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE_COMMIT, "bisect_npu"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    (target / "judge_before.py").write_text(
        "import json, sys\nfrom bisect_npu.oracle.config import LogitsConfig\n"
        "from bisect_npu.oracle.dumps.compare import compare_dumps\n"
        "first = compare_dumps(sys.argv[1], sys.argv[2], LogitsConfig()).first_divergent\n"
        "print(json.dumps({'module': first.module if first is not None else None}))\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/family-bench"))
    parser.add_argument("--only", default="", help="held-out families to report (commas; default all)")
    parser.add_argument("--msprobe", default=str(Path(sys.executable).parent / "msprobe"))
    parser.add_argument("--no-msprobe", action="store_true")
    parser.add_argument("--judge-once", nargs=4, metavar=("CAND", "REF", "MADS", "FACTOR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.judge_once:
        judge_once(*args.judge_once)
        return
    os.environ.setdefault("MSPROBE_LOG_LEVEL", "3")
    args.work.mkdir(parents=True, exist_ok=True)
    baseline_tree(args.work)
    tools = ["this tree", "before"] + ([] if args.no_msprobe else ["msprobe"])
    dumps = {family.name: [(pair, *make_pair(args.work, pair)) for pair in pairs(family)] for family in FAMILIES}
    held_out = [family for family in FAMILIES if not args.only or family.name in args.only.split(",")]
    totals = {tool: {"false": 0, "clean": 0, "named": 0, "faults": 0, "seconds": 0.0, "peak": 0} for tool in tools}
    below: list[str] = []
    print(f"family bench, {date.today()}, {platform.machine()}, load {os.getloadavg()[0]:.1f}")
    print("| held-out family | setting chosen on the others | pair | fault at | " + " | ".join(tools) + " |")
    print("|---|---|---|---|" + "---|" * len(tools))
    for family in held_out:
        tune = [item for other in FAMILIES if other is not family for item in dumps[other.name]]
        setting = choose(tune)
        for pair, cand, ref in dumps[family.name]:
            cells = []
            for tool in tools:
                flagged, seconds, peak = run_tool(tool, pair, cand, ref, args.work, setting, args.msprobe)
                total = totals[tool]
                total["seconds"] += seconds
                total["peak"] = max(total["peak"], peak)
                if pair.fault is None:
                    total["clean"] += 1
                    total["false"] += flagged is not None
                    cells.append("false alarm" if flagged is not None else "clean")
                elif FAULTS[pair.fault][2]:
                    total["faults"] += 1
                    total["named"] += named(flagged, pair)
                    cells.append("named" if named(flagged, pair) else f"missed ({flagged or 'nothing flagged'})")
                else:
                    cells.append(f"below bf16 ({'flagged' if flagged else 'not flagged'})")
                    if tool == "this tree":
                        below.append(f"{family.name}/{pair.name}: x{1 + (FAULTS[pair.fault][1] or 0):g} at "
                                     f"{pair.faulty_module}, {'flagged' if flagged else 'not flagged'}")
            where = pair.faulty_module or "-"
            print(f"| {family.name} | peer_mads {setting[0]:g}, peer_min_factor {setting[1]:g} | {pair.name} | "
                  f"{where} | " + " | ".join(cells) + " |", flush=True)
    print()
    print("| tool | false alarms (clean pairs) | above-noise faults named | seconds (all pairs) | peak RSS |")
    print("|---|---|---|---|---|")
    for tool, total in totals.items():
        print(f"| {tool} | {total['false']}/{total['clean']} | {total['named']}/{total['faults']} | "
              f"{total['seconds']:.1f} | {total['peak'] / 2**20:.0f} MiB |")
    print("\nbelow bf16's resolution (the candidate's precision cannot show them):")
    for line in below:
        print(f"- {line}")


if __name__ == "__main__":
    main()
