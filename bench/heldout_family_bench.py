"""The dump diff on transformers families it was never built or tuned on, with the shipped settings.

    .venv/bin/python bench/heldout_family_bench.py [--work /tmp/heldout-family-bench] [--only FAMILY,...]
                                                   [--msprobe-pairs precision-bf16,...] [--no-msprobe]
                                                   [--setting PEER_MADS,PEER_MIN_FACTOR] [--why]
    .venv/bin/python bench/heldout_family_bench.py --align Gemma,Mistral,Phi3,Olmo2

bench/family_bench.py tunes the rules' spread settings leave-one-family-out on Qwen3, Llama,
Qwen3-MoE and DeepSeek-V3. This bench judges other architectures with the settings as shipped
(`LogitsConfig()`; `--setting 12,5`: what the family bench chooses on its own families), nothing
chosen on them: Mistral (sliding-window attention), Gemma (norm weight
as 1 + w, embedding scaled by sqrt(hidden), tanh-GELU), Gemma2 (the same, plus attention and final
logit soft-capping, norms before and after attention and MLP, sliding window), Phi3 (fused
`qkv_proj` and `gate_up_proj`, as vLLM fuses them), OLMo2 (norms after attention and MLP, q/k
norms), and the MoE families Mixtral (softmax top-2 of 8), Qwen2-MoE (a shared expert scaled by a
sigmoid `shared_expert_gate`, top-4 of 16) and OLMoE (top-4 of 16, weights not renormalised).

Each model is built as the family bench builds its own: random init, 2-D and 3-D weights x2.5 (a
trained model's activation sizes), an MoE router's rows sharing one large part (as a trained
router's logits do), the final norm's effective gain scaled for peaked logits, every weight rounded
to bf16 (a published checkpoint). Each side is one prefill dumped by MindStudio Probe
(tests/helpers/msprobe_dump.py, L0, inputs and outputs).

Clean pairs (Gemma2's soft-capped attention is eager only in transformers: its sides run eager, and it has
no kernel pair): bf16 and fp16 SDPA against the fp32 golden, bf16 eager against bf16 SDPA, one thread
against two; for the MoE families also a bf16 model whose router runs in fp32 against the golden.
Faults, in a bf16 eager candidate against the fp32 golden, at the middle layer: one KV head's values
zeroed (Phi3: its rows of the fused `qkv_proj`), attention's output x1.05, the post-attention norm's
effective gain x1.1, the MLP's activation swapped (tanh-GELU for SiLU, SiLU for tanh-GELU), and the
MLP's output x1.0005 (a sixteenth of a bf16 ulp: listed apart). MoE: the experts' down projection
perturbed by 30% of its rms, the router's weights by 5%, Qwen2-MoE's shared expert's down projection
by 30%; the router in bf16 where the reference routes in fp32 is listed apart with the flips it made
(whether bf16 moves these routers' choices beyond rounding is not known in advance).
A fault is named when the first flagged tensor lies in the module it sits in.

`--align`: `align` of a bf16 transformers record (`record`, layer outputs) against its fp32 golden, one
bf16 checkpoint per architecture, as tests/alignment/test_alignment_bf16_checkpoint.py runs Qwen3 and Llama.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.family_bench import GOLDEN, Family, Side, _msprobe_first, _scaled, _wrap  # noqa: E402
from tests.helpers.msprobe_dump import DENSE_MODULES, MOE_MODULES, msprobe_dump  # noqa: E402


@dataclass(frozen=True)
class HeldOut(Family):
    """One held-out family: a family bench family's sizes, logit scale and seed, with config extras."""

    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    moe: bool = False
    sdpa: bool = True  # Gemma2's soft-capped attention is eager only: its sides run eager, no kernel pair


