"""The transformers backend on a real tiny Qwen3 (random weights, made here): the tokens, logprobs and
layer dump agree with transformers' own forward pass and `generate`, in the layout the dump diff reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a real model forward pass

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bisect_npu.oracle.dumps.compare import open_dump  # noqa: E402
from bisect_npu.probe.backends import transformers as backend  # noqa: E402
from tests.helpers.tiny_qwen3 import write_tiny_qwen3  # noqa: E402

MESSAGES = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog"}]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3-hf"), initializer_range=0.3)


def _request(model: Path, out: Path, **sampling: object) -> dict:
    return {"schema_version": 1, "commit": "", "recipe": "t", "case_id": "c", "trial": 0, "seed": None,
            "backend": "transformers", "model": {"path": str(model), "dtype": "float32", "tokenizer": None},
            "engine": {"args": {"device": "auto"}}, "case": {"messages": MESSAGES, "sampling": sampling},
            "loop_guard": None, "logits": {"top_k": 3, "layers": ["model.layers.*.self_attn", "lm_head"],
                                            "steps": [0], "dump_dir": None},
            "output": str(out / "obs.json")}


def test_greedy_tokens_logprobs_and_dump_agree_with_transformers(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    obs = backend.run_case(_request(tiny_model, tmp_path, temperature=0.0, max_tokens=12))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert obs["extra"]["stages"]["chat_template"] == rendered
    assert rendered.startswith("<|im_start|>user\n") and rendered.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert obs["prompt_token_ids"] == ids
    expected = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    assert obs["output_token_ids"][:len(expected)] == expected[:len(obs["output_token_ids"])]
    with torch.no_grad():
        first = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], dim=-1)
    best = torch.topk(first, 3)
    assert [row[0] for row in obs["top_logprobs"][0]] == best.indices.tolist()
    assert obs["top_logprobs"][0][0][1] == pytest.approx(float(best.values[0]), abs=1e-5)
    assert obs["sampling"]["temperature"] == 0.0 and obs["extra"]["sampling_sources"]["temperature"] == "request"
    assert obs["extra"]["sampling_sources"]["top_p"] == "default"
    assert obs["extra"]["model_identity"]["num_hidden_layers"] == 2

    parts = open_dump(obs["logits_dump"])
    assert list(parts) == ["step0/rank0"]
    modules = [entry.module for entry in parts["step0/rank0"]]
    assert modules == ["Module.model.layers.0.self_attn.Qwen3Attention.forward.0",
                       "Module.model.layers.1.self_attn.Qwen3Attention.forward.0", "Module.lm_head.Linear.forward.0"]
    logits_entry = parts["step0/rank0"][-1]
    assert logits_entry.shape == (1, len(ids), model.config.vocab_size) and logits_entry.is_logits


def test_a_seeded_draw_repeats_and_another_seed_differs(tiny_model: Path, tmp_path: Path) -> None:
    engine = backend.open_engine(_request(tiny_model, tmp_path))
    try:
        runs = [engine.run(_request(tiny_model, tmp_path, temperature=1.0, top_p=0.9, seed=seed, max_tokens=20))
                for seed in (1, 1, 2)]
    finally:
        engine.close()
    assert runs[0]["output_token_ids"] == runs[1]["output_token_ids"]
    assert runs[0]["output_token_ids"] != runs[2]["output_token_ids"]
    assert runs[1]["timings"]["load_s"] == 0.0


def test_vllm_penalty_semantics() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5, 3.0])
    params = {"repetition_penalty": 2.0, "presence_penalty": 0.5, "frequency_penalty": 0.25}
    out = backend.apply_penalties(logits, params, prompt_ids=[0, 1], output_ids=[2, 2, 3])
    expected = torch.tensor([2.0 / 2, -2.0 * 2, 1.0 / 2 - 0.5 - 0.25 * 2, 0.5 / 2 - 0.5 - 0.25, 3.0])
    assert torch.allclose(out, expected)


def test_the_probe_refuses_an_unknown_engine_arg(tiny_model: Path, tmp_path: Path) -> None:
    request = _request(tiny_model, tmp_path)
    request["engine"]["args"]["tensor_parallel_size"] = 2
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    done = subprocess.run([sys.executable, "-m", "bisect_npu.probe", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3
    assert "unknown engine args tensor_parallel_size" in done.stderr


def test_flat_dumps_drop_the_batch_dimension_as_vllm_modules_see_it(tiny_model: Path, tmp_path: Path) -> None:
    request = _request(tiny_model, tmp_path, temperature=0.0, max_tokens=1)
    request["engine"]["args"]["flat_dumps"] = True
    obs = backend.run_case(request)
    entries = open_dump(obs["logits_dump"])["step0/rank0"]
    tokens, config = len(obs["prompt_token_ids"]), json.loads((tiny_model / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    assert [entry.shape for entry in entries] == [(tokens, hidden), (tokens, hidden), (tokens, vocab)]


@pytest.mark.heavy
def test_a_moe_record_dumps_each_router_with_its_input_and_routing_compares_across_precisions(
        tmp_path: Path) -> None:
    """The backend hooks `mlp.gate` of a real Qwen3-MoE with its input: the dump diff then compares its
    routing (expert sets, each flip against its noise) between a bf16 run and the fp32 golden."""
    from bisect_npu.observations import VerdictKind
    from bisect_npu.oracle.config import LogitsConfig
    from bisect_npu.oracle.dumps.compare import compare_dumps, verdict_from_comparison
    from tests.helpers.tiny_qwen3 import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny-qwen3-moe", "Qwen3Moe", initializer_range=0.05)
    dumps = {}
    for dtype in ("float32", "bfloat16"):
        request = _request(model, tmp_path / dtype, temperature=0.0, max_tokens=1)
        request["model"]["dtype"] = dtype
        request["logits"]["layers"] = ["model.layers.*.mlp", "model.layers.*.mlp.gate", "model.layers.*"]
        (tmp_path / dtype).mkdir()
        dumps[dtype] = backend.run_case(request)["logits_dump"]
    doc = json.loads(next(Path(dumps["bfloat16"]).rglob("dump.json")).read_text())
    gate = next(op for key, op in doc["data"].items() if ".mlp.gate." in key)
    assert [entry["dtype"] for entry in gate["output"]] == ["torch.bfloat16", "torch.bfloat16", "torch.int64"]
    assert gate["input_args"][0]["shape"][-1] == json.loads((model / "config.json").read_text())["hidden_size"]
    result = compare_dumps(dumps["bfloat16"], dumps["float32"], LogitsConfig())
    assert [report.module for report in result.routing] == ["model.layers.1.mlp.gate"]
    assert result.routing[0].noise_from == "router input"
    verdict = verdict_from_comparison(result)
    assert verdict.kind is VerdictKind.GOOD, verdict.reason
    # The verdict says what routing did at the MoE layer: its flips put down to noise, or none.
    assert ("routing noise at model.layers.1.mlp.gate:" in verdict.reason
            or "routing: every token routed alike in 1 MoE layers" in verdict.reason), verdict.reason
