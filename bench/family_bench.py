"""The dump rules on model families they were not tuned on: leave one family out, beside msprobe compare.

    .venv/bin/python bench/family_bench.py [--work /tmp/family-bench] [--only FAMILY,...] [--no-msprobe] [--full]

Families are made here (HF transformers on the CPU, random init, 2-D weights x2.5 for a trained
model's activation sizes, then every weight rounded to bf16: a published checkpoint), each an
architecture, a size, a logit scale (the final norm's weight scaled: peaked logits) and a seed.
Each side is one prefill dumped by MindStudio Probe's `PrecisionDebugger` (task tensor, L0: every
decoder layer, attention, MLP, RMSNorm and the logits, inputs and outputs; for MoE families the
MoE block, its router, with its logits, routing weights and the chosen expert ids as an integer
tensor, and its experts too).

Clean pairs: a bf16 and an fp16 candidate against the fp32 golden (precision), bf16 eager against
bf16 SDPA attention (kernel), one thread against two. Faults, in a bf16 eager candidate against
the fp32 golden: in attention (one KV head's values zeroed; its output x1.05), a norm (the
post-attention RMSNorm's weight x1.1) and the MLP (tanh-GELU for SiLU); and one below what bf16
can show (the MLP's output x1.0005, a sixteenth of a bf16 ulp), listed apart with its size.

MoE families (`MoeFamily`: tests/helpers/tiny_moe.py's Qwen3-MoE, softmax top-k with and
without `norm_topk_prob`, and DeepSeek-V3, sigmoid grouped top-k with a correction bias and
shared experts, its router saturated or "peaked" off its plateau): the same pairs, the MLP fault
at the dense first layer, and more. Clean: a bf16 model routing in fp32 against the golden.
Faults: the experts' down projection perturbed (30% of its rms) and the router's weights (5%);
the router in bf16 where the reference, the same bf16 model, routes in fp32 (a router
precision regression, named at any `mlp.gate`), counted where the router is peaked enough that
bf16 moves its choices (`bf16_router_shows`), else listed apart with the flips it made; the
routing weights downcast from fp32 to bf16 before the experts (listed apart: at most 2^-9 of
each weight, below what a bf16 output resolves).

Leave one family out: for each family, the rules' spread settings (`peer_mads`,
`peer_min_factor`) are chosen on the other families' pairs, dense and MoE (no false alarm first,
then the most faults named), and that family's pairs are judged with them: the report is the
held-out families'. Each tool judges each held-out pair in a process of its own, timed from start
to exit, with its peak resident memory (os.wait4): this tree's rules with the settings chosen,
the rules of git `BASELINE_COMMIT` (before the precision-aware noise) with their defaults, and
`msprobe compare` (by default on each family's `MSPROBE_PAIRS`, about a minute a pair here; `--full`
every pair; its verdicts are kept in the work folder). A fault is named when the
first flagged module is the one it sits in.
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
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.msprobe_dump import DENSE_MODULES, MOE_MODULES, msprobe_dump  # noqa: E402
from tests.helpers.tiny_moe import MoeSpec, build_model, tokens  # noqa: E402

BASELINE_COMMIT = "16d205c"
GRID = [(mads, factor) for mads in (6.0, 8.0, 12.0) for factor in (2.0, 3.0, 5.0)]
LAUNCHER = ("import os, subprocess, sys\n"
            "child = subprocess.Popen(sys.argv[2:])\n"
            "_, status, usage = os.wait4(child.pid, 0)\n"
            "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
            "sys.exit(os.waitstatus_to_exitcode(status))\n")


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


@dataclass(frozen=True)
class MoeFamily:
    """An MoE family: tests/helpers/tiny_moe.py's model of `spec` (layer 0 dense, the rest MoE), its final
    norm scaled by `logit_scale`; `bf16_router_shows` where its router is peaked enough that a bf16 gate moves
    clearly more choices than rounding elsewhere does (else the router precision pair is listed apart)."""

    name: str
    spec: MoeSpec
    logit_scale: float
    bf16_router_shows: bool
    tokens: int = 128

    @property
    def layers(self) -> int:
        return self.spec.layers

    @property
    def seed(self) -> int:
        return self.spec.seed


DENSE_FAMILIES: list[Family | MoeFamily] = [
    Family("qwen3-s-flat", "Qwen3", 6, 128, 4, 2, 384, 48, 1.0, 10),
    Family("qwen3-m-peaked", "Qwen3", 8, 192, 6, 2, 512, 64, 4.0, 11),
    Family("llama-s-peaked", "Llama", 6, 160, 5, 1, 448, 56, 4.0, 12),
    Family("llama-m-flat", "Llama", 8, 256, 8, 4, 640, 64, 1.0, 13),
]
# Seeds 40-43 and these widths and depths: in no other bench, and not where the routing rule was tuned
# (bench/moe_family_bench.py's seeds 0-2 at width 128).
MOE_FAMILIES: list[Family | MoeFamily] = [
    MoeFamily("qwen3moe-s-flat", MoeSpec("qwen3_moe", hidden=128, layers=6, norm_topk_prob=True, router_offset=20.0,
                                         seed=40), 1.0, True),
    MoeFamily("qwen3moe-nonorm-m-peaked", MoeSpec("qwen3_moe", hidden=160, layers=5, norm_topk_prob=False,
                                                  router_offset=20.0, seed=41), 4.0, True),
    MoeFamily("deepseekv3-s-peaked", MoeSpec("deepseek_v3", hidden=128, layers=5, norm_topk_prob=True,
                                             router_offset=20.0, seed=42), 4.0, False),
    MoeFamily("deepseekv3-nonorm-m-peakedrouter", MoeSpec("deepseek_v3", hidden=160, layers=6, norm_topk_prob=False,
                                                          router_offset=4.0, router_scale=0.1, bias_scale=0.1,
                                                          seed=43), 1.0, True),
]
FAMILIES = DENSE_FAMILIES + MOE_FAMILIES

# A side: (dtype, attention, threads) and, for an MoE model, how its router runs: "model" (its own), "fp32"
# (logits in fp32, weights handed on in bf16), "fp32w" (fp32 logits and weights), "bf16" (logits in bf16).
Side = tuple[str, str, int] | tuple[str, str, int, str]
GOLDEN: Side = ("float32", "sdpa", 2)
CLEAN: dict[str, tuple[Side, Side]] = {
    "precision-bf16": (("bfloat16", "sdpa", 2), GOLDEN), "precision-fp16": (("float16", "sdpa", 2), GOLDEN),
    "kernel": (("bfloat16", "eager", 2), ("bfloat16", "sdpa", 2)),
    "threads": (("bfloat16", "sdpa", 1), ("bfloat16", "sdpa", 2))}
MOE_CLEAN: dict[str, tuple[Side, Side]] = {**CLEAN, "router-fp32": (("bfloat16", "sdpa", 2, "fp32"), GOLDEN)}
FAULT_SIDE: Side = ("bfloat16", "eager", 2)
# name: (module part the fault sits in, relative size, whether bf16 can show it)
FAULTS = {"kv_head": ("self_attn", None, True), "attn_gain": ("self_attn", 0.05, True),
          "norm_gain": ("post_attention_layernorm", 0.1, True), "activation": ("mlp", None, True),
          "mlp_gain_tiny": ("mlp", 0.0005, False)}
# MoE faults: (module part, relative size, whether bf16 can show it, (candidate, reference) when not FAULT_SIDE
# against the golden). The activation fault sits in the dense first layer's MLP; the others at the middle layer.
MOE_FAULTS: dict[str, tuple[str, float | None, bool, tuple[Side, Side] | None]] = {
    "kv_head": ("self_attn", None, True, None), "attn_gain": ("self_attn", 0.05, True, None),
    "norm_gain": ("post_attention_layernorm", 0.1, True, None), "activation": ("mlp", None, True, None),
    "expert_noise": ("mlp.experts", 0.3, True, None), "router_noise": ("mlp.gate", 0.05, True, None),
    "router_bf16": ("mlp.gate", None, True, (("bfloat16", "sdpa", 2, "bf16"), ("bfloat16", "sdpa", 2, "fp32"))),
    "weights_downcast": ("mlp.experts", 2.0**-9, False,
                         (("bfloat16", "sdpa", 2, "fp32"), ("bfloat16", "sdpa", 2, "fp32w"))),
    "mlp_gain_tiny": ("mlp", 0.0005, False, None)}
# The pairs msprobe compare judges by default (about a minute each here); --full: every pair.
MSPROBE_PAIRS = ("precision-bf16", "router_bf16")


@dataclass(frozen=True)
class Pair:
    family: Family | MoeFamily
    name: str
    candidate: Side
    reference: Side
    fault: str | None = None

    @property
    def moe(self) -> bool:
        return isinstance(self.family, MoeFamily)

    @property
    def layer(self) -> int:
        if self.moe and self.fault == "activation":
            return 0  # the dense first layer's MLP
        return self.family.layers // 2

    @property
    def above_noise(self) -> bool:
        if self.fault is None:
            return False
        if not self.moe:
            return FAULTS[self.fault][2]
        if self.fault == "router_bf16":
            return isinstance(self.family, MoeFamily) and self.family.bf16_router_shows
        return MOE_FAULTS[self.fault][2]

    @property
    def size(self) -> float | None:
        if self.fault is None:
            return None
        return MOE_FAULTS[self.fault][1] if self.moe else FAULTS[self.fault][1]

    @property
    def faulty_module(self) -> str | None:
        if self.fault is None:
            return None
        part = MOE_FAULTS[self.fault][0] if self.moe else FAULTS[self.fault][0]
        return f"model.layers.*.{part}" if self.fault == "router_bf16" else f"model.layers.{self.layer}.{part}"

    def sits_in(self, flagged: str | None) -> bool:
        """Whether the flagged tensor lies in the module the fault is in (an expert fault: the MoE block, its
        experts or a call inside them, not its router)."""
        where = self.faulty_module
        if flagged is None or where is None:
            return False
        if self.fault == "router_bf16":
            return ".mlp.gate." in flagged
        if self.moe and self.fault in ("expert_noise", "mlp_gain_tiny", "weights_downcast"):
            block = f".model.layers.{self.layer}.mlp."
            return block in flagged and ".mlp.gate." not in flagged and ".mlp.shared_experts." not in flagged
        return f".{where}." in flagged


def pairs(family: Family | MoeFamily) -> list[Pair]:
    if isinstance(family, Family):
        out = [Pair(family, name, cand, ref) for name, (cand, ref) in CLEAN.items()]
        return out + [Pair(family, fault, FAULT_SIDE, GOLDEN, fault) for fault in FAULTS]
    out = [Pair(family, name, cand, ref) for name, (cand, ref) in MOE_CLEAN.items()]
    for fault, (_, _, _, sides) in MOE_FAULTS.items():
        if fault == "kv_head" and family.spec.family != "qwen3_moe":
            continue  # DeepSeek-V3's MLA has no per-head value projection to zero
        cand, ref = sides or (FAULT_SIDE, GOLDEN)
        out.append(Pair(family, fault, cand, ref, fault))
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


def build_moe(family: MoeFamily, side: Side, fault: str | None, layer: int) -> Any:
    """The MoE family's model at `side`, with a weight fault applied to its bf16-exact weights."""
    import torch

    dtype, attn = getattr(torch, side[0]), side[1]
    router = side[3] if len(side) == 4 else "model"
    weight_fault = {"expert_noise": f"noise:model.layers.{layer}.mlp.experts.down_proj:0.3",
                    "router_noise": f"noise:model.layers.{layer}.mlp.gate.weight:0.05"}.get(fault or "")
    model: Any = build_model(family.spec, dtype=dtype, attn=attn, router="fp32" if router == "fp32w" else router,
                        weights_dtype=torch.float32 if router == "fp32w" else torch.bfloat16 if router != "model"
                        else None, fault=weight_fault)
    with torch.no_grad():
        model.model.norm.weight.mul_(family.logit_scale)
    return model


