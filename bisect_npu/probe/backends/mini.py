"""Probe backend for the demo engine `tinyvllm` (the bundled demo upstream).

Runs inside the candidate environment: `tinyvllm` comes from sys.path (the candidate worktree or
the image), everything else is the standard library and relative imports.
"""

from __future__ import annotations

import contextlib
import os
import platform
from typing import Any

from ..identity import model_identity
from ..layer_dump import DumpWriter
from ..trials import SAMPLING_FIELDS, Stopwatch, TrialCounter, loop_detector, record_loop, run_once, top_logprobs_row

# Engine args that select the server layer instead of the offline engine.
_SERVER_ARGS = ("server", "override_generation_config")


# What the demo engine's steps can show, under the module and class names Hugging Face's
# Qwen3ForCausalLM (Qwen3MoeForCausalLM for its MoE variant) gives the same modules (its weights carry
# those names): the attention's input (input_layernorm's output), the attention's output, the MLP's
# (a dense layer's, an MoE block's, each expert call's), the router's, and the logits.
_DENSE_CLASSES = {"input_layernorm": "Qwen3RMSNorm", "self_attn": "Qwen3Attention", "mlp": "Qwen3MLP"}
_MOE_CLASSES = {"input_layernorm": "Qwen3MoeRMSNorm", "self_attn": "Qwen3MoeAttention", "mlp": "Qwen3MoeMLP",
                "experts": "Qwen3MoeMLP", "moe": "Qwen3MoeSparseMoeBlock", "gate": "Qwen3MoeTopKRouter"}
# The model's methods a dump wraps, where its commit has them (the MoE variant came later).
_WRAPPED = ("forward", "_attention", "_mlp", "_router", "_moe")


class MiniDump:
    """Layer dumps of the demo engine, whose model is plain functions over a weight dict (no modules to
    hook): its `forward`, `_attention` and, where the commit has them, `_mlp`, `_router` and `_moe` are
    wrapped on the model object for one trial, each forward call is a step, and tensors get the shapes
    Hugging Face's modules give them (a batch dimension; a router's `[tokens, experts]` as its own).
    A router is saved as `record` saves one: its logits, routing weights and chosen expert ids, and the
    hidden states it routed."""

    def __init__(self, model: Any, writer: DumpWriter) -> None:
        self.model, self.writer = model, writer
        self.wrapped = [name for name in _WRAPPED if hasattr(model, name)]
        self.classes = _MOE_CLASSES if getattr(model.config, "num_experts", 0) else _DENSE_CLASSES

    def __enter__(self) -> MiniDump:
        writer, model, classes = self.writer, self.model, self.classes
        forward, attention = model.forward, model._attention
        mlp: Any = getattr(model, "_mlp", None)
        router: Any = getattr(model, "_router", None)
        moe: Any = getattr(model, "_moe", None)

        def dumped_forward(token_ids: list[int], cache: Any) -> Any:
            writer.begin_step()
            logits = forward(token_ids, cache)
            if writer.wanted("lm_head"):
                writer.save("lm_head", "Linear", logits.unsqueeze(0))
            writer.end_step()
            return logits

        def dumped_attention(h: Any, positions: Any, cache: Any, layer: int, prefix: str) -> Any:
            out = attention(h, positions, cache, layer, prefix)
            for part, value in (("input_layernorm", h), ("self_attn", out)):
                name = f"{prefix}{part}"
                if writer.wanted(name):
                    writer.save(name, classes[part], value.unsqueeze(0))
            return out

        def dumped_mlp(h: Any, prefix: str, *args: Any, **kwargs: Any) -> Any:
            out = mlp(h, prefix, *args, **kwargs)
            name = prefix.rstrip(".")
            if writer.wanted(name):
                writer.save(name, classes["experts" if ".experts." in prefix else "mlp"], out.unsqueeze(0))
            return out

        def dumped_router(h: Any, prefix: str) -> Any:
            routed = router(h, prefix)
            name = f"{prefix}mlp.gate"
            if writer.wanted(name):
                writer.save(name, classes["gate"], routed, inputs=[h])
            return routed

        def dumped_moe(h: Any, prefix: str) -> Any:
            out = moe(h, prefix)
            name = f"{prefix}mlp"
            if writer.wanted(name):
                writer.save(name, classes["moe"], out.unsqueeze(0))
            return out

        wrappers = {"forward": dumped_forward, "_attention": dumped_attention, "_mlp": dumped_mlp,
                    "_router": dumped_router, "_moe": dumped_moe}
        for name in self.wrapped:
            setattr(model, name, wrappers[name])
        return self

    def __exit__(self, *_exc: object) -> None:
        for name in self.wrapped:  # the class's methods again
            delattr(self.model, name)


