"""The demo engine's MoE variant and its router-precision regression.

Late on main, after every other case's range (so no existing commit changes), tinyvllm gains a
Qwen3-MoE model option (`num_experts` in the model config: every layer's MLP becomes a softmax
top-k router over SiLU-gated experts, named as transformers' `Qwen3MoeForCausalLM` names them).
Its router computes its logits in fp32, as vllm-ascend forces its MoE router GEMM to. A clean
commit then reorders the experts' arithmetic (fp32 rounding moves, nothing else); a later
`[Perf]` commit runs the router GEMM in bf16, and a fix restores fp32.

The router's weights hold a part every expert shares (as a trained router's do): softmax ignores
it, but bf16 rounds the logits at its magnitude, so bf16 flips the expert choice of the tokens
whose k-th and (k+1)-th scores lie within a few hundredths, where the fp32 reference's own
rounding reaches a few millionths. The case's recipe (`demo-moe-router`) compares layer dumps
against the good end and names the router (`model.layers.0.mlp.gate`).
"""

from __future__ import annotations

from bisect_npu.demo.patches import Change, Patch

# The recipe's model: the demo model with 8 experts, 2 per token.
MOE_MODEL = '{"num_experts": 8, "num_experts_per_tok": 2}'

_CONFIG_BEFORE = """    max_position_embeddings: int = 128
    seed: int = 0
"""
_CONFIG_AFTER = """    max_position_embeddings: int = 128
    # Mixture of experts (Qwen3-MoE): num_experts > 0 makes every layer's MLP a softmax top-k
    # router over that many SiLU-gated experts of moe_intermediate_size.
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    norm_topk_prob: bool = True
    seed: int = 0
"""

_WEIGHTS_CONSTANTS = """QK_NORM_GAIN = 2.0
"""
_WEIGHTS_CONSTANTS_MOE = """QK_NORM_GAIN = 2.0
# A trained router's logits share a large part across experts (a direction every expert's row
# holds): softmax ignores it, the logits' magnitude (and their rounding) does not.
ROUTER_SHARED = 20.0
"""
_WEIGHTS_DENSE = """        weights[p + "mlp.gate_proj.weight"] = normal(inter, h, std=h ** -0.5)
        weights[p + "mlp.up_proj.weight"] = normal(inter, h, std=h ** -0.5)
        weights[p + "mlp.down_proj.weight"] = normal(h, inter, std=inter ** -0.5)
    weights["model.norm.weight"] = FINAL_NORM_GAIN + normal(h, std=0.05)
    return weights
"""
_WEIGHTS_MOE = """        if config.num_experts:
            shared = normal(h, std=ROUTER_SHARED * h ** -0.5)
            weights[p + "mlp.gate.weight"] = normal(config.num_experts, h, std=h ** -0.5) + shared
            for e in range(config.num_experts):
                weights.update(_mlp_weights(f"{p}mlp.experts.{e}.", h, config.moe_intermediate_size, normal))
        else:
            weights.update(_mlp_weights(p + "mlp.", h, inter, normal))
    weights["model.norm.weight"] = FINAL_NORM_GAIN + normal(h, std=0.05)
    return weights


def _mlp_weights(p: str, h: int, inter: int, normal: Callable[..., torch.Tensor]) -> dict[str, torch.Tensor]:
    return {p + "gate_proj.weight": normal(inter, h, std=h ** -0.5),
            p + "up_proj.weight": normal(inter, h, std=h ** -0.5),
            p + "down_proj.weight": normal(h, inter, std=inter ** -0.5)}
"""
_WEIGHTS_IMPORTS = """from __future__ import annotations

import torch
"""
_WEIGHTS_IMPORTS_MOE = """from __future__ import annotations

from collections.abc import Callable

import torch
"""

_MODEL_DOC = '"""A Qwen3 decoder (RMSNorm, q/k norm per head, GQA, RoPE, SiLU-gated MLP, tied embeddings)."""\n'
_MODEL_DOC_MOE = ('"""A Qwen3 decoder (RMSNorm, q/k norm per head, GQA, RoPE, SiLU-gated MLP, tied embeddings), and\n'
                  'Qwen3-MoE (the MLP a softmax top-k mixture of experts) when the config has experts."""\n')
