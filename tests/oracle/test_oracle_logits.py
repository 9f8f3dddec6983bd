"""Dump diff: metrics, the first divergent tensor, both dump formats, and corrupt dumps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.compare import compare_dumps, judge_logits, open_dump, write_dump
from tests.helpers.paths import DATA

LAYERS = 6


def model_tensors(seed: int = 0, broken_layer: int | None = None, scale: float = 0.3) -> list[tuple[str, np.ndarray]]:
    """A small decoder's per-layer outputs; an error injected at one layer propagates to the later ones."""
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((16, 64)).astype(np.float32)
    noise = np.random.default_rng(99)
    out = []
    for layer in range(LAYERS):
        attn = np.tanh(hidden @ rng.standard_normal((64, 64)).astype(np.float32) / 8)
        if layer == broken_layer:
            attn = attn + scale * noise.standard_normal(attn.shape).astype(np.float32)
        hidden = hidden + attn
        out += [(f"model.layers.{layer}.self_attn.output", attn), (f"model.layers.{layer}.output", hidden)]
    logits = hidden @ rng.standard_normal((64, 100)).astype(np.float32)
    out.append(("lm_head.logits", logits))
    return out


def test_metrics_and_clean_pass(tmp_path: Path) -> None:
    write_dump(tmp_path / "a", model_tensors(), logits=("lm_head.logits",))
    write_dump(tmp_path / "b", model_tensors(), logits=("lm_head.logits",))
    result = compare_dumps(tmp_path / "a", tmp_path / "b", LogitsConfig())
    assert result.first_divergent is None
    last = result.rows[-1]
    assert last.metrics["cosine"] == pytest.approx(1.0)
    assert last.metrics["kl"] == pytest.approx(0.0, abs=1e-12) and last.metrics["top_k_overlap"] == 1.0
    assert last.metrics["within_1e3"] == 1.0


def test_injected_error_names_the_first_divergent_layer(tmp_path: Path) -> None:
    write_dump(tmp_path / "ref", model_tensors(), logits=("lm_head.logits",))
    write_dump(tmp_path / "bad", model_tensors(broken_layer=3), logits=("lm_head.logits",))
    obs = Observation(logits_dump=str(tmp_path / "bad"))
    ref = Observation(logits_dump=str(tmp_path / "ref"))
    verdict = judge_logits(obs, ref, LogitsConfig())
    assert verdict.kind == VerdictKind.BAD
    first = verdict.figures["first_divergent"]
    assert first["name"] == "model.layers.3.self_attn.output" and first["layer"] == 3
    assert first["cosine"] < 0.99
    assert "layer 3" in verdict.reason


def write_msprobe_dump(root: Path, tensors: list[tuple[str, np.ndarray]], dtype: torch.dtype = torch.bfloat16) -> Path:
    """The layout MindStudio Probe writes (step0/rank0/dump.json + dump_tensor_data/*.pt)."""
    rank = root / "step0" / "rank0"
    data_dir = rank / "dump_tensor_data"
    data_dir.mkdir(parents=True)
    data: dict[str, dict] = {}
    for name, array in tensors:
        op = f"Module.{name.rsplit('.', 1)[0]}.forward.0"
        data_name = f"{op}.output.0.pt"
        tensor = torch.from_numpy(array).to(dtype)
        torch.save(tensor, data_dir / data_name)
        data[op] = {"input_args": [], "input_kwargs": {}, "output": [
            {"type": "torch.Tensor", "dtype": str(tensor.dtype), "shape": list(tensor.shape),
             "Max": float(tensor.float().max()), "data_name": data_name}]}
    dump_json = rank / "dump.json"
    dump_json.write_text(json.dumps({"task": "tensor", "level": "L0", "framework": "pytorch",
                                     "dump_data_dir": str(data_dir), "data": data}), encoding="utf-8")
    return dump_json


def test_msprobe_format_first_divergent_tensor(tmp_path: Path) -> None:
    write_msprobe_dump(tmp_path / "ref", model_tensors())
    write_msprobe_dump(tmp_path / "bad", model_tensors(broken_layer=4))
    result = compare_dumps(tmp_path / "bad", tmp_path / "ref", LogitsConfig())
    first = result.first_divergent
    assert first is not None and first.layer == 4
    assert first.name == "Module.model.layers.4.self_attn.forward.0.output.0"
    assert list(open_dump(tmp_path / "ref")) == ["step0/rank0"]


