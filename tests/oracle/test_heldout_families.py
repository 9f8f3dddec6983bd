"""The dump diff on architectures the rules were not built on, through bench/heldout_family_bench.py's path: real
MindStudio Probe dumps of a tiny sliding-window Mistral (SDPA's boolean mask against eager's additive one) and of a
tiny Qwen2-MoE (a shared expert behind a sigmoid gate), judged with the shipped settings."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.bench_module import load_bench

pytest.importorskip("torch")
pytest.importorskip("msprobe.pytorch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.heavy  # four to six msprobe dumps of real models: a minute or more on shared cores


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("heldout_family_bench")


def _judge(bench: ModuleType, tmp_path: Path, family: object, name: str) -> tuple[object, str | None]:
    pair = next(pair for pair in bench.pairs(family) if pair.name == name)
    cand = bench.side_dump(tmp_path, family, pair.candidate, pair.fault)
    ref = bench.side_dump(tmp_path, family, pair.reference, None)
    return pair, bench.judge(cand, ref, None)[0]


def test_sliding_window_mistral_eager_against_sdpa_is_aligned_and_a_kv_head_fault_named(
        bench: ModuleType, tmp_path: Path) -> None:
    family = bench.HeldOut("mistral-test", "Mistral", 6, 128, 4, 2, 384, 48, 4.0, 5, extra={"sliding_window": 16})
    _, kernel = _judge(bench, tmp_path, family, "kernel")
    assert kernel is None, f"bf16 eager against bf16 SDPA flagged at {kernel}"
    pair, flagged = _judge(bench, tmp_path, family, "kv_head")
    assert pair.sits_in(flagged), flagged


def test_a_fault_in_qwen2_moes_shared_expert_is_named_there(bench: ModuleType, tmp_path: Path) -> None:
    family = bench.HeldOut("qwen2moe-test", "Qwen2Moe", 3, 64, 4, 2, 128, 64, 1.0, 6,
                           extra={"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                  "shared_expert_intermediate_size": 128, "norm_topk_prob": False}, moe=True, vocab=256)
    pair, flagged = _judge(bench, tmp_path, family, "shared_noise")
    assert flagged is not None and ".mlp.shared_expert." in flagged and pair.sits_in(flagged), flagged
