"""Real MindStudio Probe dumps of Hugging Face transformers' own Qwen3 on the CPU: clean pairs and faults.

Why real: the dump diff's rules must hold on the noise two correct kernels, precisions or thread
counts really leave, which a simulation only guesses. Each dump is msprobe's `PrecisionDebugger`
(task tensor, level L0) around one prefill of `Qwen3ForCausalLM` built from a small random-init
config (nothing downloaded). HF's default init (std 0.02) leaves activations tiny, so the 2-D
weights are scaled to give hidden states of a trained model's magnitude.

Faults are what a port gets wrong, injected at one known module of the candidate: RoPE theta in
one attention, tanh-GELU for SiLU in one MLP, a gain on one MLP's output, a zeroed KV head, the
q/k norms skipped in one attention. Inputs seen by msprobe's hooks are the module's own (the
fault acts inside `forward`), as in a faulty kernel.

    .venv/bin/python -m tests.helpers.msprobe_qwen3 OUT_DIR [--split tune|report]   # writes every dump of a split
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.helpers.msprobe_dump import msprobe_dump

DUMPED_MODULES = ["Qwen3DecoderLayer", "Qwen3Attention", "Qwen3MLP", "model.norm"]
FAULTS = ("rope_theta", "activation", "gain", "kv_head", "qk_norm")


@dataclass(frozen=True)
class Size:
    """A small Qwen3 config and its prompt length."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    tokens: int
    head_dim: int = 32
    vocab: int = 2048


@dataclass(frozen=True)
class Pair:
    """One candidate/reference pair: `fault` at `layer` (None: clean), what differs between the two sides."""

    name: str
    size: Size
    seed: int
    candidate: dict[str, Any]
    reference: dict[str, Any]
    fault: str | None = None
    layer: int | None = None

    @property
    def faulty_module(self) -> str | None:
        """The dotted module name the fault sits in (what the diff must name)."""
        if self.fault is None:
            return None
        part = "mlp" if self.fault in ("activation", "gain") else "self_attn"
        return f"model.layers.{self.layer}.{part}"


# Tune on these seeds, sizes and fault layers; report on the others (never seen while tuning).
TUNE_SIZES = (Size("tune-s", layers=6, hidden=128, heads=4, kv_heads=2, intermediate=384, tokens=48),
              Size("tune-m", layers=8, hidden=192, heads=6, kv_heads=2, intermediate=512, tokens=64))
REPORT_SIZES = (Size("report-s", layers=6, hidden=160, heads=5, kv_heads=1, intermediate=448, tokens=56),
                Size("report-m", layers=10, hidden=256, heads=8, kv_heads=4, intermediate=640, tokens=80))
SPLITS = {"tune": (TUNE_SIZES, (0, 1), (1, 4)), "report": (REPORT_SIZES, (2, 3), (2, 5))}

BF16_SDPA = {"dtype": "bfloat16", "attn": "sdpa", "threads": 2}
BF16_EAGER = {"dtype": "bfloat16", "attn": "eager", "threads": 2}
BF16_ONE_THREAD = {"dtype": "bfloat16", "attn": "sdpa", "threads": 1}
FP32_SDPA = {"dtype": "float32", "attn": "sdpa", "threads": 2}


def pairs(split: str) -> list[Pair]:
    """Every pair of a split: three kinds of clean pair, then each fault (bf16 eager candidate against the
    bf16 SDPA reference, so kernel noise lies under the fault) at one of the split's layers."""
    sizes, seeds, fault_layers = SPLITS[split]
    out = []
    for size in sizes:
        for seed in seeds:
            tag = f"{size.name}-seed{seed}"
            out += [Pair(f"{tag}-kernel", size, seed, BF16_EAGER, BF16_SDPA),
                    Pair(f"{tag}-precision", size, seed, BF16_SDPA, FP32_SDPA),
                    Pair(f"{tag}-threads", size, seed, BF16_ONE_THREAD, BF16_SDPA)]
            for i, fault in enumerate(FAULTS):
                layer = fault_layers[(i + seed) % len(fault_layers)]
                out.append(Pair(f"{tag}-{fault}-l{layer}", size, seed, BF16_EAGER, BF16_SDPA, fault, layer))
            out.append(Pair(f"{tag}-gain-fp32golden-l{fault_layers[0]}", size, seed, BF16_EAGER, FP32_SDPA, "gain",
                            fault_layers[0]))
    return out


