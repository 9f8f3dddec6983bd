"""The offline `vllm` probe backend: pure parts here, real vLLM (CPU build) in the `vllm` tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.oracle.dumps.compare import open_dump
from bisect_npu.probe.backends.vllm import (
    engine_kwargs,
    open_engine,
    sampling_kwargs,
    spec_decode_counters,
    use_engine_guard,
    whole_vocabulary,
)
from bisect_npu.probe.request import trial_requests
from bisect_npu.probe.trials import ascend_versions, engine_versions, loop_detector
from tests.helpers.tiny_qwen3 import write_tiny_qwen3
from tests.helpers.vllm_tier import base_request, batch_request, distinct, run_probe, run_probe_batch

GREEDY_200 = {"temperature": 0.0, "max_tokens": 200, "logprobs": 5}
SAMPLED_48 = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 48, "logprobs": 5}
EVERY_FIELD = ("schema_version", "commit", "recipe", "case_id", "trial", "seed", "prompt_token_ids",
               "output_token_ids", "text", "finish_reason", "stop_reason", "timings", "sampling", "versions",
               "top_logprobs", "logits_dump", "extra")


def test_engine_kwargs_pass_recipe_args_verbatim() -> None:
    request = {"model": {"path": "/models/R1", "dtype": "bfloat16", "tokenizer": None}, "seed": 3,
               "engine": {"args": {"tensor_parallel_size": 16, "async_scheduling": True,
                                   "additional_config": {"torchair_graph_config": {"enabled": True}},
                                   "speculative_config": {"method": "deepseek_mtp", "num_speculative_tokens": 1}}},
               "logits": {"layers": ["model.layers.*"], "full_logits": True}}
    assert engine_kwargs(request) == {
        "model": "/models/R1", "dtype": "bfloat16", "seed": 3, "tensor_parallel_size": 16, "async_scheduling": True,
        "additional_config": {"torchair_graph_config": {"enabled": True}},
        "speculative_config": {"method": "deepseek_mtp", "num_speculative_tokens": 1},
        "max_logprobs": -1, "enforce_eager": True, "disable_log_stats": False}


def test_sampling_kwargs_take_engine_defaults_under_what_the_case_sets() -> None:
    request = {"case": {"sampling": {"temperature": 0.0, "max_tokens": 64}}, "seed": 5, "logits": {"top_k": 3}}
    kwargs, sources = sampling_kwargs(request, {"presence_penalty": 1.5, "temperature": 0.7, "max_tokens": 9})
    assert kwargs == {"presence_penalty": 1.5, "temperature": 0.0, "max_tokens": 64, "logprobs": 3, "seed": 5}
    assert sources == {"presence_penalty": "default", "temperature": "request", "max_tokens": "request",
                       "seed": "request"}


@pytest.mark.parametrize(("guard", "engine_mode", "expected"), [
    ({"min_pattern_size": 1, "max_pattern_size": 20, "min_count": 3}, "engine", True),
    ({"min_pattern_size": 1, "max_pattern_size": 20, "min_count": 3}, "probe", False),
    ({"min_pattern_size": 1, "max_pattern_size": 64, "min_count": 4, "min_covered_tokens": 48}, "engine", False),
    ({"min_pattern_size": 16, "max_pattern_size": 512, "min_count": 3, "min_covered_tokens": 48}, "engine", True),
    (None, "engine", False),
])
def test_engine_guard_only_where_vllm_rule_equals_ours(guard: dict | None, engine_mode: str, expected: bool) -> None:
    request = {"loop_guard": guard, "engine": {"loop_guard": engine_mode}}
    assert use_engine_guard(request, detection_cls=object) is expected
    assert use_engine_guard(request, detection_cls=None) is False  # a vLLM without repetition_detection


def test_ascend_versions_read_the_installers_files(tmp_path: Path) -> None:
    toolkit = tmp_path / "ascend-toolkit" / "latest" / "aarch64-linux"
    toolkit.mkdir(parents=True)
    (toolkit / "ascend_toolkit_install.info").write_text("package_name=Ascend-cann-toolkit\nversion=8.1.RC1\n")
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "version.info").write_text("Version=24.1.rc3\nascendhal_version=7.35.23\n")
    assert ascend_versions(str(tmp_path)) == {"cann": "8.1.RC1", "driver": "24.1.rc3"}
    assert ascend_versions(str(tmp_path / "absent")) == {}
    newer = tmp_path / "newer"
    (newer / "8.5.0" / "aarch64-linux").mkdir(parents=True)
    (newer / "8.5.0" / "aarch64-linux" / "ascend_toolkit_install.info").write_text("version=8.5.0\n")
    assert ascend_versions(str(newer)) == {"cann": "8.5.0"}  # no ascend-toolkit/latest in that layout
    assert ascend_versions(str(tmp_path / "absent"), toolkit_home=str(newer / "8.5.0")) == {"cann": "8.5.0"}


def test_engine_versions_name_what_is_installed() -> None:
    versions = engine_versions()
    assert "torch" in versions  # the host venv has torch; vllm/torch_npu only where installed


def test_engine_versions_read_torch_without_importing_it() -> None:
    """An HTTP-only probe names torch's version from its installed metadata: importing torch for it
    cost every such probe process seconds before its server started."""
    code = ("import importlib.metadata, sys\nfrom bisect_npu.probe.trials import engine_versions\n"
            "versions = engine_versions()\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert versions['torch'] == importlib.metadata.version('torch'), versions\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_spec_decode_counters_are_the_trials_own() -> None:
    before = {"num_drafts": 4.0, "num_draft_tokens": 12.0, "num_accepted_tokens": 6.0}
    after = {"num_drafts": 10.0, "num_draft_tokens": 30.0, "num_accepted_tokens": 12.0}
    assert spec_decode_counters(after, before) == {
        "num_drafts": 6.0, "num_draft_tokens": 18.0, "num_accepted_tokens": 6.0, "acceptance_rate": 6 / 18,
        "proposed": 18, "accepted": 6}
    assert spec_decode_counters(after, {})["proposed"] == 30  # the first trial of an engine start
    assert spec_decode_counters({}, {}) is None  # no counters: not a speculative run


def test_layer_dumps_refuse_a_batch() -> None:
    # Hooks registered by apply_model stay for the engine's life: refused before vLLM is even imported.
    with pytest.raises(ValueError, match="layers"):
        open_engine({"logits": {"layers": ["model.layers.*"]}, "model": {"path": "/m"}}, trials=2)


def test_loop_detector_follows_the_request() -> None:
    assert loop_detector(None) is None
    detector = loop_detector({"min_pattern_size": 2, "max_pattern_size": 4, "min_count": 3})
    assert detector.feed([1, 2, 1, 2, 1]) is None
    assert detector.push(2).period == 2


# ------------------------------------------------------------------ real vLLM (make test-vllm)

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="module")
def spread_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3-spread"), initializer_range=0.3)


@pytest.mark.vllm
def test_repetition_penalty_changes_greedy_output(spread_model: Path, tmp_path: Path) -> None:
    plain = run_probe(base_request(spread_model, "vllm", GREEDY_200), tmp_path / "plain", "vllm greedy")
    capture = {"top_k": 5, "dump_dir": None, "full_logits": True, "layers": ["model.layers.*.mlp"], "steps": [0]}
    penalised = run_probe(base_request(spread_model, "vllm", {**GREEDY_200, "repetition_penalty": 1.3},
                                       logits=capture), tmp_path / "penalised", "vllm greedy + penalty 1.3 + dumps")

    for obs in (plain, penalised):
        assert set(EVERY_FIELD) <= set(obs.model_dump())
        assert obs.prompt_token_ids and len(obs.output_token_ids) == 200
        assert obs.finish_reason == "length" and obs.stop_reason is None
        assert len(obs.top_logprobs) == 200 and len(obs.top_logprobs[0]) == 5
        assert obs.top_logprobs[0][0][0] == obs.output_token_ids[0]  # greedy: the best is the one taken
        assert obs.timings.load_s > 0 and obs.timings.generate_s > 0
        assert obs.versions["vllm"] == "0.32.0" and obs.versions["torch"].startswith("2.13.0")
        assert obs.extra["rendered_prompt"].startswith("<|im_start|>user\n")
        assert obs.extra["stages"]["prompt_token_ids"] == obs.prompt_token_ids
    assert plain.sampling["repetition_penalty"] == 1.0 and penalised.sampling["repetition_penalty"] == 1.3
    assert penalised.extra["sampling_sources"]["repetition_penalty"] == "request"
    assert plain.output_token_ids != penalised.output_token_ids
    # transformers' generate() on the same weights: 42 -> 194 distinct tokens of 200.
    assert distinct(penalised.output_token_ids) > distinct(plain.output_token_ids) + 50

    dumps = open_dump(penalised.logits_dump)  # the logits oracle reads what the probe wrote
    assert sorted(dumps) == ["full_logits/step0/rank0", "step0/rank0"]
    assert [e.name for e in dumps["step0/rank0"]] == [
        f"Module.model.layers.{n}.mlp.Qwen2MLP.forward.0.output.0" for n in (0, 1)]
    assert dumps["full_logits/step0/rank0"][0].shape[0] == 200


@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["engine", "probe"])
def test_loop_guard_stops_generation_early(tiny_model: Path, tmp_path: Path, mode: str) -> None:
    guard = {"min_pattern_size": 1, "max_pattern_size": 16, "min_count": 6, "mode": mode}
    obs = run_probe(base_request(tiny_model, "vllm", {"temperature": 0.0, "max_tokens": 1500}, loop_guard=guard),
                    tmp_path, f"vllm loop guard ({mode})")
    assert obs.stop_reason == "repetition_detected"
    assert obs.extra["loop_guard"] == ("vllm" if mode == "engine" else "probe")
    assert 6 <= len(obs.output_token_ids) < 200  # a greedy random model loops within a few tokens
    if mode == "probe":
        hit = obs.extra["loop"]
        assert hit["end"] == len(obs.output_token_ids) and hit["count"] >= 6
    else:
        assert obs.sampling["repetition_detection"] == {"min_pattern_size": 1, "max_pattern_size": 16,
                                                        "min_count": 6}


@pytest.mark.vllm
def test_batch_trial_equals_a_fresh_start(spread_model: Path, tmp_path: Path) -> None:
    """Trial 1 of a batch (after trial 0 on the same engine) gives what a fresh engine gives it.

    Trial 0 of a batch is a fresh start by construction, so only trial 1 gets a single run: one
    engine start less for the tier.
    """
    batch = batch_request(base_request(spread_model, "vllm", SAMPLED_48), [7, 8], tmp_path / "batch")
    first, second = run_probe_batch(batch, tmp_path / "batch", "vllm batch of 2 sampled")
    alone = run_probe(trial_requests(batch)[1], tmp_path / "single", "vllm single, trial 1 of the batch")
    assert (first.trial, first.seed, second.trial, second.seed) == (0, 7, 1, 8)
    assert second.output_token_ids == alone.output_token_ids and len(alone.output_token_ids) == 48
    assert second.top_logprobs == alone.top_logprobs and second.sampling == alone.sampling
    assert first.output_token_ids != second.output_token_ids  # the seeds differ, so do the tokens
    assert first.timings.load_s > 0 and second.timings.load_s == 0.0 and alone.timings.load_s > 0
    assert [obs.extra["batch"] for obs in (first, second)] == [{"index": 0, "size": 2}, {"index": 1, "size": 2}]
    assert second.extra["prefix_cache_reset"] is True and "prefix_cache_reset" not in first.extra
    assert "batch" not in alone.extra


def test_the_whole_vocabulary_is_minus_one_from_vllm_0_10_1_and_its_size_before(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 151936}))
    assert whole_vocabulary(str(tmp_path), "0.10.1") == -1
    assert whole_vocabulary(str(tmp_path), "0.32.0+cpu") == -1
    assert whole_vocabulary(str(tmp_path), "0.9.1") == 151936  # v0.9.1 refuses logprobs=-1
    assert whole_vocabulary(str(tmp_path), "0.10.0") == 151936
    request = {"model": {"path": str(tmp_path)}, "logits": {"full_logits": True}, "case": {"sampling": {}}}
    assert engine_kwargs(request, 151936)["max_logprobs"] == 151936
    assert sampling_kwargs(request, {}, 151936)[0]["logprobs"] == 151936
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 7}}))
    assert whole_vocabulary(str(tmp_path), "0.9.1") == 7
    with pytest.raises(ValueError, match=r"needs the vocabulary size.*vLLM >= 0\.10\.1"):
        whole_vocabulary(str(tmp_path / "missing"), "0.9.1")
