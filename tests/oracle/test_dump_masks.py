"""Attention masks in real MindStudio Probe dumps of a tiny HF Mistral (sliding-window attention): SDPA passes a
boolean mask, eager attention an additive one in the model's dtype, and a causal SDPA call none at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.compare import compare_dumps

torch = pytest.importorskip("torch")
pytest.importorskip("msprobe.pytorch")
transformers = pytest.importorskip("transformers")

from tests.helpers.msprobe_dump import DENSE_MODULES, msprobe_dump  # noqa: E402


def _mistral(dtype: Any, attn: str, window: int | None) -> Any:
    config = transformers.MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        sliding_window=window, max_position_embeddings=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    model.set_attn_implementation(attn)
    return model.to(dtype)


def _dump(tmp_path: Path, name: str, dtype: Any, attn: str, window: int | None) -> Path:
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    return msprobe_dump(_mistral(dtype, attn, window), ids, tmp_path / name, DENSE_MODULES, 1)


def _masks(rows: list[Any]) -> list[Any]:
    return [row for row in rows if row.name.endswith("attention_mask")]


def test_bool_and_additive_masks_of_one_window_agree_and_another_window_is_named(tmp_path: Path) -> None:
    eager = _dump(tmp_path, "eager", torch.bfloat16, "eager", 8)
    sdpa = _dump(tmp_path, "sdpa", torch.float32, "sdpa", 8)
    wider = _dump(tmp_path, "wider", torch.float32, "sdpa", 16)
    same = _masks(compare_dumps(eager, sdpa, LogitsConfig()).rows)
    assert same and all(row.problem is None and row.metrics["equal"] == 1.0 for row in same), \
        [(row.name, row.problem, row.metrics) for row in same]
    other = compare_dumps(eager, wider, LogitsConfig())
    first = other.first_divergent
    assert first is not None and first.name.endswith("layers.0.self_attn.MistralAttention.forward.0.kwargs."
                                                     "attention_mask"), first
    assert first.rule == "integer_equality" and 0.0 < first.metrics["equal"] < 1.0, first


def test_a_mask_the_candidates_kernel_leaves_to_itself_is_not_a_divergence(tmp_path: Path) -> None:
    eager = _dump(tmp_path, "eager", torch.float32, "eager", None)
    causal_sdpa = _dump(tmp_path, "sdpa", torch.float32, "sdpa", None)
    rows = compare_dumps(causal_sdpa, eager, LogitsConfig()).rows
    masks = _masks(rows)
    assert masks and all(row.problem is None for row in masks), [(row.name, row.problem) for row in masks]