# Seeds 60-67: in no other bench.
DENSE: list[HeldOut] = [
    HeldOut("mistral-s-swa", "Mistral", 6, 128, 4, 2, 384, 64, 4.0, 60, extra={"sliding_window": 32}),
    HeldOut("gemma-s-flat", "Gemma", 6, 128, 4, 1, 384, 48, 1.0, 61),
    HeldOut("gemma2-m-peaked", "Gemma2", 8, 192, 6, 2, 512, 64, 4.0, 62, extra={"sliding_window": 32}, sdpa=False),
    HeldOut("phi3-s-peaked", "Phi3", 6, 160, 5, 5, 448, 56, 4.0, 63),
    HeldOut("olmo2-m-flat", "Olmo2", 8, 192, 6, 2, 512, 64, 1.0, 64),
]
MOE: list[HeldOut] = [
    HeldOut("mixtral-s-peaked", "Mixtral", 5, 128, 4, 2, 256, 128, 4.0, 65,
            extra={"num_local_experts": 8, "num_experts_per_tok": 2}, moe=True, vocab=512),
    HeldOut("qwen2moe-s-flat", "Qwen2Moe", 5, 128, 4, 2, 256, 128, 1.0, 66,
            extra={"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 64,
                   "shared_expert_intermediate_size": 256, "norm_topk_prob": False}, moe=True, vocab=512),
    HeldOut("olmoe-s-peaked", "Olmoe", 5, 128, 4, 2, 64, 128, 4.0, 67,
            extra={"num_experts": 16, "num_experts_per_tok": 4, "norm_topk_prob": False}, moe=True, vocab=512),
]
FAMILIES = DENSE + MOE
ROUTER_OFFSET = 20.0  # tests/helpers/tiny_moe.py's shared part of the router's rows (a peaked softmax)

CLEAN: dict[str, tuple[Side, Side]] = {
    "precision-bf16": (("bfloat16", "sdpa", 2), GOLDEN), "precision-fp16": (("float16", "sdpa", 2), GOLDEN),
    "kernel": (("bfloat16", "eager", 2), ("bfloat16", "sdpa", 2)),
    "threads": (("bfloat16", "sdpa", 1), ("bfloat16", "sdpa", 2))}
MOE_CLEAN = {**CLEAN, "router-fp32": (("bfloat16", "sdpa", 2, "fp32"), GOLDEN)}
FAULT_SIDE: Side = ("bfloat16", "eager", 2)
# name: (module part it sits in, whether a bf16 candidate can show it)
FAULTS = {"kv_head": ("self_attn", True), "attn_gain": ("self_attn", True),
          "norm_gain": ("post_attention_layernorm", True), "activation": ("mlp", True),
          "mlp_gain_tiny": ("mlp", False)}
MOE_FAULTS = {**FAULTS, "activation": ("mlp.experts", True), "expert_noise": ("mlp.experts", True),
              "router_noise": ("mlp.gate", True), "shared_noise": ("mlp.shared_expert", True),
              "router_bf16": ("mlp.gate", False)}
ROUTER_BF16_SIDES: tuple[Side, Side] = (("bfloat16", "sdpa", 2), ("bfloat16", "sdpa", 2, "fp32"))


@dataclass(frozen=True)
class Pair:
    family: HeldOut
    name: str
    candidate: Side
    reference: Side
    fault: str | None = None

    @property
    def layer(self) -> int:
        return self.family.layers // 2

    @property
    def part(self) -> str | None:
        if self.fault is None:
            return None
        return (MOE_FAULTS if self.family.moe else FAULTS)[self.fault][0]

    @property
    def above_noise(self) -> bool:
        return self.fault is not None and (MOE_FAULTS if self.family.moe else FAULTS)[self.fault][1]

    def sits_in(self, flagged: str | None) -> bool:
        """Whether the flagged tensor lies in the faulty module (an expert fault: the MoE block, its experts or a
        call inside them, not its router or shared expert)."""
        if flagged is None or self.part is None:
            return False
        if self.fault == "router_bf16":
            return ".mlp.gate." in flagged
        if self.family.moe and self.part in ("mlp", "mlp.experts"):
            block = f".model.layers.{self.layer}.mlp."
            return block in flagged and ".mlp.gate." not in flagged and ".shared_expert" not in flagged
        return f".model.layers.{self.layer}.{self.part}." in flagged


