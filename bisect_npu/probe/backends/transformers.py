"""Probe backend for Hugging Face transformers: the reference a precision alignment trusts.

vllm-ascend's own e2e tests judge vLLM against transformers (`HfRunner`); this backend runs the
recipe's model the same way on whatever torch device the host has, so a reference can be recorded
on a GPU host, on the CPU, or on an NPU. Its own decode loop (one forward per token over the KV
cache) applies vLLM's sampling semantics, so the effective parameters and the tokens mean what a
vLLM run's do: penalties (repetition on prompt + output, presence and frequency on output), then
greedy, or temperature -> min_p -> top_k/top_p -> a draw from a generator seeded per request.
Top logprobs are those of the raw distribution, as vLLM reports them.

Engine args (`engine.args`): `device` (`auto`: cuda, else npu, else cpu; or any torch device),
`attn_implementation` (`sdpa`, `eager`, ...), `ignore_eos` (keep generating past the EOS token,
as the demo engine does), `flat_dumps` (dump tensors without their batch dimension of one, as
vLLM's modules see the batch: `[tokens, hidden]`, so the dumps line up with a vLLM run's).
Layer dumps (`logits.layers`, `logits.steps`) come from forward hooks on the modules whose names
match, in MindStudio Probe's layout (`..layer_dump`).

Runs inside the candidate environment: transformers and torch from there, the rest the standard
library and relative imports.
"""

from __future__ import annotations

import inspect
import os
import platform
from typing import Any

from ..identity import model_identity
from ..layer_dump import DumpWriter
from ..trials import (
    SAMPLING_FIELDS,
    Stopwatch,
    TrialCounter,
    accelerator,
    loop_detector,
    record_loop,
    run_once,
    top_logprobs_row,
)

# vLLM's neutral defaults: what a field not sent and not in the model's generation config means.
_VLLM_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                  "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                                  "max_tokens": 16, "seed": None, "logprobs": None}
# The generation-config keys vLLM takes as defaults (`get_diff_sampling_param`).
_GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
_ENGINE_ARGS = ("device", "attn_implementation", "ignore_eos", "flat_dumps")
_GREEDY_EPS = 1e-5


def pick_device(name: str) -> str:
    """`auto`: the accelerator the host has (cuda, then npu), else the CPU; anything else as given."""
    return accelerator() if name == "auto" else name


def _torch_dtype(name: str | None) -> Any:
    import torch

    if not name or name == "auto":
        return "auto"
    dtype = getattr(torch, {"half": "float16", "float": "float32"}.get(name, name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"model.dtype {name!r} is not a torch dtype (float32, bfloat16, float16)")
    return dtype


def apply_penalties(logits: Any, params: dict[str, Any], prompt_ids: list[int], output_ids: list[int]) -> Any:
    """vLLM's order: repetition penalty over prompt and output (divide positive logits, multiply
    negative ones), then frequency and presence penalties over the output only."""
    import torch

    logits = logits.clone()
    vocab = logits.shape[-1]
    if params["repetition_penalty"] != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
        seen[[t for t in prompt_ids + output_ids if 0 <= t < vocab]] = True
        penalty = float(params["repetition_penalty"])
        logits = torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)
    if output_ids and (params["frequency_penalty"] or params["presence_penalty"]):
        ids = torch.tensor(output_ids, device=logits.device)
        counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
        logits = logits - float(params["frequency_penalty"]) * counts
        logits = logits - float(params["presence_penalty"]) * (counts > 0).to(logits.dtype)
    return logits


def sample(logits: Any, params: dict[str, Any], generator: Any) -> int:
    """Greedy below temperature 1e-5, else temperature -> min_p -> top_k -> top_p -> a draw."""
    import torch

    if params["temperature"] < _GREEDY_EPS:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / float(params["temperature"]), dim=-1)
    if params["min_p"] > 0.0:
        probs = torch.where(probs < params["min_p"] * probs.max(), torch.zeros_like(probs), probs)
    top_k = int(params["top_k"] or 0)
    if 0 < top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if params["top_p"] < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        before = torch.cumsum(ordered, dim=-1) - ordered
        ordered = torch.where(before >= params["top_p"] * ordered.sum(), torch.zeros_like(ordered), ordered)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


