"""The dump diff on real MindStudio Probe dumps of HF transformers' Qwen3 (report split of
tests/helpers/msprobe_qwen3.py).

The rules' settings were tuned on the tune split (other seeds, sizes and fault layers); these
tests hold them to the report split: no false alarm on three kinds of clean pair, every fault
named at its module, a bf16 candidate judged against an fp32 golden, a 2% gain found.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.compare import compare_dumps, judge_logits
from tests.helpers import msprobe_qwen3
from tests.helpers.paths import REPO_ROOT

PREFIX = "report-s-seed2"
PAIRS = {pair.name: pair for pair in msprobe_qwen3.pairs("report") if pair.name.startswith(PREFIX)}
CLEAN = [name for name, pair in PAIRS.items() if pair.fault is None]
FAULTY = [name for name, pair in PAIRS.items() if pair.fault is not None]
REPORT = {pair.name: pair for pair in msprobe_qwen3.pairs("report")}
# The dumps come from HF Qwen3 forward passes under real msprobe: end to end, not the edit-test loop.
FORWARD_PASSES = pytest.mark.e2e
FP32_GOLDEN = ("report-m-seed2-precision", "report-m-seed2-gain-fp32golden-l2")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every dump of the report split's first size and seed, and of the larger size's pairs against the
    fp32 golden (FP32_GOLDEN), written by real msprobe in one process of their own (msprobe keeps one
    debugger per process and hooks torch; one process pays torch's and msprobe's imports once)."""
    root = tmp_path_factory.mktemp("msprobe-qwen3")
    subprocess.run([sys.executable, "-m", "tests.helpers.msprobe_qwen3", str(root), "--split", "report",
                    "--only", ",".join([PREFIX, *FP32_GOLDEN])], check=True, capture_output=True, timeout=600,
                   cwd=REPO_ROOT)
    return root


def _judge(dumps: Path, name: str, cfg: LogitsConfig | None = None) -> tuple[msprobe_qwen3.Pair, object]:
    pair = PAIRS.get(name) or REPORT[name]
    cand, ref = msprobe_qwen3.make_pair(dumps, pair)  # already written: only the paths
    return pair, judge_logits(Observation(logits_dump=str(cand)), Observation(logits_dump=str(ref)),
                              cfg or LogitsConfig())


def test_the_split_has_three_kinds_of_clean_pair_and_every_fault() -> None:
    assert sorted(name.rsplit("-", 1)[1] for name in CLEAN) == ["kernel", "precision", "threads"]
    assert {PAIRS[name].fault for name in FAULTY} == set(msprobe_qwen3.FAULTS)


@FORWARD_PASSES
@pytest.mark.parametrize("name", CLEAN)
def test_clean_pairs_raise_no_false_alarm(dumps: Path, name: str) -> None:
    _, verdict = _judge(dumps, name)
    assert verdict.kind == VerdictKind.GOOD, verdict.reason  # type: ignore[attr-defined]


@FORWARD_PASSES
def test_the_fixed_line_holds_an_exact_input_layer_to_what_its_parts_carried(dumps: Path) -> None:
    """Without peers, layer 0 (its input exact) once met one rounding alone and the clean kernel pair was bad
    there; its own parts' distances, measured on the pair, are now its line."""
    pair = PAIRS[f"{PREFIX}-kernel"]
    cand, ref = msprobe_qwen3.make_pair(dumps, pair)
    result = compare_dumps(cand, ref, LogitsConfig(noise_from_peers=False))
    layer = next(row for row in result.rows if row.module is not None and row.module.startswith(
        "Module.model.layers.0.") and row.module.split(".")[4].endswith("DecoderLayer") and row.role == "output")
    parts = [1.0 - row.metrics["cosine"] for row in result.rows if row.role == "output" and "cosine" in row.metrics
             and row.module is not None and row.module.startswith("Module.model.layers.0.") and row.index < layer.index]
    assert 1.0 - layer.metrics["cosine"] > 2e-5, "layer 0 must lie above one bf16 rounding for this to mean anything"
    assert layer.noise_line is not None and layer.noise_line >= max(parts)
    assert layer.problem is None, layer.problem


@FORWARD_PASSES
@pytest.mark.parametrize("name", FAULTY)
def test_each_fault_is_named_at_its_module(dumps: Path, name: str) -> None:
    pair, verdict = _judge(dumps, name)
    assert verdict.kind == VerdictKind.BAD  # type: ignore[attr-defined]
    first = verdict.figures["first_divergent"]  # type: ignore[attr-defined]
    assert f".{pair.faulty_module}." in first["module"], verdict.reason  # type: ignore[attr-defined]
    assert first["name"].endswith(".output.0")


@FORWARD_PASSES
def test_a_bf16_candidate_is_judged_against_an_fp32_golden(dumps: Path) -> None:
    pair = PAIRS[f"{PREFIX}-precision"]
    cand, ref = msprobe_qwen3.make_pair(dumps, pair)
    result = compare_dumps(cand, ref, LogitsConfig())
    upcast = [row for row in result.rows if row.candidate_dtype == "bfloat16"]
    assert upcast and all(row.dtype == "bfloat16" and row.metrics for row in upcast)
    assert result.first_divergent is None


@FORWARD_PASSES
def test_a_2_percent_gain_cosine_cannot_see_is_found_by_its_norm_against_its_peers(dumps: Path) -> None:
    for name in (n for n in FAULTY if PAIRS[n].fault == "gain"):
        pair, verdict = _judge(dumps, name)
        first = verdict.figures["first_divergent"]  # type: ignore[attr-defined]
        assert first["rule"] == "norm_ratio" and f".{pair.faulty_module}." in first["module"]
        assert 1.015 < first["norm_ratio"] < 1.025 and first["cosine"] > 0.999
        noise = first["baseline"]["noise"]
        assert noise["statistic"] == "norm_change" and noise["peers"] >= 3
        assert noise["value"] > noise["line"] > noise["peer_median"]
        assert "peers' noise reaches" in verdict.reason  # type: ignore[attr-defined]


@FORWARD_PASSES
def test_a_module_is_not_judged_against_the_rotary_tables_of_another_precision(dumps: Path) -> None:
    """In a bf16 model the rotary cos/sin (cast from its own bf16 `inv_freq`) differ from the fp32 golden's
    more than the hidden state entering layer 0 does (a cast): that layer is measured against its hidden
    state, the input shaped like its output, so the clean pair is good and the gain after it is named."""
    clean, gain = FP32_GOLDEN
    cand, ref = msprobe_qwen3.make_pair(dumps, REPORT[clean])
    rows = compare_dumps(cand, ref, LogitsConfig()).rows
    layer0 = "Module.model.layers.0.Qwen3DecoderLayer.forward.0"
    cosine = {row.name.removeprefix(layer0 + "."): row.metrics["cosine"] for row in rows
              if row.module == layer0 and "cosine" in row.metrics}
    assert max(cosine["kwargs.position_embeddings.0"], cosine["kwargs.position_embeddings.1"]) < cosine["input.0"]
    _, verdict = _judge(dumps, clean)
    assert verdict.kind == VerdictKind.GOOD, verdict.reason  # type: ignore[attr-defined]
    pair, verdict = _judge(dumps, gain)
    first = verdict.figures["first_divergent"]  # type: ignore[attr-defined]
    assert f".{pair.faulty_module}." in first["module"], verdict.reason  # type: ignore[attr-defined]