def pairs(family: HeldOut) -> list[Pair]:
    clean = MOE_CLEAN if family.moe else CLEAN
    out = [Pair(family, name, cand, ref) for name, (cand, ref) in clean.items()
           if family.sdpa or name != "kernel"]
    for fault in MOE_FAULTS if family.moe else FAULTS:
        if fault == "shared_noise" and family.arch != "Qwen2Moe":
            continue
        cand, ref = ROUTER_BF16_SIDES if fault == "router_bf16" else (FAULT_SIDE, GOLDEN)
        out.append(Pair(family, fault, cand, ref, fault))
    return out


def _one_plus(norm: Any) -> bool:
    """Whether a norm multiplies by 1 + its weight (Gemma's), not by its weight."""
    return "Gemma" in type(norm).__name__


def _gain(norm: Any, factor: float) -> None:
    """Scale a norm's effective gain by `factor` (Gemma's stored weight w is a gain of 1 + w)."""
    if _one_plus(norm):
        norm.weight.copy_(factor * (1.0 + norm.weight) - 1.0)
    else:
        norm.weight.mul_(factor)


def build(family: HeldOut, side: Side, fault: str | None) -> Any:
    """The family's model at `side` (dtype, attention, threads[, router]) with `fault`: bf16-exact weights."""
    import torch
    import transformers

    config = getattr(transformers, f"{family.arch}Config")(
        vocab_size=family.vocab, hidden_size=family.hidden, intermediate_size=family.intermediate,
        num_hidden_layers=family.layers, num_attention_heads=family.heads, num_key_value_heads=family.kv_heads,
        head_dim=family.head_dim, tie_word_embeddings=True, max_position_embeddings=1024, pad_token_id=0,
        bos_token_id=None, eos_token_id=None, **family.extra)
    torch.manual_seed(family.seed)
    model = getattr(transformers, f"{family.arch}ForCausalLM")(copy.deepcopy(config)).eval()
    generator = torch.Generator().manual_seed(family.seed + 1)
    layer = model.model.layers[family.layers // 2]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.mul_(2.5)
            if name.endswith("mlp.gate.weight"):  # a trained router: every logit carries one shared term
                param.add_(ROUTER_OFFSET * torch.randn(param.shape[1], generator=generator) * 0.05)
        _gain(model.model.norm, family.logit_scale)
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).float())
        _weight_fault(model, layer, fault)
    model.set_attn_implementation(side[1] if family.sdpa else "eager")
    model = model.to(getattr(torch, side[0]))
    if len(side) == 4:
        for module_name, module in model.named_modules():
            if module_name.endswith("mlp.gate"):
                _fp32_router(module)
    _forward_fault(layer, fault)
    return model


def _noise(weight: Any, share: float) -> None:
    import torch

    noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(99))
    weight.add_(noise * share * weight.pow(2).mean().sqrt())


def _weight_fault(model: Any, layer: Any, fault: str | None) -> None:
    """A fault in the weights, after the bf16 rounding (exact in every dtype that holds bf16)."""
    attn = layer.self_attn
    if fault == "kv_head":
        head_dim = model.config.head_dim
        if hasattr(attn, "qkv_proj"):  # fused q | k | v: the first value head's rows
            start = model.config.num_attention_heads * head_dim + model.config.num_key_value_heads * head_dim
            attn.qkv_proj.weight[start:start + head_dim].zero_()
        else:
            attn.v_proj.weight[:head_dim].zero_()
    elif fault == "norm_gain":
        _gain(layer.post_attention_layernorm, 1.1)
    elif fault == "expert_noise":
        _noise(layer.mlp.experts.down_proj, 0.3)
    elif fault == "router_noise":
        _noise(layer.mlp.gate.weight, 0.05)
    elif fault == "shared_noise":
        _noise(layer.mlp.shared_expert.down_proj.weight, 0.3)


def _forward_fault(layer: Any, fault: str | None) -> None:
    """A fault in the computation: a gain on a module's output, or another activation."""
    import torch

    if fault == "attn_gain":
        _wrap(layer.self_attn, lambda out: _scaled(out, 1.05))
    elif fault == "mlp_gain_tiny":
        _wrap(layer.mlp, lambda out: _scaled(out, 1.0005))
    elif fault == "activation":
        owner = layer.mlp.experts if hasattr(layer.mlp, "experts") else layer.mlp
        attr = "act_fn" if hasattr(owner, "act_fn") else "activation_fn"
        tanh_gelu = "GELU" in type(getattr(owner, attr)).__name__
        setattr(owner, attr, torch.nn.SiLU() if tanh_gelu else torch.nn.GELU(approximate="tanh"))


