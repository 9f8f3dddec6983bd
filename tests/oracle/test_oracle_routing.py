"""MoE routing as evidence, on real tiny HF Qwen3-MoE and DeepSeek-V3 dumps made on the CPU.

The routers here are peaked like a trained model's (a large logit part shared by every expert, which
bf16 resolves coarsely), so bf16 moves the choice of several tokens and a router computed in bf16
where the reference routes in fp32 moves clearly more than rounding elsewhere does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bisect_npu.errors import UsageError
from bisect_npu.observations import VerdictKind
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.compare import compare_dumps, verdict_from_comparison
from bisect_npu.oracle.dumps.routing import RouterSide, compare_routing

torch = pytest.importorskip("torch")
tiny_moe = pytest.importorskip("tests.helpers.tiny_moe")

PEAKED = 20.0


def _dumps(root: Path, family: str, variants: dict[str, dict]) -> dict[str, Path]:
    spec = tiny_moe.MoeSpec(family=family, router_offset=PEAKED, seed=0)
    ids = tiny_moe.tokens(spec)
    return {name: tiny_moe.dump(tiny_moe.build_model(spec, **kwargs), ids, root / name)
            for name, kwargs in variants.items()}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    bf16 = torch.bfloat16
    return _dumps(tmp_path_factory.mktemp("qwen3-moe"), "qwen3_moe", {
        "golden": {"dtype": torch.float32}, "bf16": {"dtype": bf16}, "eager": {"dtype": bf16, "attn": "eager"},
        "fp32_router": {"dtype": bf16, "router": "fp32", "weights_dtype": bf16},
        "bf16_router": {"dtype": bf16, "router": "bf16", "weights_dtype": bf16}})


def _judge(cand: Path, ref: Path):
    result = compare_dumps(cand, ref, LogitsConfig())
    return result, verdict_from_comparison(result)


def test_clean_bf16_moe_against_its_fp32_golden_is_aligned_and_says_what_flipped(qwen: dict[str, Path]) -> None:
    result, verdict = _judge(qwen["bf16"], qwen["golden"])
    flips = sum(len(report.flips) for report in result.routing)
    assert flips > 0, "the pair must move some choices for this test to mean anything"
    assert verdict.kind is VerdictKind.GOOD, verdict.reason
    assert "within its rounding noise" in verdict.reason and "routed alike" in verdict.reason
    layers = verdict.figures["routing"]["layers"]
    assert {layer["module"] for layer in layers} == {"model.layers.1.mlp.gate", "model.layers.2.mlp.gate"}
    assert all(flip["margin"] <= flip["noise"] or layer["unexplained"] <= 1 for layer in layers
               for flip in layer["flips"])


def test_bf16_sdpa_against_bf16_eager_is_aligned(qwen: dict[str, Path]) -> None:
    result, verdict = _judge(qwen["eager"], qwen["bf16"])
    assert verdict.kind is VerdictKind.GOOD, verdict.reason
    assert any(report.flips for report in result.routing)


def test_router_in_bf16_where_the_reference_routes_in_fp32_is_named_at_the_router(qwen: dict[str, Path]) -> None:
    result, verdict = _judge(qwen["bf16_router"], qwen["fp32_router"])
    assert verdict.kind is VerdictKind.BAD
    first = result.first_divergent
    assert first is not None and first.rule == "routing"
    assert first.name.startswith("Module.model.layers.1.mlp.gate.")
    assert "of tokens route to another expert set; rounding explains at most" in verdict.reason


def test_expert_ids_are_compared_as_sets_never_by_cosine(qwen: dict[str, Path], tmp_path: Path) -> None:
    """The same choices listed in another order are no flip, where cosine over the ids would fire."""
    import shutil

    cand = Path(shutil.copytree(qwen["golden"], tmp_path / "reordered"))
    for ids_file in (cand / "step0" / "rank0" / "dump_tensor_data").glob("*mlp.gate*.output.2.pt"):
        ids = torch.load(ids_file)
        torch.save(ids.flip(-1).contiguous(), ids_file)
    for weights_file in (cand / "step0" / "rank0" / "dump_tensor_data").glob("*mlp.gate*.output.1.pt"):
        torch.save(torch.load(weights_file).flip(-1).contiguous(), weights_file)
    result, verdict = _judge(cand, qwen["golden"])
    assert all(not report.flips for report in result.routing)
    assert verdict.kind is VerdictKind.GOOD, verdict.reason


def test_a_dump_without_router_outputs_is_judged_as_before_and_says_routing_was_not_checked(
        qwen: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    dumps = {}
    for name in ("golden", "eager"):
        dumps[name] = Path(shutil.copytree(qwen[name], tmp_path / name))
        index = dumps[name] / "step0" / "rank0" / "dump.json"
        doc = json.loads(index.read_text())
        doc["data"] = {key: op for key, op in doc["data"].items() if ".mlp.gate." not in key}
        index.write_text(json.dumps(doc))
    result, verdict = _judge(dumps["eager"], dumps["golden"])
    assert not result.routing
    assert "routing could not be checked at 2 MoE layers (model.layers.1.mlp (Qwen3MoeSparseMoeBlock)" in verdict.reason


def _side(experts: int, k: int, tokens: int = 16) -> RouterSide:
    logits = np.random.default_rng(0).normal(size=(tokens, experts))
    return RouterSide(logits=logits, logits_dtype="float32", ids=np.argsort(-logits, axis=1)[:, :k])


@pytest.mark.parametrize(("cand", "words"), [(_side(6, 2), "over 6 experts, the reference over 8"),
                                             (_side(8, 3), "picks 3 experts per token, the reference 2")])
def test_dumps_of_other_expert_counts_or_top_k_are_refused_in_one_line(cand: RouterSide, words: str) -> None:
    with pytest.raises(UsageError) as refused:
        compare_routing(cand, _side(8, 2), "model.layers.1.mlp.gate")
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.heavy
def test_clean_bf16_deepseek_v3_router_with_groups_bias_and_shared_experts_is_aligned(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, "deepseek_v3", {"golden": {"dtype": torch.float32},
                                              "bf16": {"dtype": torch.bfloat16}})
    result, verdict = _judge(dumps["bf16"], dumps["golden"])
    assert verdict.kind is VerdictKind.GOOD, verdict.reason
    assert len(result.routing) == 2