def _wrap(module: Any, change: Callable[..., Any]) -> None:
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return change(original(*args, **kwargs))

    module.forward = forward


def _scaled(out: Any, factor: float) -> Any:
    return out * factor if not isinstance(out, tuple) else (out[0] * factor, *out[1:])


def inject(model: Any, fault: str, layer: int) -> None:
    import torch

    block = model.model.layers[layer]
    if fault == "kv_head":
        with torch.no_grad():
            block.self_attn.v_proj.weight[: block.self_attn.head_dim].zero_()
    elif fault == "attn_gain":
        _wrap(block.self_attn, lambda out: _scaled(out, 1.05))
    elif fault == "norm_gain":
        with torch.no_grad():
            block.post_attention_layernorm.weight.mul_(1.1)
    elif fault == "activation":
        block.mlp.act_fn = torch.nn.GELU(approximate="tanh")
    elif fault == "mlp_gain_tiny":
        _wrap(block.mlp, lambda out: _scaled(out, 1.0005))
    elif fault not in ("expert_noise", "router_noise", "router_bf16", "weights_downcast"):
        raise ValueError(f"unknown fault {fault!r}")


def side_dump(work: Path, family: Family | MoeFamily, side: Side, fault: str | None, layer: int) -> Path:
    """One prefill of the family at `side` (dtype, attention, threads[, router]), with `fault`, dumped once."""
    import torch

    dtype, attn, threads = side[:3]
    name = f"{family.name}-{dtype}-{attn}-t{threads}" + (f"-router-{side[3]}" if len(side) == 4 else "")
    out = work / "dumps" / (name if fault is None or fault in ("router_bf16", "weights_downcast")
                            else f"{name}-{fault}")
    if (out / "step0").is_dir():
        return out / "step0"
    if isinstance(family, MoeFamily):
        model = build_moe(family, side, fault, layer)
        ids = tokens(family.spec, count=family.tokens, seed=family.seed + 7)
        modules = MOE_MODULES
    else:
        model = build(family, dtype, attn)
        ids = torch.randint(0, family.vocab, (1, family.tokens),
                            generator=torch.Generator().manual_seed(family.seed))
        modules = DENSE_MODULES
    if fault is not None:
        inject(model, fault, layer)
    return msprobe_dump(model, ids, out, modules, threads)


