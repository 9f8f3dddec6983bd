"""Offline vLLM backend: `LLM(...)` with the recipe's engine args, one case, one observation per trial.

Drives vLLM the way users do (`LLM.chat` / `LLM.generate`). When a loop guard is asked and the
installed vLLM has no `repetition_detection` (or the request asks for the probe's own detector),
the case runs through the engine step by step so the request can be aborted the moment the
detector fires: a 32K loop then costs seconds.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ..identity import model_identity
from ..layer_dump import DumpWriter
from ..trials import (
    SAMPLING_FIELDS,
    Stopwatch,
    TrialCounter,
    accelerator,
    engine_versions,
    loop_detector,
    record_loop,
    run_once,
    top_logprobs_row,
)

DEFAULT_TOP_K = 5


# vLLM takes -1 for "logprobs of the whole vocabulary" from 0.10.1 on; before, it refuses negative
# values (v0.9.x, the vLLM of vllm-ascend 0.9) and needs the vocabulary's size instead.
WHOLE_VOCABULARY_SINCE = (0, 10, 1)


def whole_vocabulary(model_path: str, vllm_version: str | None) -> int:
    """The `logprobs`/`max_logprobs` value that asks for every token's logprob on this vLLM."""
    numbers = [int(part) for part in re.findall(r"\d+", (vllm_version or "").split("+")[0])[:3]]
    if not numbers or tuple(numbers) >= WHOLE_VOCABULARY_SINCE:
        return -1
    config = os.path.join(model_path, "config.json")
    try:
        with open(config, encoding="utf-8") as handle:
            data = json.load(handle)
        return int(data.get("vocab_size") or data["text_config"]["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"logits.full_logits on vLLM {vllm_version} needs the vocabulary size, read from "
                         f"{config} ({exc}); use a local model directory or upgrade to vLLM >= 0.10.1") from None


def engine_kwargs(request: dict[str, Any], whole_vocab: int = -1) -> dict[str, Any]:
    """`LLM(...)` keyword arguments: the model, then the recipe's engine args verbatim.

    ``whole_vocab`` is ``whole_vocabulary``'s answer, for a request that captures full logits."""
    model = request["model"]
    kwargs: dict[str, Any] = {"model": model["path"]}
    if model.get("dtype") and model["dtype"] != "auto":
        kwargs["dtype"] = model["dtype"]
    if model.get("tokenizer"):
        kwargs["tokenizer"] = model["tokenizer"]
    if request.get("seed") is not None:
        kwargs["seed"] = request["seed"]
    kwargs.update(request.get("engine", {}).get("args", {}))
    logits = request.get("logits") or {}
    if logits.get("full_logits"):
        kwargs.setdefault("max_logprobs", whole_vocab)  # the whole vocabulary per step
    if logits.get("layers"):
        kwargs["enforce_eager"] = True  # forward hooks see every layer only outside compiled graphs
    if "speculative_config" in kwargs:
        kwargs.setdefault("disable_log_stats", False)  # acceptance counters come from the stats
    return kwargs


class LayerDump:
    """Forward hooks that write layer outputs in MindStudio Probe's dump layout.

    `step{N}/rank{R}/dump.json` plus `dump_tensor_data/<name>.output.<i>.pt` (`..layer_dump`), one
    step per forward pass of the whole model (step 0 is the prefill). `LLM.apply_model` reaches the model only with
    the engine in this process (vLLM 0.9: `VLLM_ENABLE_V1_MULTIPROCESSING=0`; later versions would
    otherwise ship this object to the engine process through msgpack), so the engine sets that for
    a request with layers unless the recipe's environment says otherwise; under tensor parallelism
    each worker writes its own rank directory.
    """

    def __init__(self, dump_dir: str, patterns: list[str], steps: list[int] | None) -> None:
        self.dump_dir = dump_dir
        self.patterns = patterns
        self.steps = set(steps if steps is not None else [0])

    def __call__(self, model: Any) -> int:
        import torch

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        writer = DumpWriter(self.dump_dir, self.patterns, sorted(self.steps), rank)
        hooked = 0
        for name, module in model.named_modules():
            if writer.wanted(name):
                writer.hook(name, module)
                hooked += 1
        model.register_forward_pre_hook(lambda _module, _args: writer.begin_step())
        model.register_forward_hook(lambda _module, _args, _output: writer.end_step())
        return hooked


def native_repetition_detection() -> Any:
    """vLLM's `RepetitionDetectionParams` class, or None where this vLLM predates it."""
    import vllm.sampling_params as sampling_params

    return getattr(sampling_params, "RepetitionDetectionParams", None)


def use_engine_guard(request: dict[str, Any], detection_cls: Any) -> bool:
    """Whether vLLM's own repetition_detection can stand in for the probe's detector.

    Only when this vLLM has it, the recipe did not ask for the probe's detector, and vLLM's rule
    is the same as ours: vLLM has no `min_covered_tokens`, so a guard that needs a longer loop
    than min_count * min_pattern_size tokens stays with the probe (else "\n\n\n\n" would stop it).
    """
    guard = request.get("loop_guard")
    if not guard or detection_cls is None:
        return False
    mode = guard.get("mode") or request.get("engine", {}).get("loop_guard", "engine")
    covered = int(guard.get("min_covered_tokens", 0))
    return mode == "engine" and covered <= int(guard.get("min_count", 3)) * int(guard.get("min_pattern_size", 1))


def server_defaults(llm: Any) -> dict[str, Any]:
    """The sampling defaults vLLM derives from the model's generation config and overrides."""
    model_config = llm.llm_engine.model_config
    getter = getattr(model_config, "get_diff_sampling_param", None)
    return dict(getter()) if getter else {}


def sampling_kwargs(request: dict[str, Any], defaults: dict[str, Any],
                    whole_vocab: int = -1) -> tuple[dict[str, Any], dict[str, str]]:
    """Keyword arguments for `SamplingParams`: the engine's defaults, then what the case sets.

    Returns the kwargs and where each came from ("request" or "default"), so a dropped default
    is visible in the observation.
    """
    case_sampling = request["case"].get("sampling", {})
    kwargs = {key: value for key, value in defaults.items() if key in SAMPLING_FIELDS}
    sources = dict.fromkeys(kwargs, "default")
    for key, value in case_sampling.items():
        if value is not None:
            kwargs[key] = value
            sources[key] = "request"
    logits = request.get("logits") or {}
    if logits.get("full_logits"):
        kwargs["logprobs"] = whole_vocab
    elif "logprobs" not in kwargs:
        kwargs["logprobs"] = int(logits.get("top_k", DEFAULT_TOP_K))
    if kwargs.get("seed") is None and request.get("seed") is not None:
        kwargs["seed"] = request["seed"]
        sources["seed"] = "request"
    return kwargs, sources


def effective_sampling(params: Any) -> dict[str, Any]:
    """Read back what the engine applied from the SamplingParams object itself."""
    applied = {field: getattr(params, field, None) for field in SAMPLING_FIELDS}
    detection = getattr(params, "repetition_detection", None)
    if detection is not None:
        applied["repetition_detection"] = {
            key: getattr(detection, key) for key in ("min_pattern_size", "max_pattern_size", "min_count")
            if hasattr(detection, key)}
    return applied


def _render(llm: Any, case: dict[str, Any]) -> tuple[str, list[int]]:
    """The prompt text the model sees and its token ids (chat template applied for messages)."""
    tokenizer = llm.get_tokenizer()
    if case.get("messages") is not None:
        text = tokenizer.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=True)
        return text, list(tokenizer.encode(text, add_special_tokens=False))
    return case["prompt"], list(tokenizer.encode(case["prompt"]))


