"""Tiny MoE models of HF transformers built in process, and their layer dumps as `record` writes them.

Two router kinds: Qwen3-MoE's softmax top-k (`Qwen3MoeTopKRouter`) and DeepSeek-V3's sigmoid gate
with grouped top-k, a score-correction bias and shared experts (`DeepseekV3TopkRouter`). Weights
are random, scaled like a trained model's (x2.5: hidden states of a trained model's magnitude)
and rounded to bf16, as a published checkpoint is, so an fp32 golden and a bf16 candidate start
from the same numbers. `router_offset` adds one shared row to every expert's gate weights: every
logit of a token then carries the same large term, which softmax ignores but bf16 rounding of the
logits does not (a router whose scores bf16 resolves coarsely, as a trained router's often are).

Router variants, each a real forward of the model with one gate forward replaced:
* `router="model"`: the model's own router (Qwen3-MoE in the model's dtype, DeepSeek-V3 in fp32);
* `router="fp32"`: the logits computed in fp32 whatever the model's dtype (vllm-ascend's fix), the
  routing weights handed to the experts in `weights_dtype` (fp32 unless given);
* `router="bf16"`: the logits computed in bf16 (the regression where the reference routes in fp32).
Faults (`_inject`): one weight scaled or perturbed (a parameter name, the layer's number in it),
applied after rounding.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bisect_npu.probe.layer_dump import DumpWriter

# Module names hooked: decoder layers and their parts, the routers, experts and the last norm.
DUMP_PATTERNS = ["model.layers.*", "model.norm", "lm_head"]


@dataclass(frozen=True)
class MoeSpec:
    """One tiny MoE model: its family, sizes and how peaked its router is."""

    family: str = "qwen3_moe"  # or "deepseek_v3"
    hidden: int = 128
    layers: int = 3
    experts: int = 8
    top_k: int = 2
    norm_topk_prob: bool = True
    router_scale: float = 1.0
    router_offset: float = 0.0
    bias_scale: float = 1.0  # DeepSeek-V3's score-correction bias: times 0.02 of a normal
    vocab: int = 512
    seed: int = 0


def _config(spec: MoeSpec) -> Any:
    import transformers

    common = {"vocab_size": spec.vocab, "hidden_size": spec.hidden, "num_hidden_layers": spec.layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
              "tie_word_embeddings": True, "norm_topk_prob": spec.norm_topk_prob,
              "num_experts_per_tok": spec.top_k, "moe_intermediate_size": 64, "intermediate_size": 256}
    if spec.family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(head_dim=spec.hidden // 4, num_experts=spec.experts,
                                           decoder_sparse_step=1, mlp_only_layers=[0], **common)
    if spec.family == "deepseek_v3":  # MLA: as many key-value heads as query heads
        common["num_key_value_heads"] = 4
        return transformers.DeepseekV3Config(n_routed_experts=spec.experts, n_shared_experts=1, n_group=4,
                                             topk_group=2, first_k_dense_replace=1, q_lora_rank=None,
                                             kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32,
                                             v_head_dim=32, routed_scaling_factor=2.5, **common)
    raise ValueError(f"unknown MoE family {spec.family!r}")


def _model_class(spec: MoeSpec) -> Any:
    import transformers

    return transformers.Qwen3MoeForCausalLM if spec.family == "qwen3_moe" else transformers.DeepseekV3ForCausalLM


def build_model(spec: MoeSpec, dtype: torch.dtype = torch.float32, attn: str = "sdpa", router: str = "model",
                weights_dtype: torch.dtype | None = None, fault: str | None = None) -> nn.Module:
    """The model of `spec` (bf16-exact weights) in `dtype`, with its router variant and fault."""
    torch.manual_seed(spec.seed)
    config = copy.deepcopy(_config(spec))
    model = _model_class(spec)(config).eval()
    generator = torch.Generator().manual_seed(spec.seed + 1)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() >= 2:
                weight.mul_(2.5)
            if name.endswith("mlp.gate.weight"):
                weight.mul_(spec.router_scale)
                shared = torch.randn(weight.shape[1], generator=generator) * 0.02 * 2.5
                weight.add_(spec.router_offset * shared)
            if name.endswith("e_score_correction_bias"):
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.02 * spec.bias_scale)
            weight.copy_(weight.to(torch.bfloat16).float())
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_((torch.randn(buffer.shape, generator=generator) * 0.02 * spec.bias_scale)
                             .to(torch.bfloat16).float())
        if fault is not None:
            _inject(model, fault)
    model.to(dtype)
    model.set_attn_implementation(attn)
    for name, module in model.named_modules():
        if name.endswith("mlp.gate") and router != "model":
            _replace_router(module, spec, router, weights_dtype)
    return model


def _inject(model: nn.Module, fault: str) -> None:
    """`scale:<key>:<factor>` multiplies a weight; `noise:<key>:<share>` adds seeded noise of that share of
    its rms (a router that scores the experts otherwise, which a scale of a softmax's logits is not)."""
    kind, key, amount = fault.split(":")
    weight = dict(model.named_parameters())[key]
    if kind == "scale":
        weight.mul_(float(amount))
    elif kind == "noise":
        noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(99))
        weight.add_(noise * float(amount) * weight.pow(2).mean().sqrt())
    else:
        raise ValueError(f"unknown fault {fault!r}")


