"""Rotary position embedding with linear scaling and a cos/sin cache that grows on demand."""

from __future__ import annotations

import torch


class RotaryEmbedding:
    def __init__(self, head_dim: int, base: float, max_position_embeddings: int, scaling_factor: float) -> None:
        self.head_dim = head_dim
        self.base = base
        self.scaling_factor = scaling_factor
        self.cos, self.sin = self._cos_sin(0, max_position_embeddings)

    def _inv_freq(self) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        return 1.0 / (self.base ** exponents) / self.scaling_factor

    def _cos_sin(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(start, end, dtype=torch.float32)
        freqs = torch.outer(positions, self._inv_freq())
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def _extend(self, length: int) -> None:
        """Long-sequence path: grow the cache past max_position_embeddings (doubling)."""
        new_length = self.cos.shape[0]
        while new_length < length:
            new_length *= 2
        cos, sin = self._cos_sin(self.cos.shape[0], new_length)
        self.cos = torch.cat((self.cos, cos))
        self.sin = torch.cat((self.sin, sin))

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [n, heads, head_dim], k: [n, kv_heads, head_dim] at `positions` [n]."""
        needed = int(positions.max()) + 1
        if needed > self.cos.shape[0]:
            self._extend(needed)
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