def _model_identity(llm: Any) -> dict[str, Any] | None:
    """The model's sizes and vocabulary digest (a record's same-model check); None where this vLLM
    does not expose its model config on the `LLM`."""
    model_config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    config = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    if config is None:
        return None
    return model_identity(llm.get_tokenizer().get_vocab(), config.vocab_size, config.hidden_size,
                          config.num_hidden_layers)


def _logprob_rows(step_logprobs: list[Any] | None, k: int) -> list[list[list[Any]]] | None:
    if not step_logprobs:
        return None
    return [top_logprobs_row([(token, lp.logprob) for token, lp in step.items()], k) for step in step_logprobs]


def _save_full_logprobs(step_logprobs: list[Any], dump_dir: str) -> str:
    """Full-vocabulary log-probabilities, [steps, vocab], as an `lm_head` op in the dump layout.

    It sits under `full_logits/step0/rank0/` so the logits oracle indexes it next to the layer
    dumps and compares it with KL divergence and top-k overlap.
    """
    import torch

    vocab = max(len(step) for step in step_logprobs)
    table = torch.full((len(step_logprobs), vocab), float("-inf"))
    for row, step in enumerate(step_logprobs):
        for token, lp in step.items():
            if token < vocab:
                table[row, token] = lp.logprob
    rank_dir = os.path.join(dump_dir, "full_logits", "step0", "rank0")
    data_dir = os.path.join(rank_dir, "dump_tensor_data")
    os.makedirs(data_dir, exist_ok=True)
    data_name = "lm_head.logprobs.output.0.pt"
    torch.save(table, os.path.join(data_dir, data_name))
    entry = {"type": "torch.Tensor", "dtype": str(table.dtype), "shape": list(table.shape), "data_name": data_name}
    with open(os.path.join(rank_dir, "dump.json"), "w", encoding="utf-8") as fh:
        json.dump({"task": "tensor", "level": "L0", "framework": "pytorch", "dump_data_dir": data_dir,
                   "data": {"Module.lm_head.logprobs.forward.0": {"output": [entry]}}}, fh)
    return dump_dir


