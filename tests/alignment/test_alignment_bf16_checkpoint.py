"""`align` of a bf16 transformers record against its fp32 golden, both of one bf16 checkpoint made here
(random init scaled like a trained model, weights stored in bf16, as published ones are).

The golden's embedding output is bit-identical to the candidate's, so the first decoder layer's
input is exact and its bf16 output holds only what bf16 can: a clean candidate is aligned, and a
fault above bf16's resolution is still named at its layer."""

from __future__ import annotations

from typing import Any

import pytest

from bisect_npu import api
from tests.helpers.bf16_checkpoint import record, write_bf16_checkpoint

pytestmark = pytest.mark.e2e  # real transformers forward passes through `record`

pytest.importorskip("transformers")

# Per family: (the weight scaled, by how much, the decoder layer it sits in).
FAULTS = {"Qwen3": ("model.layers.3.mlp.down_proj.weight", 1.5, 3),
          "Llama": ("model.layers.2.self_attn.o_proj.weight", 1.25, 2)}


@pytest.fixture(scope="module", params=["Qwen3", pytest.param("Llama", marks=pytest.mark.heavy)])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp(f"bf16-{request.param}")
    model = write_bf16_checkpoint(root / "model", request.param)
    return {"name": request.param, "root": root, "golden": record(model, root / "fp32", "float32")}


def test_a_clean_bf16_record_is_aligned_with_the_fp32_golden_of_bf16_weights(family: dict[str, Any]) -> None:
    root = family["root"]
    candidate = record(root / "model", root / "bf16", "bfloat16")
    result = api.align(family["golden"], candidate)
    assert result.aligned, result.to_markdown()
    forward = result.cases[0].verdict.figures["stages"]["forward"]
    assert forward["matches"] and forward["tensors_compared"] >= 8


def test_a_fault_above_bf16s_resolution_is_named_at_its_layer(family: dict[str, Any]) -> None:
    weight, factor, layer = FAULTS[family["name"]]
    root = family["root"]
    faulty = write_bf16_checkpoint(root / "faulty-model", family["name"], faults={weight: factor})
    result = api.align(family["golden"], record(faulty, root / "bf16-faulty", "bfloat16"))
    assert not result.aligned and result.first is not None
    assert result.first.first_stage == "forward", result.to_markdown()
    assert (result.first.first_module or "").startswith(f"Module.model.layers.{layer}."), result.to_markdown()
