"""Deterministic weights from a seed, named as in Hugging Face's Qwen3ForCausalLM."""

from __future__ import annotations

import torch

from .config import ModelConfig

# Small embeddings and a large final-norm gain: the next token depends on the context (attention
# and MLP), not on the current token's own embedding, and the distributions are peaked enough that
# greedy and low-temperature decoding fall into loops that penalties are needed to break.
EMBED_STD = 0.15
FINAL_NORM_GAIN = 3.0
QK_NORM_GAIN = 2.0


def init_weights(config: ModelConfig) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(config.seed)
    h, hd, inter = config.hidden_size, config.head_dim, config.intermediate_size
    nq, nkv = config.num_attention_heads, config.num_key_value_heads

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    weights = {"model.embed_tokens.weight": normal(config.vocab_size, h, std=EMBED_STD)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = 1.0 + normal(h, std=0.05)
        weights[p + "post_attention_layernorm.weight"] = 1.0 + normal(h, std=0.05)
        weights[p + "self_attn.q_proj.weight"] = normal(nq * hd, h, std=h ** -0.5)
        weights[p + "self_attn.k_proj.weight"] = normal(nkv * hd, h, std=h ** -0.5)
        weights[p + "self_attn.v_proj.weight"] = normal(nkv * hd, h, std=h ** -0.5)
        weights[p + "self_attn.o_proj.weight"] = normal(h, nq * hd, std=(nq * hd) ** -0.5)
        weights[p + "self_attn.q_norm.weight"] = QK_NORM_GAIN + normal(hd, std=0.1)
        weights[p + "self_attn.k_norm.weight"] = QK_NORM_GAIN + normal(hd, std=0.1)
        weights[p + "mlp.gate_proj.weight"] = normal(inter, h, std=h ** -0.5)
        weights[p + "mlp.up_proj.weight"] = normal(inter, h, std=h ** -0.5)
        weights[p + "mlp.down_proj.weight"] = normal(h, inter, std=inter ** -0.5)
    weights["model.norm.weight"] = FINAL_NORM_GAIN + normal(h, std=0.05)
    return weights