def _generate(llm: Any, case: dict[str, Any], params: Any) -> Any:
    if case.get("messages") is not None:
        return llm.chat(case["messages"], params, use_tqdm=False)[0]
    return llm.generate([case["prompt"]], params, use_tqdm=False)[0]


def _generate_streaming(llm: Any, prompt_ids: list[int], params: Any, detector: Any,
                        observation: dict[str, Any], request_id: str) -> Any:
    """Step the engine, push each new token to the detector, abort the request when it fires."""
    engine = llm.llm_engine
    engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, params)
    seen = 0
    last = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id != request_id:
                continue
            last = output
            tokens = list(output.outputs[0].token_ids)
            for token in tokens[seen:]:
                hit = detector.push(token)
                if hit is not None:
                    engine.abort_request([request_id])
                    record_loop(observation, hit, detected_by="probe")
                    return last
            seen = len(tokens)
    return last


_SPEC_DECODE_METRICS = {"vllm:spec_decode_num_drafts": "num_drafts",
                        "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
                        "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}


def _spec_decode_totals(llm: Any) -> dict[str, float]:
    """vLLM's draft/accept counters as they stand: Prometheus counters, cumulative over the process."""
    get_metrics = getattr(llm, "get_metrics", None)
    if get_metrics is None:
        return {}
    return {_SPEC_DECODE_METRICS[m.name]: float(m.value) for m in get_metrics()
            if m.name in _SPEC_DECODE_METRICS and hasattr(m, "value")}


def spec_decode_counters(after: dict[str, float], before: dict[str, float]) -> dict[str, float] | None:
    """One trial's draft/accept counters: the totals after it less the totals before it."""
    if not after:
        return None
    counters = {name: value - before.get(name, 0.0) for name, value in after.items()}
    drafted = counters.get("num_draft_tokens", 0.0)
    counters["acceptance_rate"] = counters.get("num_accepted_tokens", 0.0) / drafted if drafted else 0.0
    # The acceptance oracle's names: draft tokens proposed, and how many the target accepted.
    return {**counters, "proposed": int(drafted), "accepted": int(counters.get("num_accepted_tokens", 0.0))}


def _reset_prefix_cache(llm: Any) -> bool:
    """Drop the KV blocks earlier trials left for reuse; False where this vLLM cannot (or refused)."""
    reset = getattr(llm, "reset_prefix_cache", None)
    if reset is None:
        return False
    return reset() is not False  # older vLLMs return None: the reset ran


class VllmEngine(TrialCounter):
    """One `LLM(...)` that runs trials in order, each seeing the engine as a fresh start would.

    Between trials the prefix cache is reset (a later trial must not reuse the KV blocks of an
    earlier one) and the spec-decode counters are reported per trial. Layer-dump hooks cannot be
    removed once `apply_model` registered them, so a request with `logits.layers` runs one trial.
    """

    def __init__(self, request: dict[str, Any], trials: int = 1) -> None:
        logits = request.get("logits") or {}
        if logits.get("layers"):
            if trials > 1:
                raise ValueError("logits.layers registers layer-dump hooks that stay for the engine's life: "
                                 f"such a request runs one trial per engine start, not a batch of {trials}")
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # see LayerDump
        from vllm import LLM

        self.versions = engine_versions()
        self.whole_vocab = (whole_vocabulary(request["model"]["path"], self.versions.get("vllm"))
                            if logits.get("full_logits") else -1)
        clock = Stopwatch()
        self.kwargs = engine_kwargs(request, self.whole_vocab)
        self.llm = LLM(**self.kwargs)
        self.load_s = clock.seconds()

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        from vllm import SamplingParams

        index, observation = self.begin_trial(request)
        llm, kwargs = self.llm, self.kwargs
        if index:
            observation["extra"]["prefix_cache_reset"] = _reset_prefix_cache(llm)
        case = request["case"]
        logits = request.get("logits") or {}
        top_k = int(logits.get("top_k", DEFAULT_TOP_K))

        defaults = server_defaults(llm)
        sampling, sources = sampling_kwargs(request, defaults, self.whole_vocab)
        guard = request.get("loop_guard")
        detection_cls = native_repetition_detection()
        use_native = use_engine_guard(request, detection_cls)
        if use_native:
            assert guard is not None  # use_engine_guard is False without a loop_guard
            sampling["repetition_detection"] = detection_cls(
                min_pattern_size=int(guard.get("min_pattern_size", 1)),
                max_pattern_size=int(guard.get("max_pattern_size", 20)),
                min_count=int(guard.get("min_count", 3)))
        params = SamplingParams(**sampling)
        rendered, prompt_ids = _render(llm, case)
        dump_dir = logits.get("dump_dir") or os.path.splitext(request["output"])[0] + ".dump"
        if logits.get("layers"):
            hooked = llm.apply_model(LayerDump(dump_dir, list(logits["layers"]), logits.get("steps")))
            observation["logits_dump"] = dump_dir
            observation["extra"]["dumped_modules"] = hooked

        spec_before = _spec_decode_totals(llm) if "speculative_config" in kwargs else {}
        clock = Stopwatch()
        if guard and not use_native:
            output = _generate_streaming(llm, prompt_ids, params, loop_detector(guard), observation,
                                         request_id=f"bisect-npu-{index}")
        else:
            output = _generate(llm, case, params)
        observation["timings"]["generate_s"] = clock.seconds()

        completion = output.outputs[0]
        observation["prompt_token_ids"] = list(output.prompt_token_ids or prompt_ids)
        observation["output_token_ids"] = list(completion.token_ids)
        observation["text"] = completion.text
        if observation["stop_reason"] is None:
            observation["finish_reason"] = completion.finish_reason
            stop = completion.stop_reason
            observation["stop_reason"] = stop if stop is None or isinstance(stop, str) else str(stop)
        observation["top_logprobs"] = _logprob_rows(completion.logprobs, top_k)
        if logits.get("full_logits") and completion.logprobs:
            observation["logits_dump"] = _save_full_logprobs(completion.logprobs, dump_dir)
        observation["sampling"] = effective_sampling(params)
        observation["extra"].update({
            "engine_args": {key: value for key, value in kwargs.items() if key != "model"},
            "server_defaults": defaults,
            "sampling_sources": sources,
            "rendered_prompt": rendered,
            "loop_guard": "vllm" if use_native else ("probe" if guard else None),
            "model_identity": _model_identity(llm),
            "device": accelerator(),
        })
        observation["extra"]["stages"] = {
            "chat_template": rendered, "prompt_token_ids": observation["prompt_token_ids"],
            "forward": observation["logits_dump"], "sampler": observation["sampling"], "text": observation["text"]}
        if "speculative_config" in kwargs:
            observation["extra"]["spec_decode"] = spec_decode_counters(_spec_decode_totals(llm), spec_before)
        return observation

    def close(self) -> None:
        """Drop the engine, as the end of a one-trial probe always did (the process exit does the rest)."""
        self.llm = None


def open_engine(request: dict[str, Any], trials: int = 1) -> VllmEngine:
    """Load the model for `trials` trials of the request's case (engine args from this request)."""
    return VllmEngine(request, trials)


def run_case(request: dict[str, Any]) -> dict[str, Any]:
    """One trial on its own engine start: a request without a batch."""
    return run_once(open_engine(request), request)[0]
