"""The `openai` probe backend: parsing here, a real vLLM server (CPU build) in the `vllm` tier."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_qwen3 import write_tiny_qwen3
from vllm_tier import base_request, run_probe

from bisect_npu.probe.backends.openai import (
    _choice_tokens,
    effective_sampling,
    generation_tokens,
    logged_defaults,
    override_generation_config,
    sse_events,
)

CPU_LAUNCHER = ["{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}"]
BROKEN_LAUNCHER = ["{python}", str(Path(__file__).resolve().parent / "vllm_server_dropping_penalties.py"),
                   "--model", "{model}"]
OVERRIDE = ["--override-generation-config", '{"presence_penalty": 1.5}']


def test_sse_events_stop_at_done() -> None:
    lines = [b'data: {"a": 1}\n', b"\n", b": keep-alive\n", b'data: {"a": 2}\n', b"data: [DONE]\n", b'data: {"a": 3}\n']
    assert list(sse_events(iter(lines))) == [{"a": 1}, {"a": 2}]


def test_chat_choice_tokens_from_token_id_strings() -> None:
    choice = {"delta": {"content": "hi"}, "logprobs": {"content": [
        {"token": "token_id:17", "logprob": -0.1,
         "top_logprobs": [{"token": "token_id:4", "logprob": -2.0}, {"token": "token_id:17", "logprob": -0.1}]}]}}
    assert _choice_tokens(choice, 5) == ([17], [[[17, -0.1], [4, -2.0]]])
    assert _choice_tokens({**choice, "token_ids": [99]}, 1)[0] == [99]  # explicit ids win


def test_completion_choice_tokens() -> None:
    top = [{"token_id:1": -0.5}, {"token_id:2": -0.2, "token_id:9": -3}]
    choice = {"text": "ab", "logprobs": {"tokens": ["token_id:1", "token_id:2"], "top_logprobs": top}}
    assert _choice_tokens(choice, 5) == ([1, 2], [[[1, -0.5]], [[2, -0.2], [9, -3.0]]])


def test_override_generation_config_both_spellings() -> None:
    assert override_generation_config(["vllm", "serve", "m", *OVERRIDE]) == {"presence_penalty": 1.5}
    assert override_generation_config(['--override-generation-config={"top_k": 20}']) == {"top_k": 20}
    assert override_generation_config(["vllm", "serve", "m"]) == {}


def test_logged_defaults_old_and_new_wording() -> None:
    old = "INFO serving_chat.py:120] Using default chat sampling params from model: {'presence_penalty': 1.5}\n"
    new = ("WARNING model.py:1893] Default vLLM sampling parameters have been overridden by the model's "
           "`generation_config.json`: `{'presence_penalty': 1.5, 'top_k': 20}`. If this is not intended, ...\n")
    assert logged_defaults(old) == {"presence_penalty": 1.5}
    assert logged_defaults(new) == {"presence_penalty": 1.5, "top_k": 20}
    assert logged_defaults("nothing here") is None


def test_generation_tokens_from_prometheus_text() -> None:
    text = ('# HELP vllm:generation_tokens_total Number of generation tokens processed.\n'
            'vllm:generation_tokens_total{engine="0",model_name="m"} 345.0\n'
            'vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9\n')
    assert generation_tokens(text) == 345.0


def test_effective_sampling_trusts_the_token_check_over_the_log() -> None:
    dropped = {"presence_penalty": {"applied": False, "override": 1.5, "neutral": 0.0}}
    assert effective_sampling({"temperature": 0.7}, {"presence_penalty": 1.5}, dropped) == {
        "presence_penalty": 0.0, "temperature": 0.7}
    unknown = {"presence_penalty": {"applied": None, "override": 1.5, "neutral": 0.0}}
    assert effective_sampling({}, None, unknown) == {}


# ------------------------------------------------------------------ real vLLM server (make test-vllm)

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


def _server_request(model: Path, launcher: list[str], port: int) -> dict:
    request = base_request(model, "openai", {"temperature": 0.0, "max_tokens": 1500},
                           loop_guard={"min_pattern_size": 1, "max_pattern_size": 20, "min_count": 8})
    request["engine"].update(launcher=launcher, server_flags=OVERRIDE, port=port, startup_timeout_s=600)
    return request


@pytest.mark.vllm
def test_server_default_applied_and_loop_cancelled(tiny_model: Path, tmp_path: Path) -> None:
    obs = run_probe(_server_request(tiny_model, CPU_LAUNCHER, 18431), tmp_path, "openai, override honoured")
    check = obs.extra["override_check"]["presence_penalty"]
    assert check == {"override": 1.5, "neutral": 0.0, "tokens": 48, "matches_override": True,
                     "matches_neutral": False, "applied": True}
    assert obs.sampling["presence_penalty"] == 1.5
    assert obs.extra["server_defaults"] == {"presence_penalty": 1.5}
    assert obs.extra["stages"]["sampler"]["presence_penalty"] == 1.5
    _assert_cancelled_early(obs)
    argv = obs.extra["server_argv"]
    assert argv[0].endswith(".venv-vllm/bin/python") and argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[-2:] == OVERRIDE
    assert obs.extra["server_exit"] is not None  # stopped, not left behind


@pytest.mark.vllm
def test_server_default_dropped_is_reported(tiny_model: Path, tmp_path: Path) -> None:
    obs = run_probe(_server_request(tiny_model, BROKEN_LAUNCHER, 18432), tmp_path, "openai, override dropped")
    check = obs.extra["override_check"]["presence_penalty"]
    assert check["applied"] is False and check["matches_neutral"] is True
    assert obs.sampling["presence_penalty"] == 0.0
    # The server's own log still announces the default (it is logged before it is lost): only the
    # token comparison shows that it never reached the sampler.
    assert obs.extra["server_defaults"] == {"presence_penalty": 1.5}
    _assert_cancelled_early(obs)


def _assert_cancelled_early(obs) -> None:
    """The detector fired, the connection closed, and the server stopped generating soon after."""
    assert obs.stop_reason == "repetition_detected" and obs.extra["loop"]["detected_by"] == "probe"
    produced = len(obs.output_token_ids)
    assert produced < 1500
    generated = obs.extra["server_generated_tokens"]
    assert produced <= generated < produced + 200, (produced, generated)
    assert obs.prompt_token_ids and obs.top_logprobs and len(obs.top_logprobs) == produced