def _prompt(case: dict[str, Any]) -> str:
    if case.get("prompt") is not None:
        return str(case["prompt"])
    return "\n".join(f"{m['role']}: {m['content']}" for m in case.get("messages") or [])


class MiniEngine(TrialCounter):
    """One tinyvllm `LLM` (behind its `CompletionServer` in server mode) that runs trials in order.

    A request gets a fresh KV cache and generator anyway; what outlives it is the cumulative
    `spec_stats` (each trial reports its own counts, as a fresh start would) and the RoPE cos/sin
    cache, which is extended position by position to the same values a fresh start computes.
    """

    def __init__(self, request: dict[str, Any]) -> None:
        load = Stopwatch()
        import tinyvllm
        import torch
        from tinyvllm.engine import LLM

        args = dict((request.get("engine") or {}).get("args") or {})
        self.server_mode = bool(args.pop("server", False)) or "override_generation_config" in args
        self.override = args.pop("override_generation_config", None)
        self.args = args
        model = (request.get("model") or {}).get("path") or "seed:0"
        self.llm = LLM(model, **args)
        self.server: Any = None
        if self.server_mode:  # imported only here: from its minivllm adoption on, the server needs minivllm
            from tinyvllm.server import CompletionServer

            self.server = CompletionServer(self.llm, self.override)
        self.versions = {"tinyvllm": str(getattr(tinyvllm, "__version__", "unknown")),
                         "torch": str(torch.__version__), "python": platform.python_version()}
        self.load_s = load.seconds()

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        from tinyvllm.sampling_params import SamplingParams

        _, observation = self.begin_trial(request)
        llm = self.llm
        case = request.get("case") or {}
        sent = {k: v for k, v in (case.get("sampling") or {}).items() if v is not None}
        if "seed" not in sent and request.get("seed") is not None:
            sent["seed"] = request["seed"]
        top_k = int((request.get("logits") or {}).get("top_k") or sent.get("logprobs") or 0)
        if top_k:
            sent["logprobs"] = max(top_k, int(sent.get("logprobs") or 0))
        prompt = _prompt(case)
        prompt_ids = llm.tokenizer.encode(prompt)
        spec_before = (llm.spec_stats.proposed, llm.spec_stats.accepted)
        if self.server is not None:
            params, stream = self.server.complete(prompt, sent)
        else:
            params = SamplingParams.from_dict(sent)
            stream = llm.stream(prompt_ids, params)

        logits_spec = request.get("logits") or {}
        dumping: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if logits_spec.get("layers"):
            dump_dir = logits_spec.get("dump_dir") or os.path.splitext(request["output"])[0] + ".dump"
            dumping = MiniDump(llm.model, DumpWriter(dump_dir, list(logits_spec["layers"]), logits_spec.get("steps")))
            observation["logits_dump"] = dump_dir
        generate = Stopwatch()
        detector = loop_detector(request.get("loop_guard"))
        output_ids: list[int] = []
        top_logprobs: list[list[Any]] = []
        with dumping:
            for token in stream:
                output_ids.append(token.token_id)
                top_logprobs.append(top_logprobs_row(token.top_logprobs, top_k) if top_k else [])
                hit = detector.push(token.token_id) if detector is not None else None
                if hit is not None:
                    record_loop(observation, hit, "probe")
                    break
            else:
                observation["finish_reason"] = "length"
        observation["timings"]["generate_s"] = generate.seconds()

        observation["prompt_token_ids"] = prompt_ids
        observation["output_token_ids"] = output_ids
        observation["text"] = llm.tokenizer.decode(output_ids)
        observation["top_logprobs"] = top_logprobs if top_k else None
        observation["sampling"] = params.to_dict()
        config = llm.config
        observation["extra"]["model_identity"] = model_identity(llm.tokenizer.ids, config.vocab_size,
                                                                config.hidden_size, config.num_hidden_layers)
        observation["extra"]["stages"] = {
            "chat_template": prompt, "prompt_token_ids": prompt_ids, "forward": observation["logits_dump"],
            "sampler": {key: observation["sampling"].get(key) for key in SAMPLING_FIELDS},
            "text": observation["text"]}
        observation["extra"]["engine_args"] = {**self.args, "server_mode": self.server_mode,
                                               "override_generation_config": self.override}
        if llm.draft is not None:
            observation["extra"]["spec_decode"] = {"proposed": llm.spec_stats.proposed - spec_before[0],
                                                   "accepted": llm.spec_stats.accepted - spec_before[1]}
        return observation

    def close(self) -> None:
        """Nothing to stop: the engine lives in this process."""


def open_engine(request: dict[str, Any], trials: int = 1) -> MiniEngine:
    """Build the engine for the request's case; any number of trials can share it."""
    return MiniEngine(request)


def run_case(request: dict[str, Any]) -> dict[str, Any]:
    """One trial on its own engine start: a request without a batch."""
    return run_once(open_engine(request), request)[0]