def _fp32_router(gate: Any) -> None:
    """The router's logits in fp32 whatever the model's dtype (vllm-ascend's fix), its routing weights handed to
    the experts in the model's dtype."""
    import torch

    dtype = gate.weight.dtype
    gate.float()
    original = gate.forward

    def forward(hidden_states: torch.Tensor) -> Any:
        logits, weights, ids = original(hidden_states.float())
        return logits, weights.to(dtype), ids

    gate.forward = forward


def side_dump(work: Path, family: HeldOut, side: Side, fault: str | None) -> Path:
    import torch

    name = f"{family.name}-{side[0]}-{side[1]}-t{side[2]}" + (f"-router-{side[3]}" if len(side) == 4 else "")
    out = work / "dumps" / (name if fault in (None, "router_bf16") else f"{name}-{fault}")
    if (out / "step0").is_dir():
        return out / "step0"
    model = build(family, side, None if fault == "router_bf16" else fault)
    ids = torch.randint(0, family.vocab, (1, family.tokens), generator=torch.Generator().manual_seed(family.seed))
    return msprobe_dump(model, ids, out, MOE_MODULES if family.moe else DENSE_MODULES, side[2])


def judge(cand: Path, ref: Path, setting: tuple[float, float] | None) -> tuple[str | None, str, int]:
    """(first flagged tensor, its rule and problem, routing flips) with the shipped settings, or the peer setting
    (`peer_mads`, `peer_min_factor`) given."""
    from bisect_npu.oracle.config import LogitsConfig
    from bisect_npu.oracle.dumps.compare import compare_dumps

    cfg = LogitsConfig() if setting is None else LogitsConfig(peer_mads=setting[0], peer_min_factor=setting[1])
    result = compare_dumps(cand, ref, cfg)
    first = result.first_divergent
    flips = sum(len(report.flips) for report in result.routing)
    return (first.module if first else None, f"{first.rule}: {first.problem}" if first else "", flips)


