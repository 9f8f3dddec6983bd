"""The demo engine is a faithful Qwen3 with vLLM's sampler semantics (template sources, real torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers.paths import REPO_ROOT

# The demo's model runs (and transformers loads its weights).
pytestmark = pytest.mark.e2e

UPSTREAM = REPO_ROOT / "bisect_npu" / "demo" / "upstream"


@pytest.fixture(scope="module")
def tinyvllm(tmp_path_factory):
    """The template engine, its kernels built into a scratch copy (the template tree stays clean)."""
    import shutil

    root = tmp_path_factory.mktemp("engine") / "upstream"
    shutil.copytree(UPSTREAM, root, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=root, check=True, capture_output=True)
    sys.path.insert(0, str(root))
    for name in [m for m in sys.modules if m == "tinyvllm" or m.startswith("tinyvllm.")]:
        del sys.modules[name]
    import tinyvllm.engine

    yield tinyvllm
    sys.path.remove(str(root))


def test_logits_match_transformers_qwen3(tinyvllm):
    from tinyvllm.config import ModelConfig
    from tinyvllm.model import Qwen3Model

    from bisect_npu.probe.export_mini import as_transformers

    cfg = ModelConfig(seed=3)
    model = Qwen3Model(cfg)
    hf = as_transformers(model)  # refuses weights that do not fit Qwen3ForCausalLM by name
    # Past max_position_embeddings too: the long-sequence path of the RoPE cache must agree.
    ids = torch.randint(0, cfg.vocab_size, (1, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits[0]
    cache = model.new_cache(256)
    prefill = model.forward(ids[0, :100].tolist(), cache)
    decode = torch.cat([model.forward([int(t)], cache) for t in ids[0, 100:]])
    got = torch.cat((prefill, decode))
    assert (got - expected).abs().max().item() <= 1e-4


def test_repetition_presence_frequency_penalties(tinyvllm):
    from tinyvllm.sampler import apply_penalties
    from tinyvllm.sampling_params import SamplingParams

    logits = torch.tensor([2.0, -2.0, 1.0, 0.5, 3.0])
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    # prompt has 0 and 1; output has 2 twice, 3 once and a -1 placeholder (not a token).
    out = apply_penalties(logits, params, prompt_ids=[0, 1], output_ids=[2, 2, 3, -1])
    expected = torch.tensor([2.0 / 2, -2.0 * 2, 1.0 / 2 - 0.5 - 0.25 * 2, 0.5 / 2 - 0.5 - 0.25, 3.0])
    assert torch.allclose(out, expected)


def test_temperature_min_p_top_k_top_p(tinyvllm):
    from tinyvllm.sampler import processed_probs
    from tinyvllm.sampling_params import SamplingParams

    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    plain = processed_probs(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(plain, torch.tensor([0.5, 0.25, 0.15, 0.1]))
    # min_p 0.25: keep p >= 0.125 -> drops 0.1
    assert torch.allclose(processed_probs(logits, SamplingParams(temperature=1.0, min_p=0.25)),
                          torch.tensor([0.5, 0.25, 0.15, 0.0]) / 0.9)
    assert torch.allclose(processed_probs(logits, SamplingParams(temperature=1.0, top_k=2)),
                          torch.tensor([0.5, 0.25, 0.0, 0.0]) / 0.75)
    # top_p 0.7: smallest set reaching 0.7 is {0.5, 0.25}
    assert torch.allclose(processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.7)),
                          torch.tensor([0.5, 0.25, 0.0, 0.0]) / 0.75)
    sharp = processed_probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(sharp, torch.softmax(logits / 0.5, dim=-1))


def test_greedy_uses_the_compiled_argmax(tinyvllm):
    from tinyvllm import kernels

    values = torch.tensor([0.1, 3.0, -1.0, 3.0])
    assert kernels.argmax(values) == 1 == int(torch.argmax(values))
    assert kernels.bin_counts([2, 2, -1, 0], 4).tolist() == [1.0, 0.0, 2.0, 0.0]


def test_async_backfill_matches_sync_scheduling(tinyvllm):
    from tinyvllm.engine import LLM
    from tinyvllm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=80)
    prompt = "please repeat the story of the old man and the sea"
    assert LLM("seed:0", async_scheduling=True).generate(prompt, params) == LLM("seed:0").generate(prompt, params)


def test_speculative_decoding_is_exact_when_greedy(tinyvllm):
    from tinyvllm.engine import LLM
    from tinyvllm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=60)
    spec = LLM("seed:0", speculative_config={"num_speculative_tokens": 3, "draft_layers": 1})
    assert spec.generate("hello world", params) == LLM("seed:0").generate("hello world", params)
    assert 0 < spec.spec_stats.accepted <= spec.spec_stats.proposed


def test_server_defaults_apply_only_to_fields_not_sent(tinyvllm):
    from tinyvllm.engine import LLM
    from tinyvllm.server import CompletionServer

    server = CompletionServer(LLM("seed:0"), {"presence_penalty": 1.5, "temperature": 0.7})
    assert server.sampling_params({}).presence_penalty == 1.5
    sent = server.sampling_params({"presence_penalty": 0.0, "temperature": None})
    assert (sent.presence_penalty, sent.temperature) == (0.0, 0.7)