class TransformersEngine(TrialCounter):
    """One `AutoModelForCausalLM` on one device; trials share it and each starts from an empty KV cache."""

    def __init__(self, request: dict[str, Any]) -> None:
        load = Stopwatch()
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        args = dict((request.get("engine") or {}).get("args") or {})
        unknown = sorted(set(args) - set(_ENGINE_ARGS))
        if unknown:
            raise ValueError(f"transformers backend: unknown engine args {', '.join(unknown)} "
                             f"(known: {', '.join(_ENGINE_ARGS)})")
        model = request.get("model") or {}
        path = model.get("path")
        if not path:
            raise ValueError("transformers backend: model.path must name a Hugging Face model directory or id")
        self.device = pick_device(str(args.get("device") or "auto"))
        self.ignore_eos = bool(args.get("ignore_eos", False))
        self.flat_dumps = bool(args.get("flat_dumps", False))
        kwargs: dict[str, Any] = {"dtype": _torch_dtype(model.get("dtype"))}
        if args.get("attn_implementation"):
            kwargs["attn_implementation"] = str(args["attn_implementation"])
        self.tokenizer = AutoTokenizer.from_pretrained(model.get("tokenizer") or path)
        loader: Any = AutoModelForCausalLM  # its from_pretrained's decorator types `self` as the first argument
        self.model: Any = loader.from_pretrained(path, **kwargs)
        self.model.to(self.device).eval()
        self.torch = torch
        # transformers 5.2x renamed the KV cache argument and output from `past_key_values` to `cache`.
        self.cache_key = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        config = self.model.config
        self.identity = model_identity(self.tokenizer.get_vocab(), config.vocab_size, config.hidden_size,
                                       config.num_hidden_layers)
        self.defaults = {key: value for key, value in self.model.generation_config.to_diff_dict().items()
                         if key in _GENERATION_CONFIG_KEYS and value is not None}
        self.versions = {"transformers": str(transformers.__version__), "torch": str(torch.__version__),
                         "python": platform.python_version()}
        self.load_s = load.seconds()

    def _render(self, case: dict[str, Any]) -> tuple[str, list[int]]:
        """The prompt text the model sees and its ids (the tokenizer's chat template for messages)."""
        if case.get("messages") is not None:
            text = str(self.tokenizer.apply_chat_template(case["messages"], tokenize=False,
                                                          add_generation_prompt=True))
            return text, list(self.tokenizer.encode(text, add_special_tokens=False))
        text = str(case.get("prompt") or "")
        return text, list(self.tokenizer.encode(text))

    def _sampling(self, request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The effective parameters and where each came from (request, generation_config, default)."""
        sent = {k: v for k, v in ((request.get("case") or {}).get("sampling") or {}).items() if v is not None}
        params, sources = {}, {}
        for key in SAMPLING_FIELDS:
            if key in sent:
                params[key], sources[key] = sent[key], "request"
            elif key in self.defaults:
                params[key], sources[key] = self.defaults[key], "generation_config"
            else:
                params[key], sources[key] = _VLLM_DEFAULTS[key], "default"
        if params["top_k"] == -1:
            params["top_k"] = 0
        return params, sources

    def _layout(self, output: Any) -> Any:
        """A module's output as dumped: with `flat_dumps`, each tensor without its batch dimension of one."""
        if not self.flat_dumps:
            return output
        if isinstance(output, (tuple, list)):
            return [self._layout(item) for item in output]
        is_batch_of_one = isinstance(output, self.torch.Tensor) and output.dim() > 1 and output.shape[0] == 1
        return output[0] if is_batch_of_one else output

    def _hooks(self, writer: DumpWriter) -> list[Any]:
        return [writer.hook(name, module, self._layout) for name, module in self.model.named_modules()
                if writer.wanted(name)]

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        _, observation = self.begin_trial(request)
        case = request.get("case") or {}
        logits_spec = request.get("logits") or {}
        params, sources = self._sampling(request)
        top_k = int(logits_spec.get("top_k") or params.get("logprobs") or 0)
        rendered, prompt_ids = self._render(case)
        writer = None
        handles: list[Any] = []
        if logits_spec.get("layers"):
            dump_dir = logits_spec.get("dump_dir") or os.path.splitext(request["output"])[0] + ".dump"
            writer = DumpWriter(dump_dir, list(logits_spec["layers"]), logits_spec.get("steps"))
            handles = self._hooks(writer)
            observation["logits_dump"] = dump_dir
        generator = torch.Generator(device=self.device)
        if params["seed"] is not None:
            generator.manual_seed(int(params["seed"]))
        eos = self.tokenizer.eos_token_id
        detector = loop_detector(request.get("loop_guard"))
        output_ids: list[int] = []
        rows: list[list[Any]] = []
        clock = Stopwatch()
        try:
            with torch.no_grad():
                past = None
                step_ids = prompt_ids
                observation["finish_reason"] = "length"
                for _ in range(int(params["max_tokens"])):
                    if writer is not None:
                        writer.begin_step()
                    out = self.model(input_ids=torch.tensor([step_ids], device=self.device), use_cache=True,
                                     **{self.cache_key: past})
                    if writer is not None:
                        writer.end_step()
                    past = getattr(out, self.cache_key)
                    logits = out.logits[0, -1].float()
                    if top_k:
                        values, ids = torch.topk(torch.log_softmax(logits, dim=-1), top_k)
                        rows.append(top_logprobs_row(list(zip(ids.tolist(), values.tolist(), strict=True)), top_k))
                    token = sample(apply_penalties(logits, params, prompt_ids, output_ids), params, generator)
                    output_ids.append(token)
                    hit = detector.push(token) if detector is not None else None
                    if hit is not None:
                        record_loop(observation, hit, "probe")
                        break
                    if token == eos and not self.ignore_eos:
                        observation["finish_reason"] = "stop"
                        observation["stop_reason"] = None
                        break
                    step_ids = [token]
        finally:
            for handle in handles:
                handle.remove()
        observation["timings"]["generate_s"] = clock.seconds()
        observation["prompt_token_ids"] = prompt_ids
        observation["output_token_ids"] = output_ids
        observation["text"] = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        observation["top_logprobs"] = rows if top_k else None
        observation["sampling"] = params
        observation["extra"].update({
            "engine_args": {"device": self.device, "dtype": str(self.model.dtype).removeprefix("torch."),
                            "attn_implementation": getattr(self.model.config, "_attn_implementation", None),
                            "ignore_eos": self.ignore_eos, "flat_dumps": self.flat_dumps},
            "sampling_sources": sources, "rendered_prompt": rendered, "model_identity": self.identity,
            "stages": {"chat_template": rendered, "prompt_token_ids": prompt_ids,
                       "forward": observation["logits_dump"], "sampler": params, "text": observation["text"]}})
        if writer is not None:
            observation["extra"]["dumped_modules"] = len(writer.modules)
        return observation

    def close(self) -> None:
        """Nothing to stop: the model lives in this process."""


def open_engine(request: dict[str, Any], trials: int = 1) -> TransformersEngine:
    """Load the model once for any number of trials (hooks are added and removed per trial)."""
    return TransformersEngine(request)


def run_case(request: dict[str, Any]) -> dict[str, Any]:
    """One trial on its own engine start: a request without a batch."""
    return run_once(open_engine(request), request)[0]