def test_missing_tensor_shape_and_dtype_mismatch_are_divergences(tmp_path: Path) -> None:
    tensors = model_tensors()
    write_dump(tmp_path / "ref", tensors)
    write_dump(tmp_path / "missing", tensors[:3] + tensors[4:])
    first = compare_dumps(tmp_path / "missing", tmp_path / "ref", LogitsConfig()).first_divergent
    assert first is not None and first.name == tensors[3][0] and "missing" in (first.problem or "")
    reshaped = [(n, a.reshape(-1) if i == 2 else a) for i, (n, a) in enumerate(tensors)]
    write_dump(tmp_path / "shape", reshaped)
    first = compare_dumps(tmp_path / "shape", tmp_path / "ref", LogitsConfig()).first_divergent
    assert first is not None and first.index == 2 and "shape" in (first.problem or "")
    retyped = [(n, a.astype(np.int32) if i == 1 else a) for i, (n, a) in enumerate(tensors)]
    write_dump(tmp_path / "dtype", retyped)
    first = compare_dumps(tmp_path / "dtype", tmp_path / "ref", LogitsConfig()).first_divergent
    assert first is not None and first.index == 1 and "dtype int32" in (first.problem or "")


def test_a_lower_precision_candidate_is_upcast_and_judged_at_its_precision(tmp_path: Path) -> None:
    tensors = model_tensors()
    write_dump(tmp_path / "ref", tensors)
    write_dump(tmp_path / "fp16", [(n, a.astype(np.float16)) for n, a in tensors])
    result = compare_dumps(tmp_path / "fp16", tmp_path / "ref", LogitsConfig())
    assert result.first_divergent is None
    assert all(row.dtype == "float16" and row.candidate_dtype == "float16" and row.metrics for row in result.rows)
    assert result.rows[0].to_dict()["candidate_dtype"] == "float16"
    # Upcast is not a pass: an error far above fp16's rounding is still found.
    broken = model_tensors(broken_layer=2)
    write_dump(tmp_path / "fp16-broken", [(n, a.astype(np.float16)) for n, a in broken])
    first = compare_dumps(tmp_path / "fp16-broken", tmp_path / "ref", LogitsConfig()).first_divergent
    assert first is not None and first.layer == 2


def test_nan_in_candidate_diverges(tmp_path: Path) -> None:
    tensors = model_tensors()
    poisoned = [(n, a.copy()) for n, a in tensors]
    poisoned[5][1][0, 0] = np.nan
    poisoned[5][1][1, 1] = np.inf
    write_dump(tmp_path / "ref", tensors)
    write_dump(tmp_path / "nan", poisoned)
    first = compare_dumps(tmp_path / "nan", tmp_path / "ref", LogitsConfig()).first_divergent
    assert first is not None and first.index == 5 and "2 NaN/Inf" in (first.problem or "")


def test_corrupt_dumps_raise_usage_errors_naming_file_and_tensor(tmp_path: Path) -> None:
    tensors = model_tensors()
    write_dump(tmp_path / "ref", tensors)
    manifest = write_dump(tmp_path / "cut", tensors)
    manifest.write_text(manifest.read_text()[:200])
    with pytest.raises(UsageError, match=r"manifest.json: not valid JSON"):
        compare_dumps(tmp_path / "cut", tmp_path / "ref", LogitsConfig())
    write_dump(tmp_path / "gone", tensors)
    (tmp_path / "gone" / "00002.npy").unlink()
    with pytest.raises(UsageError, match=r"00002.npy: file of tensor 'model.layers.1.self_attn.output'"):
        compare_dumps(tmp_path / "gone", tmp_path / "ref", LogitsConfig())
    write_dump(tmp_path / "trunc", tensors)
    path = tmp_path / "trunc" / "00004.npy"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UsageError, match=r"00004.npy: cannot read tensor 'model.layers.2.self_attn.output'"):
        compare_dumps(tmp_path / "trunc", tmp_path / "ref", LogitsConfig())
    dump_json = write_msprobe_dump(tmp_path / "ms", tensors)
    dump_json.write_text(dump_json.read_text()[:-40])
    with pytest.raises(UsageError, match=r"dump.json: not valid JSON"):
        compare_dumps(tmp_path / "ms", tmp_path / "ms", LogitsConfig())
    with pytest.raises(UsageError, match="dump not found"):
        compare_dumps(tmp_path / "nowhere", tmp_path / "ref", LogitsConfig())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_pt_reader_matches_torch_without_importing_it(tmp_path: Path, dtype: torch.dtype) -> None:
    from bisect_npu.oracle.dumps.formats import load_pt

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7
    tensor = base.to(dtype).t()[1:]  # a non-contiguous view with a storage offset
    torch.save(tensor, tmp_path / "t.pt")
    got = load_pt(tmp_path / "t.pt")
    want = tensor.float() if dtype == torch.bfloat16 else tensor
    assert got.shape == tuple(want.shape)
    np.testing.assert_array_equal(got, want.numpy())