def make_pair(work: Path, pair: Pair) -> tuple[Path, Path]:
    return (side_dump(work, pair.family, pair.candidate, pair.fault, pair.layer),
            side_dump(work, pair.family, pair.reference, None, pair.layer))


@functools.cache
def measured_rows(cand: Path, ref: Path) -> list[Any]:
    """The pair's rows, read, measured and judged by every rule the peer settings do not touch: the tensor
    rules and routing (`relative` off leaves the module rules, the only ones that read the settings)."""
    from bisect_npu.oracle.config import LogitsConfig
    from bisect_npu.oracle.dumps.compare import compare_dumps

    return compare_dumps(cand, ref, LogitsConfig(relative=False)).rows


@functools.cache
def first_module(cand: Path, ref: Path, mads: float, factor: float) -> str | None:
    """The first flagged module under one peer setting: the module rules run again on a copy of the rows."""
    from bisect_npu.oracle.config import LogitsConfig
    from bisect_npu.oracle.dumps.rules import apply_relative_rules

    rows = copy.deepcopy(measured_rows(cand, ref))
    apply_relative_rules(rows, LogitsConfig(peer_mads=mads, peer_min_factor=factor))
    return next((row.module for row in rows if row.problem is not None), None)


def score(results: list[tuple[Pair, str | None]]) -> tuple[int, int]:
    """(false alarms, above-noise faults named)."""
    false = sum(pair.fault is None and flagged is not None for pair, flagged in results)
    hits = sum(pair.above_noise and pair.sits_in(flagged) for pair, flagged in results)
    return false, hits


