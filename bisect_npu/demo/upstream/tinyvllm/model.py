"""A Qwen3 decoder (RMSNorm, q/k norm per head, GQA, RoPE, SiLU-gated MLP, tied embeddings)."""

from __future__ import annotations

import torch

from .config import ModelConfig
from .rope import RotaryEmbedding
from .weights import init_weights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


class KVCache:
    """Per-layer key/value buffers; `length` tokens are valid. Truncating is rolling back."""

    def __init__(self, config: ModelConfig, num_layers: int, capacity: int) -> None:
        shape = (capacity, config.num_key_value_heads, config.head_dim)
        self.keys = [torch.zeros(shape) for _ in range(num_layers)]
        self.values = [torch.zeros(shape) for _ in range(num_layers)]
        self.length = 0

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


class Qwen3Model:
    """Forward passes over a KV cache; `num_layers` < config's gives a layer-skip draft model."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor] | None = None,
                 num_layers: int | None = None) -> None:
        self.config = config
        self.w = weights if weights is not None else init_weights(config)
        self.num_layers = num_layers or config.num_hidden_layers
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings,
                                    config.rope_scaling_factor)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.config, self.num_layers, capacity)

    @torch.inference_mode()
    def forward(self, token_ids: list[int], cache: KVCache) -> torch.Tensor:
        """Logits [len(token_ids), vocab] for tokens appended after the cache's valid prefix."""
        cfg, w = self.config, self.w
        start = cache.length
        n = len(token_ids)
        if start + n > cache.keys[0].shape[0]:
            raise ValueError(f"sequence of {start + n} tokens exceeds the KV cache ({cache.keys[0].shape[0]})")
        positions = torch.arange(start, start + n)
        x = w["model.embed_tokens.weight"][torch.tensor(token_ids)]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            x = x + self._attention(h, positions, cache, i, p)
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
            x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        cache.length = start + n
        x = rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
        return x @ w["model.embed_tokens.weight"].T

    def _attention(self, h: torch.Tensor, positions: torch.Tensor, cache: KVCache, layer: int,
                   p: str) -> torch.Tensor:
        cfg, w = self.config, self.w
        n, hd = h.shape[0], cfg.head_dim
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, cfg.num_attention_heads, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, cfg.num_key_value_heads, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, cfg.num_key_value_heads, hd)
        q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q, k = self.rope(positions, q, k)
        start = int(positions[0])
        cache.keys[layer][start:start + n] = k
        cache.values[layer][start:start + n] = v
        keys = cache.keys[layer][:start + n]
        values = cache.values[layer][:start + n]
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q.transpose(0, 1) @ keys.transpose(1, 2) * hd ** -0.5
        causal = torch.arange(start + n)[None, :] > positions[:, None]
        scores = scores.masked_fill(causal, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ values
        return out.transpose(0, 1).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