def _replace_router(gate: nn.Module, spec: MoeSpec, router: str, weights_dtype: torch.dtype | None) -> None:
    """The gate's forward with its logits in `router`'s dtype and its weights in `weights_dtype`."""
    logits_dtype = torch.float32 if router == "fp32" else torch.bfloat16
    if router not in ("fp32", "bf16"):
        raise ValueError(f"unknown router {router!r}")
    bias = getattr(gate, "e_score_correction_bias", None)
    groups, groups_kept = getattr(gate, "num_group", 1), getattr(gate, "topk_group", 1)

    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flat = hidden_states.reshape(-1, spec.hidden)
        logits = F.linear(flat.to(logits_dtype), gate.weight.to(logits_dtype))
        if bias is None:  # softmax top-k
            scores = torch.softmax(logits, dtype=torch.float32, dim=-1)
            top, ids = torch.topk(scores, spec.top_k, dim=-1)
        else:  # sigmoid, grouped top-k on the biased scores, weights from the unbiased ones
            scores = logits.float().sigmoid()
            choice = scores + bias.float()
            grouped = choice.view(-1, groups, spec.experts // groups)
            kept = torch.topk(grouped.topk(2, dim=-1)[0].sum(dim=-1), groups_kept, dim=-1)[1]
            mask = torch.zeros_like(grouped[..., 0]).scatter_(1, kept, 1.0).bool()
            choice = grouped.masked_fill(~mask[..., None], float("-inf")).view(-1, spec.experts)
            ids = torch.topk(choice, spec.top_k, dim=-1)[1]
            top = scores.gather(1, ids)
        if spec.norm_topk_prob:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        if bias is not None:
            top = top * gate.routed_scaling_factor
        return logits, top.to(weights_dtype or torch.float32), ids

    gate.forward = forward  # type: ignore[method-assign]


def tokens(spec: MoeSpec, count: int = 128, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, spec.vocab, (1, count), generator=torch.Generator().manual_seed(seed))


def dump(model: nn.Module, ids: torch.Tensor, out: Path) -> Path:
    """One prefill of `model` dumped as the transformers backend of `record` dumps it (router inputs too)."""
    writer = DumpWriter(str(out), DUMP_PATTERNS, [0])
    handles = [writer.hook(name, module) for name, module in model.named_modules() if writer.wanted(name)]
    try:
        writer.begin_step()
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
        writer.end_step()
    finally:
        for handle in handles:
            handle.remove()
    return out