REAL_MSPROBE_DUMP = DATA / "oracle" / "msprobe_l0"


def test_dump_written_by_real_msprobe(tmp_path: Path) -> None:
    """A dump that mindstudio-probe 26.2 wrote (PrecisionDebugger, level L0, two Linear layers on the CPU)."""
    import shutil

    parts = open_dump(REAL_MSPROBE_DUMP)
    assert list(parts) == ["step0/rank0"]  # it wrote step0/proc{PID}
    names = [e.name for e in parts["step0/rank0"]]
    assert names[:4] == ["Module.l.0.Linear.forward.0.input.0", "Module.l.0.Linear.forward.0.parameters.weight",
                         "Module.l.0.Linear.forward.0.parameters.bias", "Module.l.0.Linear.forward.0.output.0"]
    assert compare_dumps(REAL_MSPROBE_DUMP, REAL_MSPROBE_DUMP, LogitsConfig()).first_divergent is None
    copy = tmp_path / "copy"
    shutil.copytree(REAL_MSPROBE_DUMP, copy)
    weight = next(copy.rglob("Module.l.1.Linear.forward.0.parameters.weight.pt"))
    torch.save(-torch.load(weight, weights_only=True), weight)
    first = compare_dumps(copy, REAL_MSPROBE_DUMP, LogitsConfig()).first_divergent
    assert first is not None and first.name == "Module.l.1.Linear.forward.0.parameters.weight"


def test_undistributed_and_one_rank_dumps_line_up(tmp_path: Path) -> None:
    tensors = model_tensors()
    write_msprobe_dump(tmp_path / "undistributed", tensors)
    (tmp_path / "undistributed" / "step0" / "rank0").rename(tmp_path / "undistributed" / "step0" / "rank")
    write_msprobe_dump(tmp_path / "one-rank", tensors)
    assert list(open_dump(tmp_path / "undistributed")) == ["step0/rank0"]
    result = compare_dumps(tmp_path / "undistributed", tmp_path / "one-rank", LogitsConfig())
    assert result.first_divergent is None and len(result.rows) == len(tensors)


def _single(tmp_path: Path, ref: np.ndarray, cand: np.ndarray, cfg: LogitsConfig | None = None) -> str | None:
    write_dump(tmp_path / "r", [("model.layers.0.output", ref)])
    write_dump(tmp_path / "c", [("model.layers.0.output", cand)])
    result = compare_dumps(tmp_path / "c", tmp_path / "r", cfg or LogitsConfig())
    return result.first_divergent.problem if result.first_divergent else None