def build_model(size: Size, seed: int, dtype: str, attn: str) -> nn.Module:
    """Qwen3ForCausalLM, random init from `seed`, 2-D weights scaled x2.5 (a trained model's activations)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=size.vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
                      num_hidden_layers=size.layers, num_attention_heads=size.heads,
                      num_key_value_heads=size.kv_heads, head_dim=size.head_dim, tie_word_embeddings=True,
                      max_position_embeddings=1024, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(2.5)
    model.set_attn_implementation(attn)
    return model.to(getattr(torch, dtype))


def _rope(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = position_ids.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _wrap(module: nn.Module, change: Callable[..., Any]) -> None:
    """Make `module.forward` call `change(original_forward, *args, **kwargs)`."""
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return change(original, *args, **kwargs)

    module.forward = forward  # type: ignore[method-assign]


def inject(model: nn.Module, fault: str, layer: int) -> None:
    """Break one module of `model` the way a port does."""
    block = model.model.layers[layer]
    attn, mlp = block.self_attn, block.mlp
    if fault == "rope_theta":  # the config's 1e6 read as the old default 1e4 in this attention
        def wrong_theta(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            cos, _ = kwargs["position_embeddings"]
            positions = kwargs.get("position_ids")
            if positions is None:
                positions = torch.arange(cos.shape[-2])[None]
            kwargs["position_embeddings"] = _rope(positions, attn.head_dim, 1e4, cos.dtype)
            return original(*args, **kwargs)
        _wrap(attn, wrong_theta)
    elif fault == "activation":
        mlp.act_fn = nn.GELU(approximate="tanh")
    elif fault == "gain":  # a wrong dequant or norm scale: 2% on the MLP's output
        _wrap(mlp, lambda original, *args, **kwargs: original(*args, **kwargs) * 1.02)
    elif fault == "kv_head":  # one KV head lost (a sharding slip): its values are zero
        with torch.no_grad():
            attn.v_proj.weight[: attn.head_dim].zero_()
    elif fault == "qk_norm":  # Qwen3's per-head q/k RMSNorm skipped (a Qwen2 attention reused)
        attn.q_norm, attn.k_norm = nn.Identity(), nn.Identity()
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


def side_dump(root: Path, pair: Pair, side: str) -> Path:
    """The dump of one side of `pair` under `root`, made once and shared by every pair that needs it."""
    spec = pair.candidate if side == "candidate" else pair.reference
    fault = pair.fault if side == "candidate" else None
    key = f"{pair.size.name}-seed{pair.seed}-{spec['dtype']}-{spec['attn']}-t{spec['threads']}"
    if fault is not None:
        key += f"-{fault}-l{pair.layer}"
    out = root / key
    if (out / "step0").is_dir():
        return out / "step0"
    model = build_model(pair.size, pair.seed, spec["dtype"], spec["attn"])
    if fault is not None and pair.layer is not None:
        inject(model, fault, pair.layer)
    generator = torch.Generator().manual_seed(1000 + pair.seed)
    tokens = torch.randint(0, pair.size.vocab, (1, pair.size.tokens), generator=generator)
    return msprobe_dump(model, tokens, out, DUMPED_MODULES, spec["threads"])


def make_pair(root: Path, pair: Pair) -> tuple[Path, Path]:
    """(candidate dump, reference dump) of `pair`, each a msprobe `step0` directory."""
    return side_dump(root, pair, "candidate"), side_dump(root, pair, "reference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--split", choices=sorted(SPLITS), default="report")
    parser.add_argument("--only", default="", help="only the pairs whose name starts with one of these (commas)")
    args = parser.parse_args()
    os.environ.setdefault("MSPROBE_LOG_LEVEL", "3")
    for pair in pairs(args.split):
        if not pair.name.startswith(tuple(args.only.split(","))):
            continue
        cand, ref = make_pair(args.out, pair)
        print(pair.name, cand, ref)


if __name__ == "__main__":
    main()
