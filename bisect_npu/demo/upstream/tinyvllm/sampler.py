"""Sampling with vLLM's order: penalties, greedy or (temperature, min_p, top_k/top_p, draw)."""

from __future__ import annotations

import torch

from . import kernels
from .sampling_params import SamplingParams


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int],
                    output_ids: list[int]) -> torch.Tensor:
    """Repetition penalty over prompt+output; presence/frequency over output only.

    Negative ids are async-scheduling placeholders: they are not tokens and count for nothing.
    """
    vocab = logits.shape[-1]
    output_counts = kernels.bin_counts(output_ids, vocab)
    if params.repetition_penalty != 1.0:
        seen = (kernels.bin_counts(prompt_ids, vocab) + output_counts) > 0
        penalised = torch.where(logits > 0, logits / params.repetition_penalty,
                                logits * params.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    if params.frequency_penalty:
        logits = logits - params.frequency_penalty * output_counts
    if params.presence_penalty:
        logits = logits - params.presence_penalty * (output_counts > 0).float()
    return logits


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a random draw uses: temperature, then min_p, then top_k and top_p."""
    logits = logits / params.temperature
    if params.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if params.top_k > 0:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - params.top_p
        drop[-1] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int],
           generator: torch.Generator) -> int:
    """One token id from raw logits [vocab] given the request's history."""
    logits = apply_penalties(logits, params, prompt_ids, output_ids)
    if params.greedy:
        return kernels.argmax(logits)
    probs = processed_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))
