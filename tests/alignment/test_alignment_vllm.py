"""`record` with real vLLM (CPU build) aligned against a transformers record of the same tiny Qwen3:
the field method on two real engines (make test-vllm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bisect_npu import api
from tests.helpers.tiny_qwen3 import write_tiny_qwen3
from tests.helpers.vllm_tier import VLLM_ENV, require_vllm

pytestmark = pytest.mark.vllm


def _recipe(path: Path, model: Path, engine: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "tiny-alignment", "model": {"path": str(model), "dtype": "float32"}, "engine": engine,
        "cases": [{"id": "chat", "messages": [{"role": "user", "content": "the quick brown fox jumps over"}],
                   "sampling": {"temperature": 0.0, "max_tokens": 12, "seed": 0, "logprobs": 5}}],
        # vLLM's Qwen3 names its attention as transformers does (its MLP is a Qwen2MLP there).
        "capture": {"layers": ["model.layers.*.self_attn"], "steps": [0]},
        "oracle": {"kinds": ["stages"]}, "reference": {"kind": "good_end"}}), encoding="utf-8")
    return path


def test_a_vllm_cpu_record_aligns_with_a_transformers_record_of_the_same_model(tmp_path: Path) -> None:
    python = require_vllm()
    model = write_tiny_qwen3(tmp_path / "tiny-qwen3", initializer_range=0.3)
    golden = api.record(_recipe(tmp_path / "hf.yaml", model, {"backend": "transformers",
                                                                 "args": {"device": "cpu", "flat_dumps": True}}),
                        tmp_path / "golden")
    vllm_recipe = _recipe(tmp_path / "vllm.yaml", model,
                          {"backend": "vllm", "args": {"max_model_len": 2048, "enforce_eager": True}})
    candidate = api.record(vllm_recipe, tmp_path / "vllm", python=str(python), env=VLLM_ENV)
    assert "vllm" in candidate.manifest["versions"] and golden.manifest["backend"] == "transformers"
    assert candidate.manifest["device"] == golden.manifest["device"] == "cpu"
    assert candidate.identity == golden.identity  # the same sizes and vocabulary, read by two engines

    result = api.align(golden, candidate)
    stages = result.cases[0].verdict.figures["stages"]
    # The chat template is the tokenizer's in both engines, and so are the ids it gives.
    assert stages["chat_template"]["matches"] and stages["prompt_token_ids"]["matches"], json.dumps(stages)
    assert stages["sampler"]["matches"], json.dumps(stages["sampler"])
    assert stages["forward"]["tensors_compared"] == 2 and stages["forward"]["matches"], json.dumps(stages["forward"])
    assert result.aligned, result.to_markdown()
