"""The offline engine: one request at a time, KV cache, async scheduling, speculative decoding."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import ModelConfig, load_model_config
from .model import Qwen3Model
from .sampler import sample
from .sampling_params import SamplingParams
from .spec_decode import SpecStats, rejection_sample, target_distribution
from .tokenizer import WordTokenizer

PLACEHOLDER = -1


@dataclass
class TokenOutput:
    token_id: int
    top_logprobs: list[tuple[int, float]]


@dataclass
class Request:
    prompt_token_ids: list[int]
    params: SamplingParams
    # The scheduler's view of the generated ids. Under async scheduling a step's sampled id is
    # still on the device when the next step is scheduled: it enters as PLACEHOLDER and must be
    # back-filled from `in_flight` before anything reads the history (the penalties do).
    output_token_ids: list[int] = field(default_factory=list)
    in_flight: deque[int] = field(default_factory=deque)


class LLM:
    """`LLM(model="seed:0", async_scheduling=True, speculative_config={...})`, like vllm.LLM."""

    def __init__(self, model: str | dict[str, Any] = "seed:0", async_scheduling: bool = False,
                 speculative_config: dict[str, Any] | None = None, max_model_len: int = 2048,
                 num_threads: int = 1, **unused: Any) -> None:
        if unused:
            raise ValueError(f"unknown engine args: {', '.join(sorted(unused))}")
        torch.set_num_threads(num_threads)
        self.config: ModelConfig = load_model_config(model)
        self.model = Qwen3Model(self.config)
        self.tokenizer = WordTokenizer(self.config.vocab_size)
        self.async_scheduling = async_scheduling
        self.max_model_len = max_model_len
        self.spec_tokens = 0
        self.draft: Qwen3Model | None = None
        if speculative_config:
            self.spec_tokens = int(speculative_config.get("num_speculative_tokens", 3))
            layers = int(speculative_config.get("draft_layers", 1))
            self.draft = Qwen3Model(self.config, self.model.w, num_layers=layers)
        self.spec_stats = SpecStats()

    def generate(self, prompt: str, params: SamplingParams) -> list[int]:
        return [out.token_id for out in self.stream(self.tokenizer.encode(prompt), params)]

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[TokenOutput]:
        """Yield generated tokens one by one; stop consuming to cancel the request."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt + max_tokens exceeds max_model_len={self.max_model_len}")
        generator = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
        request = Request(list(prompt_ids), params)
        if self.draft is not None:
            yield from self._stream_speculative(request, generator)
            return
        cache = self.model.new_cache(self.max_model_len)
        logits = self.model.forward(request.prompt_token_ids, cache)[-1]
        for _ in range(params.max_tokens):
            if self.async_scheduling:
                self._backfill(request)
            token = sample(logits, params, request.prompt_token_ids, request.output_token_ids, generator)
            self._record(request, token)
            yield TokenOutput(token, _top_logprobs(logits, params.logprobs))
            logits = self.model.forward([token], cache)[-1]

    def _record(self, request: Request, token: int) -> None:
        if self.async_scheduling:
            request.output_token_ids.append(PLACEHOLDER)
            request.in_flight.append(token)
        else:
            request.output_token_ids.append(token)

    @staticmethod
    def _backfill(request: Request) -> None:
        """Replace placeholders with the ids that have come back from the device, oldest first."""
        for i in range(len(request.output_token_ids) - len(request.in_flight), len(request.output_token_ids)):
            request.output_token_ids[i] = request.in_flight.popleft()

    def _stream_speculative(self, request: Request, generator: torch.Generator) -> Iterator[TokenOutput]:
        assert self.draft is not None
        params = request.params
        cache = self.model.new_cache(self.max_model_len + self.spec_tokens + 1)
        draft_cache = self.draft.new_cache(self.max_model_len + self.spec_tokens + 1)
        prompt = request.prompt_token_ids
        logits = self.model.forward(prompt, cache)[-1]
        self.draft.forward(prompt[:-1], draft_cache)
        last = prompt[-1]
        produced = 0
        while produced < params.max_tokens:
            if self.async_scheduling:
                self._backfill(request)
            history = list(request.output_token_ids)
            k = min(self.spec_tokens, params.max_tokens - produced - 1)
            draft_ids, draft_probs = self._propose(last, k, request, history, draft_cache, generator)
            target_logits = torch.cat((logits[None], self.model.forward(draft_ids, cache)[:k])) if k else logits[None]
            target_probs = torch.stack([
                target_distribution(target_logits[i], params, prompt, history + draft_ids[:i]) for i in range(k + 1)
            ])
            if params.greedy:
                accepted = _greedy_verify(target_probs, draft_ids)
            else:
                accepted = rejection_sample(target_probs, draft_probs, draft_ids, generator)
            self.spec_stats.proposed += k
            self.spec_stats.accepted += len(accepted) - 1
            base = len(prompt) + produced
            cache.truncate(base + len(accepted) - 1)
            draft_cache.truncate(base + len(accepted) - 1)
            for i, token in enumerate(accepted):
                self._record(request, token)
                produced += 1
                yield TokenOutput(token, _top_logprobs(target_logits[i], params.logprobs))
            last = accepted[-1]
            logits = self.model.forward([last], cache)[-1]

    def _propose(self, last: int, k: int, request: Request, history: list[int], draft_cache: Any,
                 generator: torch.Generator) -> tuple[list[int], torch.Tensor]:
        assert self.draft is not None
        params = request.params
        ids: list[int] = []
        probs = []
        token = last
        for _ in range(k + 1):
            logits = self.draft.forward([token], draft_cache)[-1]
            if len(ids) == k:
                break
            dist = target_distribution(logits, params, request.prompt_token_ids, history + ids)
            token = int(torch.multinomial(dist, 1, generator=generator)) if not params.greedy else int(dist.argmax())
            ids.append(token)
            probs.append(dist)
        stacked = torch.stack(probs) if probs else torch.zeros(0, self.config.vocab_size)
        return ids, stacked


def _greedy_verify(target_probs: torch.Tensor, draft_ids: list[int]) -> list[int]:
    out = []
    for i, token in enumerate(draft_ids):
        best = int(target_probs[i].argmax())
        if best != token:
            out.append(best)
            return out
        out.append(token)
    out.append(int(target_probs[len(draft_ids)].argmax()))
    return out


def _top_logprobs(logits: torch.Tensor, k: int | None) -> list[tuple[int, float]]:
    if not k:
        return []
    values, ids = torch.topk(torch.log_softmax(logits, dim=-1), k)
    return [(int(i), round(float(v), 6)) for i, v in zip(ids, values, strict=True)]