def test_msprobe_pass_rule(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal((8, 64)).astype(np.float32)
    noise = rng.standard_normal((8, 64)).astype(np.float32)
    # A near-zero tensor: cosine 0.98 with errors far below 0.001 passes (msprobe needs both) ...
    tiny = base * 1e-5
    assert _single(tmp_path / "a", tiny, tiny + 0.2e-5 * noise) is None
    # ... but a cosine below 0.9 fails whatever the errors.
    assert "cosine" in (_single(tmp_path / "b", tiny, tiny + 1e-5 * noise) or "")
    # Cosine 0.98 with real errors fails. An absolute error of 2 at cosine ~1 (one bf16 ulp at 256)
    # passes by default and fails under msprobe's full rule, max_abs_error 1.
    assert "cosine" in (_single(tmp_path / "c", base, base + 0.2 * noise) or "")
    big = base * 100
    spiked = big.copy()
    spiked[0, 0] += 2.0
    assert _single(tmp_path / "d", big, spiked) is None
    assert "max_abs_error" in (_single(tmp_path / "e", big, spiked, LogitsConfig(max_abs_error=1.0)) or "")
    # One bf16 ulp everywhere (4e-3 relative): outside 1/1000 for every element, and still a pass.
    ulp = (torch.from_numpy(base).to(torch.bfloat16).float().numpy() * (1 + 2**-7)).astype(np.float32)
    assert _single(tmp_path / "f", base, ulp) is None


# ---------------------------------------------------------------- relative rules, chunks, memory


def bf16(array: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).to(torch.bfloat16).float().numpy()


def residual_modules(layers: int = 8, jitter: float = 0.0, broken: int | None = None, size: float = 0.05,
                     propagate: bool = False, seed: int = 0) -> list[tuple[str, list[np.ndarray], np.ndarray]]:
    """(module, inputs, output) of a small bf16 residual stack; `jitter` is another device's rounding noise
    (relative, before each rounding), `size` an error's norm relative to the broken layer's output."""
    weights = np.random.default_rng(0)
    noise = np.random.default_rng(seed)
    state = bf16(weights.standard_normal((32, 128)))
    modules = []
    for layer in range(layers):
        w = (weights.standard_normal((128, 128)) / np.sqrt(128)).astype(np.float32)
        normed = bf16(state / np.sqrt((state * state).mean(axis=-1, keepdims=True)))
        out = np.tanh(normed @ w) * 0.5
        out = bf16(out * (1 + jitter * noise.standard_normal(out.shape).astype(np.float32)))
        dumped = out
        if layer == broken:
            err = noise.standard_normal(out.shape).astype(np.float32)
            dumped = bf16(out + err * (size * np.linalg.norm(out) / np.linalg.norm(err)))
            out = dumped if propagate else out
        modules.append((f"model.layers.{layer}.mlp", [normed], dumped))
        state = bf16(state + out)
    return modules


def write_module_dump(root: Path, modules: list[tuple[str, list[np.ndarray], np.ndarray]]) -> Path:
    """MindStudio Probe's layout with each module's inputs and output, bf16."""
    rank = root / "step0" / "rank0"
    data_dir = rank / "dump_tensor_data"
    data_dir.mkdir(parents=True)
    data: dict[str, dict] = {}
    for module, inputs, output in modules:
        op = f"Module.{module}.Qwen3MLP.forward.0"
        entry: dict[str, list] = {"input_args": [], "output": []}
        for section, kind, arrays in (("input_args", "input", inputs), ("output", "output", [output])):
            for i, array in enumerate(arrays):
                tensor = torch.from_numpy(array).to(torch.bfloat16)
                data_name = f"{op}.{kind}.{i}.pt"
                torch.save(tensor, data_dir / data_name)
                entry[section].append({"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": list(tensor.shape),
                                       "data_name": data_name})
        data[op] = entry
    (rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L0", "data": data}), encoding="utf-8")
    return root


def test_relative_rule_catches_a_5_percent_error_whose_cosine_stays_above_099(tmp_path: Path) -> None:
    ref = write_module_dump(tmp_path / "ref", residual_modules())
    cand = write_module_dump(tmp_path / "cand", residual_modules(broken=3, size=0.05))
    absolute_only = compare_dumps(cand, ref, LogitsConfig(relative=False, msprobe_rule=False))
    assert absolute_only.first_divergent is None  # what compare_dumps said before: nothing
    verdict = judge_logits(Observation(logits_dump=str(cand)), Observation(logits_dump=str(ref)), LogitsConfig())
    assert verdict.kind == VerdictKind.BAD
    first = verdict.figures["first_divergent"]
    assert first["module"] == "Module.model.layers.3.mlp.Qwen3MLP.forward.0" and first["name"].endswith("output.0")
    assert 0.99 < first["cosine"] < 0.9995
    assert first["rule"] in ("msprobe_amplification", "cosine_amplification")
    assert first["baseline"]["tensors"] == ["Module.model.layers.3.mlp.Qwen3MLP.forward.0.input.0"]
    assert first["baseline"]["cosine"] == 1.0 and first["within_1e3"] < first["baseline"]["within_1e3"]
    assert "layer 3" in verdict.reason and first["rule"] in verdict.reason
    # Not propagated: nothing after it carries the drift.
    assert verdict.figures["carried_by"]["count"] == 0


def test_propagated_error_names_the_first_module_and_the_chain_that_carries_it(tmp_path: Path) -> None:
    ref = write_module_dump(tmp_path / "ref", residual_modules())
    cand = write_module_dump(tmp_path / "cand", residual_modules(broken=2, size=0.05, propagate=True))
    result = compare_dumps(cand, ref, LogitsConfig())
    first = result.first_divergent
    assert first is not None and first.module == "Module.model.layers.2.mlp.Qwen3MLP.forward.0"
    carriers, also = result.after_first()
    assert [row.layer for row in carriers] == [3, 4, 5, 6, 7]
    assert all(row.role == "output" and row.metrics["cosine"] < 1.0 for row in carriers)
    assert also == []
    verdict = judge_logits(Observation(logits_dump=str(cand)), Observation(logits_dump=str(ref)), LogitsConfig())
    assert verdict.figures["carried_by"]["count"] == 5 and "5 later outputs carry the drift" in verdict.reason


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clean_bf16_rounding_noise_is_not_flagged(tmp_path: Path, seed: int) -> None:
    ref = write_module_dump(tmp_path / "ref", residual_modules())
    cand = write_module_dump(tmp_path / "cand", residual_modules(jitter=2.0**-10, seed=seed))
    result = compare_dumps(cand, ref, LogitsConfig())
    assert result.first_divergent is None
    assert result.rows[-1].metrics["within_1e3"] < 0.9  # the noise is there: msprobe's 1/1000 share is gone
    # ... and a 5% error on top of the same noise still is.
    bad = write_module_dump(tmp_path / "bad", residual_modules(jitter=2.0**-10, seed=seed, broken=5))
    first = compare_dumps(bad, ref, LogitsConfig()).first_divergent
    assert first is not None and first.layer == 5 and first.rule == "cosine_amplification"


def test_dtype_tolerance_is_the_dtypes_precision_never_tighter_than_msprobes() -> None:
    from bisect_npu.oracle.dumps.compare import dtype_tolerance

    assert dtype_tolerance("bfloat16") == 2.0**-7
    assert dtype_tolerance("float16") == dtype_tolerance("float32") == dtype_tolerance(None) == 1e-3


def _pair(shape: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(shape).astype(np.float32)
    cand = ref * (1 + 0.003 * rng.standard_normal(shape)).astype(np.float32)
    cand.reshape(-1)[:: 7] = 0.0
    return cand, ref


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple), chunk=st.integers(1, 300),
       logits=st.booleans(), seed=st.integers(0, 1000))
def test_chunked_metrics_equal_whole_tensor_metrics(shape: tuple[int, ...], chunk: int, logits: bool,
                                                    seed: int) -> None:
    from bisect_npu.oracle.dumps.compare import ChunkSums, segment_sums
    from bisect_npu.oracle.dumps.formats import TensorFile

    cand, ref = _pair(shape, seed)
    files = [TensorFile(Path(), shape, np.dtype(np.float32), False, array=a) for a in (cand, ref)]
    size, vocab = cand.size, (shape[-1] if logits else None)
    whole = segment_sums(*files, 0, size, size, 2.0**-7, vocab, 3).metrics(logits)
    step = max(1, chunk // shape[-1]) * shape[-1] if logits else chunk
    merged = ChunkSums()
    for start in range(0, size, step * 3):  # segments of three chunks, merged as the workers' are
        merged.merge(segment_sums(*files, start, min(size, start + step * 3), step, 2.0**-7, vocab, 3))
    chunked = merged.metrics(logits)
    assert chunked.keys() == whole.keys()
    for key, value in whole.items():
        assert chunked[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key


def test_top_k_indices_match_a_full_sort() -> None:
    from bisect_npu.oracle.dumps.compare import top_k_indices

    rows = np.random.default_rng(5).standard_normal((6, 151_936 + 17)).astype(np.float32)
    got = top_k_indices(rows, 5)
    want = np.argsort(rows, axis=1)[:, -5:]
    assert [set(r) for r in got] == [set(r) for r in want]


@settings(max_examples=80, deadline=None)
@given(rows=st.integers(1, 3), vocab=st.integers(1, 70_000), k=st.integers(1, 8), levels=st.integers(2, 60000),
       block=st.sampled_from([64, 2048]), seed=st.integers(0, 1000))
def test_top_k_values_are_the_k_largest(rows: int, vocab: int, k: int, levels: int, block: int, seed: int) -> None:
    """Any width (a tail after the last whole block included), ties (few distinct values) and block size:
    the values at the indices found are the k largest, each index once."""
    from bisect_npu.oracle.dumps.compare import top_k_indices

    k = min(k, vocab)
    values = np.random.default_rng(seed).integers(0, levels, (rows, vocab)).astype(np.float32)
    got = top_k_indices(values, k, block)
    assert got.shape == (rows, k)
    for row, picked in zip(values, got, strict=True):
        assert len(set(picked.tolist())) == k
        np.testing.assert_array_equal(np.sort(row[picked]), np.sort(row)[vocab - k:])


def test_reads_are_bounded_by_the_chunk_not_the_logits_tensor(tmp_path: Path) -> None:
    """A [1, 128, 151936] bf16 logits pair (78 MB) compared in one-row chunks: no read larger than a row,
    and Python-side allocations far below one tensor (the old reader widened each whole tensor)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((1, 128, 151_936), dtype=np.float32) * 3)
    ref = write_msprobe_dump(tmp_path / "ref", [("lm_head.logits", logits)])
    logits[0, 5, :100] += 1.0
    write_msprobe_dump(tmp_path / "cand", [("lm_head.logits", logits)])
    del logits
    cfg = LogitsConfig(chunk_elements=1 << 16)
    tracemalloc.start()
    try:
        result = compare_dumps(tmp_path / "cand", ref.parent, cfg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    row = result.rows[0]
    assert result.largest_read == 151_936 * 2  # one bf16 row per read
    assert result.bytes_read == 2 * 128 * 151_936 * 2
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert row.metrics["top_k_overlap"] > 0.99 and row.metrics["kl"] > 0


def test_tensor_files_read_any_run_of_elements(tmp_path: Path) -> None:
    from bisect_npu.oracle.dumps.formats import open_npy, open_pt

    array = np.arange(6 * 7, dtype=np.float32).reshape(6, 7) / 3
    np.save(tmp_path / "a.npy", array)
    torch.save(torch.from_numpy(array).to(torch.bfloat16), tmp_path / "a.pt")
    torch.save(torch.from_numpy(array)[2:].clone(), tmp_path / "offset.pt")
    flat = array.reshape(-1)
    for tensor, want in ((open_npy(tmp_path / "a.npy"), flat), (open_pt(tmp_path / "a.pt"), bf16(flat)),
                         (open_pt(tmp_path / "offset.pt"), flat[14:])):
        assert tensor.array is None  # indexed, not loaded
        np.testing.assert_array_equal(tensor.read(3, 11), want[3:14])
        np.testing.assert_array_equal(tensor.read(0, tensor.size), want)


def test_reads_into_reused_buffers_give_float32_of_any_stored_dtype(tmp_path: Path) -> None:
    """The workers' path: the same two buffers for every chunk, whatever was stored (bf16 shifted into
    place, float32 read straight into the output, others cast; a strided tensor held in memory)."""
    from bisect_npu.oracle.dumps.formats import PtFormatError, open_npy, open_pt

    array = (np.arange(6 * 7, dtype=np.float32).reshape(6, 7) - 20) / 3
    np.save(tmp_path / "f16.npy", array.astype(np.float16))
    np.save(tmp_path / "f32.npy", array)
    torch.save(torch.from_numpy(array).to(torch.bfloat16), tmp_path / "bf16.pt")
    torch.save(torch.from_numpy(array).t(), tmp_path / "strided.pt")
    out, raw = np.full(64, np.nan, np.float32), np.zeros(64 * 8, np.uint8)
    cases = [(open_npy(tmp_path / "f16.npy"), array.astype(np.float16).astype(np.float32).reshape(-1)),
             (open_npy(tmp_path / "f32.npy"), array.reshape(-1)),
             (open_pt(tmp_path / "bf16.pt"), bf16(array).reshape(-1)),
             (open_pt(tmp_path / "strided.pt"), array.T.reshape(-1))]
    for tensor, want in cases:
        fd = tensor.open()
        try:
            for start, count in ((0, 42), (5, 9), (40, 10)):
                got = tensor.read_into(fd, start, count, out, raw)
                assert got.dtype == np.float32 and np.shares_memory(got, out)
                np.testing.assert_array_equal(got, want[start:start + count])
        finally:
            if fd is not None:
                os.close(fd)
    cut = tmp_path / "cut.npy"
    cut.write_bytes((tmp_path / "f32.npy").read_bytes())
    tensor = open_npy(cut)
    with open(cut, "r+b") as handle:
        handle.truncate(cut.stat().st_size - 8)
    fd = tensor.open()
    try:
        with pytest.raises(PtFormatError, match="8 bytes early"):
            tensor.read_into(fd, 0, 42, out, raw)
    finally:
        os.close(fd)


def test_a_module_kind_is_its_name_without_layer_index_or_call_count() -> None:
    from bisect_npu.oracle.dumps.peers import module_kind

    op3, op12 = "Module.model.layers.3.mlp.Qwen3MLP.forward.0", "Module.model.layers.12.mlp.Qwen3MLP.forward.2"
    three, twelve = module_kind(op3, f"{op3}.output.0"), module_kind(op12, f"{op12}.output.0")
    assert three == twelve == "Module.model.layers.*.mlp.Qwen3MLP.forward.output.0"
    assert module_kind("model.layers.3.self_attn.output", "model.layers.3.self_attn.output") != three


@given(st.lists(st.floats(-3, 3), min_size=4, max_size=30), st.floats(0.01, 2.0), st.floats(1.0, 10.0))
def test_a_member_far_outside_its_peers_stands_above_its_line_and_the_others_do_not(
        values: list[float], min_spread: float, mads: float) -> None:
    from bisect_npu.oracle.dumps.peers import leave_one_out_lines

    outlier = max(values) + mads * 1.4826 * (max(values) - min(values)) + min_spread + 1.0
    members = [(i, v) for i, v in enumerate(values)] + [(len(values), outlier)]
    lines = leave_one_out_lines({"kind": members}, mads, 3, lambda _: min_spread)
    assert outlier > lines[len(values)].line >= lines[len(values)].median + min_spread
    assert all(lines[i].line >= lines[i].median + min_spread for i in range(len(values)))
    assert leave_one_out_lines({"kind": members[:3]}, mads, 3, lambda _: min_spread) == {}


def _modules_with_an_auxiliary_input(aux_error: float, broken: int | None, widen: bool,
                                     layers: int = 8) -> list[tuple[str, list[np.ndarray], np.ndarray]]:
    """Modules of two inputs, a hidden state [16, 64] and a rotary-like table [16, 8] (`aux_error` relative
    noise on it), whose output is [16, 64] (or [16, 128] when `widen`); 5% error on layer `broken`'s output."""
    rng, noise = np.random.default_rng(7), np.random.default_rng(8)
    modules = []
    for layer in range(layers):
        hidden = bf16(rng.standard_normal((16, 64)).astype(np.float32))
        table = rng.standard_normal((16, 8)).astype(np.float32)
        table = bf16(table * (1 + aux_error * noise.standard_normal(table.shape).astype(np.float32)))
        weight = rng.standard_normal((64, 128 if widen else 64)).astype(np.float32) / 8
        out = np.tanh(hidden @ weight)
        if layer == broken:
            err = noise.standard_normal(out.shape).astype(np.float32)
            out = out + err * (0.05 * np.linalg.norm(out) / np.linalg.norm(err))
        modules.append((f"model.layers.{layer}.mlp", [hidden, table], bf16(out)))
    return modules


@pytest.mark.parametrize("widen", [False, True])
def test_a_module_is_judged_against_its_input_shaped_like_its_output(tmp_path: Path, widen: bool) -> None:
    """The rotary tables of a bf16 model differ from an fp32 golden's while the hidden state is exact: the
    output is measured against the hidden state alone; with no input of its shape, against every input."""
    ref = write_module_dump(tmp_path / "ref", _modules_with_an_auxiliary_input(0.0, None, widen))
    cand = write_module_dump(tmp_path / "cand", _modules_with_an_auxiliary_input(0.01, 3, widen))
    result = compare_dumps(cand, ref, LogitsConfig())
    hidden, table = (f"Module.model.layers.3.mlp.Qwen3MLP.forward.0.input.{i}" for i in (0, 1))
    by_name = {row.name: row for row in result.rows}
    assert by_name[hidden].metrics["cosine"] == 1.0 > by_name[table].metrics["cosine"]
    first = result.first_divergent
    assert first is not None and first.layer == 3 and first.baseline is not None
    assert first.baseline["tensors"] == ([hidden, table] if widen else [hidden])
    assert first.baseline["cosine"] == by_name[table if widen else hidden].metrics["cosine"]