def choose(tune: list[tuple[Pair, Path, Path]]) -> tuple[float, float]:
    """The grid's setting with the fewest false alarms and then the most faults named on the tune pairs; among
    settings tied on both, the widest (a held-out family's noise may spread wider than the tuned ones')."""
    scored = []
    for mads, factor in GRID:
        false, hits = score([(pair, first_module(cand, ref, mads, factor)) for pair, cand, ref in tune])
        scored.append(((false, -hits, -mads, -factor), (mads, factor)))
    return min(scored)[1]


JUDGE_THIS = ("import json, sys\nfrom bisect_npu.oracle.config import LogitsConfig\n"
              "from bisect_npu.oracle.dumps.compare import compare_dumps\n"
              "cfg = LogitsConfig(peer_mads=float(sys.argv[3]), peer_min_factor=float(sys.argv[4]))\n"
              "result = compare_dumps(sys.argv[1], sys.argv[2], cfg)\n"
              "first = result.first_divergent\n"
              "print(json.dumps({'module': first.module if first is not None else None,\n"
              "                  'flips': sum(len(report.flips) for report in result.routing)}))\n")


def _msprobe_first(out: Path) -> str | None:
    for path in sorted(out.glob("compare_result_*.csv")):
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row["Result"].strip().lower() in ("error", "warning"):
                    return row["NPU Name"]
    return None


