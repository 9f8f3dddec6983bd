"""The family bench's MoE path on real MindStudio Probe dumps: a tiny HF MoE model dumped by msprobe's own
`PrecisionDebugger` (router logits, routing weights, expert ids as integers, and the experts' inputs),
judged as bench/family_bench.py judges its pairs."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.bench_module import load_bench

pytest.importorskip("torch")
pytest.importorskip("msprobe.pytorch")
tiny_moe = pytest.importorskip("tests.helpers.tiny_moe")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("family_bench")


def _pairs(bench: ModuleType, family: object, names: set[str]) -> dict[str, object]:
    return {pair.name: pair for pair in bench.pairs(family) if pair.name in names}


def test_clean_bf16_moe_in_msprobe_dumps_is_aligned_and_a_router_fault_is_named_at_the_gate(
        bench: ModuleType, tmp_path: Path) -> None:
    family = bench.MoeFamily("qwen3moe-test", tiny_moe.MoeSpec("qwen3_moe", hidden=64, layers=3, router_offset=20.0,
                                                               seed=3), 1.0, True, tokens=64)
    pairs = _pairs(bench, family, {"precision-bf16", "router_noise"})
    clean_cand, golden = bench.make_pair(tmp_path, pairs["precision-bf16"])
    fault_cand, _ = bench.make_pair(tmp_path, pairs["router_noise"])
    ids = sorted((clean_cand / "..").resolve().rglob("*output.2.pt"))
    assert ids, "msprobe must dump the router's chosen expert ids"
    flagged_clean = bench.first_module(clean_cand, golden, 8.0, 3.0)
    assert flagged_clean is None, f"a clean bf16 MoE against its fp32 golden was flagged at {flagged_clean}"
    flagged = bench.first_module(fault_cand, golden, 8.0, 3.0)
    assert flagged is not None and ".mlp.gate." in flagged and pairs["router_noise"].sits_in(flagged), flagged


@pytest.mark.heavy
def test_deepseek_family_bf16_router_named_and_weights_downcast_not_flagged(bench: ModuleType, tmp_path: Path) -> None:
    spec = tiny_moe.MoeSpec("deepseek_v3", hidden=128, layers=5, norm_topk_prob=False, router_offset=4.0,
                            router_scale=0.1, bias_scale=0.1, seed=1)
    family = bench.MoeFamily("deepseek-test", spec, 1.0, True)
    pairs = _pairs(bench, family, {"precision-bf16", "kernel", "router_bf16", "weights_downcast"})
    judged = {name: bench.first_module(*bench.make_pair(tmp_path, pair), 12.0, 5.0) for name, pair in pairs.items()}
    assert judged["precision-bf16"] is None and judged["kernel"] is None, judged
    assert pairs["router_bf16"].sits_in(judged["router_bf16"]), judged
    assert judged["weights_downcast"] is None, judged