def msprobe_first(cand: Path, ref: Path, work: Path, msprobe: str) -> str | None:
    import subprocess

    cache = work / "msprobe-verdicts.json"
    kept = json.loads(cache.read_text(encoding="utf-8")) if cache.exists() else {}
    key = f"{cand}|{ref}"
    if key not in kept:
        out = work / f"msprobe-out-{time.monotonic_ns()}"
        done = subprocess.run([msprobe, "compare", "-tp", str(cand), "-gp", str(ref), "-o", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        kept[key] = _msprobe_first(out) if done.returncode == 0 else f"failed (status {done.returncode})"
        cache.write_text(json.dumps(kept, indent=1), encoding="utf-8")
    return kept[key]


def align_check(work: Path, arch: str) -> str:
    """`align` of a bf16 transformers record against its fp32 golden, one bf16 checkpoint of `arch` made as
    tests/helpers/bf16_checkpoint.py makes Qwen3's and Llama's (6 layers, hidden 128): one line of what it said."""
    from bisect_npu import api
    from tests.helpers import tiny_qwen3
    from tests.helpers.bf16_checkpoint import record, write_bf16_checkpoint

    tiny_qwen3.FAMILY_SIZES.setdefault(arch, {"head_dim": 32, "pad_token_id": 0,
                                              **({"sliding_window": 8} if arch == "Mistral" else {})})
    root = work / f"align-{arch}"
    model = write_bf16_checkpoint(root / "model", arch)
    result = api.align(record(model, root / "fp32", "float32"), record(model, root / "bf16", "bfloat16"))
    forward = result.cases[0].verdict.figures["stages"].get("forward", {})
    said = "aligned" if result.aligned else f"diverged: {result.first.verdict.reason if result.first else ''}"
    return (f"{arch}: {said}; forward pass {forward.get('tensors_compared')} tensors, worst cosine "
            f"{forward.get('worst_cosine')}")


def cell(pair: Pair, flagged: str | None) -> str:
    if pair.fault is None:
        return "false alarm" if flagged is not None else "clean"
    if pair.above_noise:
        return "named" if pair.sits_in(flagged) else f"missed ({flagged or 'nothing flagged'})"
    return f"listed apart ({'flagged' if flagged else 'not flagged'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/heldout-family-bench"))
    parser.add_argument("--only", default="", help="families (commas; default all)")
    parser.add_argument("--msprobe", default=str(Path(sys.executable).parent / "msprobe"))
    parser.add_argument("--msprobe-pairs", default="precision-bf16", help="pairs msprobe compare judges (commas)")
    parser.add_argument("--no-msprobe", action="store_true")
    parser.add_argument("--setting", help="peer_mads,peer_min_factor instead of the shipped settings (e.g. 12,5: "
                                          "what bench/family_bench.py chooses on its own families)")
    parser.add_argument("--why", action="store_true", help="print the rule and problem of each flagged tensor")
    parser.add_argument("--align", default="", help="only `align` of bf16 records against fp32 goldens of these "
                                                    "architectures (commas: Gemma,Mistral,Phi3,Olmo2)")
    args = parser.parse_args()
    os.environ.setdefault("MSPROBE_LOG_LEVEL", "3")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.align:
        for arch in args.align.split(","):
            print(align_check(args.work, arch), flush=True)
        return
    families = [f for f in FAMILIES if not args.only or f.name in args.only.split(",")]
    setting = tuple(float(x) for x in args.setting.split(",")) if args.setting else None
    if setting is not None and len(setting) != 2:
        parser.error("--setting takes two numbers: peer_mads,peer_min_factor")
    print(f"held-out family bench, {date.today()}, {platform.machine()}, load {os.getloadavg()[0]:.1f}, peer "
          f"setting {'shipped' if setting is None else setting}", flush=True)
    print("| family | pair | fault at | this tree | msprobe compare |")
    print("|---|---|---|---|---|")
    totals = {"dense": [0, 0, 0, 0, 0, 0], "MoE": [0, 0, 0, 0, 0, 0]}
    by_family: dict[str, list[int]] = {}
    below: list[str] = []
    started = time.perf_counter()
    for family in families:
        for pair in pairs(family):
            cand = side_dump(args.work, family, pair.candidate, pair.fault)
            ref = side_dump(args.work, family, pair.reference, None)
            flagged, why, flips = judge(cand, ref, setting)
            probe = "not run"
            if not args.no_msprobe and pair.name in args.msprobe_pairs.split(","):
                probe = cell(pair, msprobe_first(cand, ref, args.work, args.msprobe))
            total = totals["MoE" if family.moe else "dense"]
            tally = by_family.setdefault(family.name, [0, 0, 0, 0])
            if pair.fault is None:
                total[0] += flagged is not None
                total[1] += 1
                tally[0] += flagged is not None
                tally[1] += 1
            elif pair.above_noise:
                total[2] += pair.sits_in(flagged)
                total[3] += 1
                tally[2] += pair.sits_in(flagged)
                tally[3] += 1
            else:
                below.append(f"{family.name}/{pair.name}: {flips} routing flips; "
                             f"{'flagged at ' + flagged if flagged else 'not flagged'}")
            where = f"model.layers.{pair.layer}.{pair.part}" if pair.part else "-"
            print(f"| {family.name} | {pair.name} | {where} | {cell(pair, flagged)} | {probe} |", flush=True)
            if args.why and flagged:
                print(f"|   | | | {flagged}: {why[:300]} | |", flush=True)
    print()
    print("| held-out family | false alarms (clean pairs) | above-noise faults named at their module |")
    print("|---|---|---|")
    for name, (false, clean, hits, faults) in by_family.items():
        print(f"| {name} | {false}/{clean} | {hits}/{faults} |")
    for kind, (false, clean, hits, faults, _, _) in totals.items():
        if clean:
            print(f"{kind}: false alarms {false}/{clean}, above-noise faults named {hits}/{faults}")
    print("\nlisted apart (below what the candidate's precision shows, or not known to be above it):")
    for line in below:
        print(f"- {line}")
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