def run_tool(tool: str, pair: Pair, cand: Path, ref: Path, work: Path, setting: tuple[float, float],
             msprobe: str) -> tuple[str | None, float, int, int]:
    """(first flagged module, seconds, peak RSS bytes, routing flips) of one tool on one pair, in a process of
    its own; a tool that fails flags "failed"."""
    out = work / f"msprobe-out-{time.monotonic_ns()}"
    env = dict(os.environ)
    if tool == "msprobe":
        command = [msprobe, "compare", "-tp", str(cand), "-gp", str(ref), "-o", str(out)]
    else:
        env["PYTHONPATH"] = str(ROOT)  # the tree's rules alone, as a user runs them: no model built here
        command = [sys.executable, "-c", JUDGE_THIS, str(cand), str(ref), *map(str, setting)]
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
    peak = int(peak_file.read_text()) * 1024 if peak_file.exists() else 0
    if done.returncode != 0:
        return f"failed (status {done.returncode})", seconds, peak, 0
    if tool == "msprobe":
        return _msprobe_first(out), seconds, peak, 0
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["module"], seconds, peak, int(answer.get("flips", 0))


def msprobe_cached(pair: Pair, cand: Path, ref: Path, work: Path, msprobe: str) -> tuple[str | None, float, int, int]:
    """msprobe compare's answer on one pair, kept in the work folder (its verdict depends on the dumps alone)."""
    cache = work / "msprobe-verdicts.json"
    kept = json.loads(cache.read_text(encoding="utf-8")) if cache.exists() else {}
    key = f"{cand}|{ref}"
    if key not in kept:
        kept[key] = run_tool("msprobe", pair, cand, ref, work, (0.0, 0.0), msprobe)
        cache.write_text(json.dumps(kept, indent=1), encoding="utf-8")
    flagged, seconds, peak, flips = kept[key]
    return flagged, float(seconds), int(peak), int(flips)


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


def _cell(pair: Pair, flagged: str | None) -> str:
    if pair.fault is None:
        return "false alarm" if flagged is not None else "clean"
    if pair.above_noise:
        return "named" if pair.sits_in(flagged) else f"missed ({flagged or 'nothing flagged'})"
    return f"listed apart ({'flagged' if flagged else 'not flagged'})"


