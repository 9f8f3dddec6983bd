"""The dump rules as one family: declared order, a verdict that names the rule and where its line came from,
and a rule added as one class that the comparison runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps import rules
from bisect_npu.oracle.dumps.compare import compare_dumps, judge_logits, write_dump
from bisect_npu.oracle.dumps.rows import TensorDiff
from bisect_npu.oracle.dumps.rules.base import Context, Finding, ModuleRule


def stack(root: Path, broken: int | None = None, size: float = 0.05, seed: int = 0) -> Path:
    """Eight layers' outputs of a residual stack (float32) with rounding-sized noise; `broken` adds an error
    of `size` (relative norm) to that layer's output alone."""
    rng, noise = np.random.default_rng(0), np.random.default_rng(seed)
    state = rng.standard_normal((16, 64)).astype(np.float32)
    tensors = []
    for layer in range(8):
        w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
        out = np.tanh(state @ w) * (1 + 1e-3 * noise.standard_normal((16, 64))).astype(np.float32)
        if layer == broken:
            err = noise.standard_normal(out.shape).astype(np.float32)
            out = out + err * (size * np.linalg.norm(out) / np.linalg.norm(err))
        tensors.append((f"model.layers.{layer}.mlp", out.astype(np.float32)))
        state = state + out
    return write_dump(root, tensors).parent


def test_the_rules_run_in_their_declared_order_each_named_with_what_it_measures() -> None:
    names = [rule.name for rule in (*rules.TENSOR_RULES, *rules.MODULE_RULES)]
    assert names[0] == "absolute" and names[1] == "msprobe_amplification"
    assert all(rule.measures for rule in (*rules.TENSOR_RULES, *rules.MODULE_RULES))


def test_a_peer_rule_verdict_names_its_rule_and_that_its_line_was_measured_on_the_pair(tmp_path: Path) -> None:
    ref, cand = stack(tmp_path / "ref", seed=1), stack(tmp_path / "cand", broken=5, seed=2)
    assert compare_dumps(stack(tmp_path / "clean", seed=3), ref, LogitsConfig()).first_divergent is None
    verdict = judge_logits(Observation(logits_dump=str(cand)), Observation(logits_dump=str(ref)), LogitsConfig())
    first = verdict.figures["first_divergent"]
    assert verdict.kind == VerdictKind.BAD and first["layer"] == 5
    assert first["rule"] == "cosine_amplification"
    assert first["provenance"].startswith("measured on the pair: 6 peers")
    assert "dump_noise_bench" in first["provenance"] and first["provenance"] in verdict.reason


def test_an_absolute_line_names_the_tool_that_set_it(tmp_path: Path) -> None:
    ref = stack(tmp_path / "ref", seed=1)
    cand = stack(tmp_path / "cand", broken=0, size=1.0, seed=2)
    first = compare_dumps(cand, ref, LogitsConfig()).first_divergent
    assert first is not None and first.rule == "absolute" and "msprobe" in (first.provenance or "")


class _AnyDriftAtLayerThree(ModuleRule):
    name: ClassVar[str] = "layer_three"
    measures: ClassVar[str] = "a rule made here: any output of layer 3"

    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        return Finding(self.name, "layer 3", "this test") if row.layer == 3 else None


def test_a_new_rule_is_one_class_the_comparison_runs_in_its_place(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    ref, cand = stack(tmp_path / "ref", seed=1), stack(tmp_path / "cand", seed=2)
    assert compare_dumps(cand, ref, LogitsConfig()).first_divergent is None
    monkeypatch.setattr(rules, "MODULE_RULES", (*rules.MODULE_RULES, _AnyDriftAtLayerThree()))
    first = compare_dumps(cand, ref, LogitsConfig()).first_divergent
    assert first is not None and first.layer == 3 and first.rule == "layer_three" and first.provenance == "this test"
