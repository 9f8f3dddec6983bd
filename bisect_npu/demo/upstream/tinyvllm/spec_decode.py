"""Speculative decoding: a layer-skip draft proposer and the standard rejection sampler."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import kernels
from .sampler import apply_penalties, processed_probs
from .sampling_params import SamplingParams


@dataclass
class SpecStats:
    proposed: int = 0
    accepted: int = 0


def target_distribution(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int],
                        history: list[int]) -> torch.Tensor:
    """The probabilities the target samples from at one position (one-hot when greedy)."""
    logits = apply_penalties(logits, params, prompt_ids, history)
    if params.greedy:
        return torch.nn.functional.one_hot(torch.tensor(kernels.argmax(logits)), logits.shape[-1]).float()
    return processed_probs(logits, params)


def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_ids: list[int],
                     generator: torch.Generator) -> list[int]:
    """Accept draft i with prob min(1, p/q); on rejection draw from norm(max(0, p - q)).

    target_probs: [k + 1, vocab] (the last row gives the bonus token), draft_probs: [k, vocab].
    Returns the accepted drafts followed by one recovered or bonus token.
    """
    out: list[int] = []
    for i, token in enumerate(draft_ids):
        p_token = target_probs[i, token].clone()
        # Mass the target puts elsewhere; a draft token holding all of it is accepted outright.
        target_probs[i, token] = 0.0
        mass_elsewhere = float(target_probs[i].sum())
        target_probs[i, token] = p_token
        q_token = float(draft_probs[i, token])
        accept = mass_elsewhere == 0.0 or float(torch.rand((), generator=generator)) * q_token < float(p_token)
        if accept:
            out.append(token)
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:
            residual = target_probs[i]
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[len(draft_ids)], 1, generator=generator)))
    return out