def _below_line(pair: Pair, flagged: str | None, flips: int) -> str:
    """What a fault below the pair's resolution is, its size, and whether this tree flagged it."""
    if pair.fault == "router_bf16":
        size = f"a bf16 gate on a saturated router: {flips} token choices moved in all MoE layers"
    elif pair.fault == "weights_downcast":
        size = "fp32 routing weights cast to bf16: at most 2^-9 of each weight, below a bf16 output's ulp"
    else:
        size = f"x{1 + (pair.size or 0):g} at {pair.faulty_module}, a sixteenth of a bf16 ulp"
    return f"{pair.family.name}/{pair.name}: {size}; {'flagged at ' + flagged if flagged else 'not flagged'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/family-bench"))
    parser.add_argument("--only", default="", help="held-out families to report (commas; default all)")
    parser.add_argument("--kinds", choices=("all", "dense", "moe"), default="all", help="families made and tuned on")
    parser.add_argument("--msprobe", default=str(Path(sys.executable).parent / "msprobe"))
    parser.add_argument("--no-msprobe", action="store_true")
    parser.add_argument("--full", action="store_true", help="msprobe compare on every pair, not MSPROBE_PAIRS")
    args = parser.parse_args()
    os.environ.setdefault("MSPROBE_LOG_LEVEL", "3")
    args.work.mkdir(parents=True, exist_ok=True)
    baseline_tree(args.work)
    families = {"all": FAMILIES, "dense": DENSE_FAMILIES, "moe": MOE_FAMILIES}[args.kinds]
    tools = ["this tree", "before"] + ([] if args.no_msprobe else ["msprobe"])
    started = time.perf_counter()
    dumps = {family.name: [(pair, *make_pair(args.work, pair)) for pair in pairs(family)] for family in families}
    print(f"dumps made or found in {time.perf_counter() - started:.0f} s", flush=True)
    held_out = [family for family in families if not args.only or family.name in args.only.split(",")]
    totals = {(tool, kind): {"false": 0, "clean": 0, "named": 0, "faults": 0, "seconds": 0.0, "peak": 0, "pairs": 0}
              for tool in tools for kind in ("dense", "MoE")}
    by_family: dict[str, list[int]] = {}
    below: list[str] = []
    print(f"family bench, {date.today()}, {platform.machine()}, load {os.getloadavg()[0]:.1f}")
    print("| held-out family | setting chosen on the others | pair | fault at | " + " | ".join(tools) + " |")
    print("|---|---|---|---|" + "---|" * len(tools))
    for family in held_out:
        tune = [item for other in families if other is not family for item in dumps[other.name]]
        setting = choose(tune)
        for pair, cand, ref in dumps[family.name]:
            cells = []
            for tool in tools:
                if tool == "msprobe" and not args.full and pair.name not in MSPROBE_PAIRS:
                    cells.append("not run")
                    continue
                flagged, seconds, peak, flips = msprobe_cached(pair, cand, ref, args.work, args.msprobe) \
                    if tool == "msprobe" else run_tool(tool, pair, cand, ref, args.work, setting, args.msprobe)
                total = totals[(tool, "MoE" if pair.moe else "dense")]
                total["seconds"] += seconds
                total["pairs"] += 1
                total["peak"] = max(total["peak"], peak)
                if pair.fault is None:
                    total["clean"] += 1
                    total["false"] += flagged is not None
                elif pair.above_noise:
                    total["faults"] += 1
                    total["named"] += pair.sits_in(flagged)
                elif tool == "this tree":
                    below.append(_below_line(pair, flagged, flips))
                if tool == "this tree":
                    tally = by_family.setdefault(family.name, [0, 0, 0, 0])
                    tally[0] += pair.fault is None and flagged is not None
                    tally[1] += pair.fault is None
                    tally[2] += pair.above_noise and pair.sits_in(flagged)
                    tally[3] += pair.above_noise
                cells.append(_cell(pair, flagged))
            print(f"| {family.name} | peer_mads {setting[0]:g}, peer_min_factor {setting[1]:g} | {pair.name} | "
                  f"{pair.faulty_module or '-'} | " + " | ".join(cells) + " |", flush=True)
    print()
    print("| held-out family | false alarms (clean pairs) | above-noise faults named at their module |")
    print("|---|---|---|")
    for name, (false, clean, hits, faults) in by_family.items():
        print(f"| {name} | {false}/{clean} | {hits}/{faults} |")
    print()
    print("| tool | families | false alarms (clean pairs) | above-noise faults named | pairs | seconds | peak RSS |")
    print("|---|---|---|---|---|---|---|")
    for (tool, kind), total in totals.items():
        if total["pairs"]:
            print(f"| {tool} | {kind} | {total['false']}/{total['clean']} | {total['named']}/{total['faults']} | "
                  f"{total['pairs']} | {total['seconds']:.1f} | {total['peak'] / 2**20:.0f} MiB |")
    print("\nbelow what the candidate's precision (or the router's rounding) can show, not counted above:")
    for line in below:
        print(f"- {line}")


if __name__ == "__main__":
    main()
