"""`record` with real vLLM (CPU build) aligned against a transformers record of the same tiny model, the
whole forward pass captured on both sides and lined up by the module map: attention and its
projections, MLP or MoE block, router, experts, norms and decoder layers (make test-vllm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bisect_npu import api
from bisect_npu.alignment.align import Alignment
from bisect_npu.alignment.record import Record
from tests.helpers.tiny_qwen3 import write_tiny_model, write_with_fault
from tests.helpers.vllm_tier import VLLM_ENV, require_vllm

pytestmark = pytest.mark.vllm

# The whole model: `*` matches dots too, so every module under each layer is dumped.
LAYERS = ["model.embed_tokens", "model.layers.*", "model.norm", "lm_head"]


def _recipe(path: Path, model: Path, engine: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "tiny-alignment", "model": {"path": str(model), "dtype": "float32"}, "engine": engine,
        "cases": [{"id": "chat", "messages": [{"role": "user", "content": "the quick brown fox jumps over"}],
                   "sampling": {"temperature": 0.0, "max_tokens": 12, "seed": 0, "logprobs": 5}}],
        "capture": {"layers": LAYERS, "steps": [0]},
        "oracle": {"kinds": ["stages"]}, "reference": {"kind": "good_end"}}), encoding="utf-8")
    return path


def record_transformers(model: Path, out: Path) -> Record:
    engine = {"backend": "transformers", "args": {"device": "cpu", "flat_dumps": True}}
    return api.record(_recipe(out.with_suffix(".yaml"), model, engine), out)


def record_vllm(model: Path, out: Path) -> Record:
    engine = {"backend": "vllm", "args": {"max_model_len": 2048, "enforce_eager": True}}
    return api.record(_recipe(out.with_suffix(".yaml"), model, engine), out, python=str(require_vllm()), env=VLLM_ENV)


@pytest.fixture(scope="module", params=["Qwen3", "Qwen3Moe", "Llama"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny model of the family, recorded once by vLLM and once by transformers."""
    require_vllm()
    root = tmp_path_factory.mktemp(f"align-{request.param}")
    model = write_tiny_model(root / "model", request.param, initializer_range=0.3)
    return {"name": request.param, "model": model, "root": root,
            "transformers": record_transformers(model, root / "transformers"),
            "vllm": record_vllm(model, root / "vllm")}


def compared(result: Alignment) -> set[str]:
    lined = result.cases[0].lined_up
    assert lined is not None, result.to_markdown()
    return {point.op.split(".forward.")[0].removeprefix("Module.") for point in lined.points}


def test_a_vllm_cpu_record_aligns_with_a_transformers_record_across_the_forward_pass(family: dict[str, Any]) -> None:
    golden, candidate = family["transformers"], family["vllm"]
    assert "vllm" in candidate.manifest["versions"] and golden.manifest["backend"] == "transformers"
    assert candidate.manifest["device"] == golden.manifest["device"] == "cpu"
    assert candidate.identity == golden.identity  # the same sizes and vocabulary, read by two engines

    result = api.align(golden, candidate)
    stages = result.cases[0].verdict.figures["stages"]
    # The chat template is the tokenizer's in both engines, and so are the ids it gives.
    assert stages["chat_template"]["matches"] and stages["prompt_token_ids"]["matches"], json.dumps(stages)
    assert stages["sampler"]["matches"], json.dumps(stages["sampler"])
    assert stages["forward"]["matches"], json.dumps(stages["forward"])
    assert result.aligned, result.to_markdown()
    lined = result.cases[0].lined_up
    assert lined is not None, result.to_markdown()
    assert not (lined.unknown or lined.only_candidate or lined.only_reference or lined.left_out), lined.summary()
    names = compared(result)
    prefix = family["name"]
    for layer in (0, 1):
        assert {f"model.layers.{layer}.{module}" for module in (
            f"{prefix}DecoderLayer", f"input_layernorm.{prefix}RMSNorm", f"self_attn.{prefix}Attention",
            "self_attn.q_proj.Linear", "self_attn.k_proj.Linear", "self_attn.v_proj.Linear", "self_attn.o_proj.Linear",
            f"post_attention_layernorm.{prefix}RMSNorm")} <= names
    assert {"model.embed_tokens.Embedding", f"model.norm.{prefix}RMSNorm"} <= names
    dense = "model.layers.0.mlp.{}MLP"
    assert {dense.format(prefix), "model.layers.0.mlp.gate_proj.Linear", "model.layers.0.mlp.up_proj.Linear",
            "model.layers.0.mlp.down_proj.Linear"} <= names
    if family["name"] == "Qwen3Moe":  # layer 1 is a sparse MoE block: router logits, experts, block
        assert {"model.layers.1.mlp.Qwen3MoeSparseMoeBlock", "model.layers.1.mlp.gate.Qwen3MoeTopKRouter",
                "model.layers.1.mlp.experts.Qwen3MoeExperts"} <= names
    assert stages["forward"]["tensors_compared"] == len(lined.points) == len(names)
    assert lined.families == [{"Qwen3Moe": "Qwen3-MoE"}.get(family["name"], family["name"])]


# One fault per family, each in another module kind: (the weight scaled by 1.5, the module it feeds).
FAULTS = {"Llama": ("model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.o_proj"),
          "Qwen3": ("model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj"),
          "Qwen3Moe": ("model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate")}


def test_a_fault_in_the_transformers_golden_is_named_at_its_module(family: dict[str, Any]) -> None:
    weight, first = FAULTS[family["name"]]
    faulty = write_with_fault(family["model"], family["root"] / "faulty-model", weight, 1.5)
    golden = record_transformers(faulty, family["root"] / "transformers-faulty")
    result = api.align(golden, family["vllm"])
    assert not result.aligned and result.first is not None
    assert result.first.first_stage == "forward", result.to_markdown()
    module = result.first.first_module or ""
    assert module.startswith(f"Module.{first}.") and module.endswith(".forward.0"), result.to_markdown()
    assert (result.first.first_vllm_module or "").startswith(f"{first} ("), result.to_markdown()