_MODEL_MLP = """            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
"""
_MODEL_MLP_MOE = """            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            x = x + (self._moe(h, p) if cfg.num_experts else self._mlp(h, p + "mlp."))
"""
_MODEL_ATTENTION = """    def _attention(self, h: torch.Tensor, positions: torch.Tensor, cache: KVCache, layer: int,
"""
_ROUTER_FP32 = """        logits = h.float() @ self.w[p + "mlp.gate.weight"].float().T
"""
_ROUTER_BF16 = """        logits = h.to(torch.bfloat16) @ self.w[p + "mlp.gate.weight"].to(torch.bfloat16).T
"""
_EXPERTS_AFTER = """            y = self._mlp(h[rows], f"{p}mlp.experts.{expert}.")
            out.index_add_(0, rows, y * weights[rows, slot, None])
"""
_EXPERTS_BEFORE_DOWN = """            scale = weights[rows, slot, None]
            out.index_add_(0, rows, self._mlp(h[rows], f"{p}mlp.experts.{expert}.", scale=scale))
"""
_MLP_UNSCALED = '''    def _mlp(self, h: torch.Tensor, p: str) -> torch.Tensor:
        """A SiLU-gated MLP (a dense layer's, or one expert's) under the weight prefix `p`."""
        w = self.w
        gate = torch.nn.functional.silu(h @ w[p + "gate_proj.weight"].T)
        return (gate * (h @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T
'''
_MLP_SCALED = '''    def _mlp(self, h: torch.Tensor, p: str, scale: torch.Tensor | None = None) -> torch.Tensor:
        """A SiLU-gated MLP (a dense layer's, or one expert's) under the weight prefix `p`; an expert's
        routing weight (`scale`) is applied before the down projection."""
        w = self.w
        gate = torch.nn.functional.silu(h @ w[p + "gate_proj.weight"].T)
        act = gate * (h @ w[p + "up_proj.weight"].T)
        return (act if scale is None else act * scale) @ w[p + "down_proj.weight"].T
'''
_MOE_METHODS = _MLP_UNSCALED + '''
    def _router(self, h: torch.Tensor, p: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Qwen3-MoE's softmax top-k: the router logits [n, experts], and per token the routing weights
        and the chosen experts' ids [n, k]. The gate GEMM runs in fp32 whatever the model computes in:
        the top k of nearly tied scores must not depend on rounding."""
        cfg = self.config
''' + _ROUTER_FP32 + '''        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(scores, cfg.num_experts_per_tok, dim=-1)
        if cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(h.dtype), ids

    def _moe(self, h: torch.Tensor, p: str) -> torch.Tensor:
        """Each token through the experts its router chose, weighted by the router."""
        _, weights, ids = self._router(h, p)
        out = torch.zeros_like(h)
        for expert in ids.unique().tolist():
            rows, slot = (ids == expert).nonzero(as_tuple=True)
''' + _EXPERTS_AFTER + '''        return out

'''

FEATURE = Change(
    "[Feature] Qwen3-MoE: softmax top-k experts (`num_experts` in the model config)",
    (Patch("tinyvllm/config.py", _CONFIG_BEFORE, _CONFIG_AFTER),
     Patch("tinyvllm/weights.py", _WEIGHTS_IMPORTS, _WEIGHTS_IMPORTS_MOE),
     Patch("tinyvllm/weights.py", _WEIGHTS_CONSTANTS, _WEIGHTS_CONSTANTS_MOE),
     Patch("tinyvllm/weights.py", _WEIGHTS_DENSE, _WEIGHTS_MOE),
     Patch("tinyvllm/model.py", _MODEL_DOC, _MODEL_DOC_MOE),
     Patch("tinyvllm/model.py", _MODEL_MLP, _MODEL_MLP_MOE),
     Patch("tinyvllm/model.py", _MODEL_ATTENTION, _MOE_METHODS + _MODEL_ATTENTION)),
    "Every layer's MLP becomes a router over `num_experts` SiLU-gated experts, `num_experts_per_tok` "
    "of them per token, weights named as transformers' Qwen3MoeForCausalLM. The router GEMM runs in "
    "fp32.",
)
# Clean: the same arithmetic in another order (fp32 rounding moves, the routing does not).
WEIGHT_BEFORE_DOWN = Change(
    "[Perf] Apply the routing weight before the experts' down projection",
    (Patch("tinyvllm/model.py", _MLP_UNSCALED, _MLP_SCALED),
     Patch("tinyvllm/model.py", _EXPERTS_AFTER, _EXPERTS_BEFORE_DOWN)),
    "Scaling the narrower activation saves a multiply per hidden element.",
)
CULPRIT = Change(
    "[Perf] Run the MoE router GEMM in bfloat16",
    (Patch("tinyvllm/model.py", _ROUTER_FP32, _ROUTER_BF16),),
    "The gate is a skinny GEMM: bf16 operands halve its memory traffic, and the softmax still runs in fp32.",
)
FIX = Change(
    "[BugFix] Keep the MoE router GEMM in fp32",
    (Patch("tinyvllm/model.py", _ROUTER_BF16, _ROUTER_FP32),),
    "bf16 router logits moved tokens whose top-k scores nearly tie to other experts: the logits carry a "
    "part every expert shares, and bf16 rounds them at its magnitude.",
)
