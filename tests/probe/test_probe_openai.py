"""The `openai` probe backend: parsing here, a real vLLM server (CPU build) in the `vllm` tier."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bisect_npu.probe.backends.openai import (
    Server,
    choice_tokens,
    effective_sampling,
    generation_tokens,
    logged_defaults,
    override_generation_config,
    sse_events,
)
from bisect_npu.probe.request import trial_requests
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import HELPERS
from tests.helpers.signals import owned_processes
from tests.helpers.tiny_qwen3 import write_tiny_qwen3
from tests.helpers.vllm_tier import (
    TIMINGS,
    VLLM_ENV,
    base_request,
    batch_request,
    require_vllm,
    run_probe,
    run_probe_batch,
)

CPU_LAUNCHER = ["{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}"]
BROKEN_LAUNCHER = ["{python}", str(HELPERS / "vllm_server_dropping_penalties.py"),
                   "--model", "{model}"]
OVERRIDE = ["--override-generation-config", '{"presence_penalty": 1.5}']


def test_sse_events_stop_at_done() -> None:
    lines = [b'data: {"a": 1}\n', b"\n", b": keep-alive\n", b'data: {"a": 2}\n', b"data: [DONE]\n", b'data: {"a": 3}\n']
    assert list(sse_events(iter(lines))) == [{"a": 1}, {"a": 2}]


def test_chat_choice_tokens_from_token_id_strings() -> None:
    choice = {"delta": {"content": "hi"}, "logprobs": {"content": [
        {"token": "token_id:17", "logprob": -0.1,
         "top_logprobs": [{"token": "token_id:4", "logprob": -2.0}, {"token": "token_id:17", "logprob": -0.1}]}]}}
    assert choice_tokens(choice, 5) == ([17], [[[17, -0.1], [4, -2.0]]])
    assert choice_tokens({**choice, "token_ids": [99]}, 1)[0] == [99]  # explicit ids win


def test_completion_choice_tokens() -> None:
    top = [{"token_id:1": -0.5}, {"token_id:2": -0.2, "token_id:9": -3}]
    choice = {"text": "ab", "logprobs": {"tokens": ["token_id:1", "token_id:2"], "top_logprobs": top}}
    assert choice_tokens(choice, 5) == ([1, 2], [[[1, -0.5]], [[2, -0.2], [9, -3.0]]])


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


@contextmanager
def stand_in_server(answer: Callable[[str], tuple[int, bytes]],
                    method: str = "GET") -> Iterator[tuple[Server, list[str]]]:
    """A local HTTP server whose ``method`` requests ``answer`` maps from path to (status, body),
    every asked path logged; the openai backend's ``Server`` pointed at it."""
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def respond(self) -> None:
            paths.append(self.path)
            status, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    setattr(Handler, f"do_{method}", Handler.respond)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield Server([], "unused.log", httpd.server_address[1]), paths
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_counter_is_taken_at_once_where_a_request_read_to_its_end_puts_it() -> None:
    """A stand-in /metrics answering counts in turn: found where the tokens read put it (nothing
    cancelled), the counter is read once, without the quiet spell, or as soon as a lagging counter
    gets there; after a cancelled request (the server went on with it) it is read until it stops
    moving."""
    counts: list[float] = []

    def metrics(_: str) -> tuple[int, bytes]:
        return 200, f"vllm:generation_tokens_total {counts.pop(0) if len(counts) > 1 else counts[0]}\n".encode()

    with stand_in_server(metrics) as (server, asked):
        counts[:] = [120.0]
        clock = time.monotonic()
        assert server.settled_generated_tokens(quiet_s=5.0, finished_at=120.0) == 120.0
        assert asked == ["/metrics"] and time.monotonic() - clock < 5.0
        counts[:] = [100.0, 120.0, 120.0]
        asked.clear()
        assert server.settled_generated_tokens(quiet_s=0.01, finished_at=120.0) == 120.0 and len(asked) == 2
        counts[:] = [90.0, 117.0, 120.0, 120.0]
        asked.clear()
        assert server.settled_generated_tokens(quiet_s=0.01) == 120.0 and len(asked) == 4


def test_effective_sampling_trusts_the_token_check_over_the_log() -> None:
    dropped = {"presence_penalty": {"applied": False, "override": 1.5, "neutral": 0.0}}
    assert effective_sampling({"temperature": 0.7}, {"presence_penalty": 1.5}, dropped) == {
        "presence_penalty": 0.0, "temperature": 0.7}
    unknown = {"presence_penalty": {"applied": None, "override": 1.5, "neutral": 0.0}}
    assert effective_sampling({}, None, unknown) == {}


@pytest.fixture
def reset_answers() -> Iterator[tuple[Server, list[tuple[int, bytes]], list[str]]]:
    """A stand-in server: POST /reset_prefix_cache answers from a list (status, body), logs the paths."""
    answers: list[tuple[int, bytes]] = []

    def reset(path: str) -> tuple[int, bytes]:
        return answers.pop(0) if path == "/reset_prefix_cache" else (404, b"")

    with stand_in_server(reset, method="POST") as (server, paths):
        yield server, answers, paths


def test_reset_prefix_cache_asks_again_while_blocks_are_held(reset_answers) -> None:
    server, answers, paths = reset_answers
    answers += [(200, json.dumps({"success": False}).encode()), (200, json.dumps({"success": True}).encode())]
    assert server.reset_prefix_cache(limit_s=10) is True and paths == ["/reset_prefix_cache"] * 2
    answers.append((200, b""))  # servers that answer with an empty 200
    assert server.reset_prefix_cache() is True
    answers += [(200, json.dumps({"success": False}).encode())] * 2
    assert server.reset_prefix_cache(limit_s=0.1) is False  # still held when the time is up


def test_a_loop_found_mid_chunk_keeps_tokens_and_logprob_rows_aligned() -> None:
    """A server under load streams several tokens per chunk: the detector fires on the fourth
    token, inside the second chunk of three; the observation keeps four tokens and four rows."""
    from bisect_npu.probe.backends.openai import stream_case
    from bisect_npu.probe.loop import LoopHit

    def chunk(ids: list[int]) -> bytes:
        content = [{"token": f"token_id:{i}", "logprob": -0.1, "top_logprobs": [{"token": f"token_id:{i}",
                                                                                  "logprob": -0.1}]} for i in ids]
        choice = {"index": 0, "delta": {"content": "x" * len(ids)}, "logprobs": {"content": content}}
        return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for ids in ([1, 2], [3, 4, 5], [6]):
                self.wfile.write(chunk(ids))
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args: object) -> None:
            pass

    class FiresOnTheFourth:
        def __init__(self) -> None:
            self.seen = 0

        def push(self, token: int) -> LoopHit | None:
            self.seen += 1
            return LoopHit(start=0, period=1, count=4, covered_tokens=4, end=4) if self.seen == 4 else None

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        observation: dict = {"extra": {}}
        stream_case(Server([], "unused.log", httpd.server_address[1]), "/v1/chat/completions",
                    {"logprobs": True, "top_logprobs": 1}, FiresOnTheFourth(), observation, timeout_s=30)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert observation["output_token_ids"] == [1, 2, 3, 4]
    assert [row[0][0] for row in observation["top_logprobs"]] == [1, 2, 3, 4]
    assert observation["stop_reason"] == "repetition_detected"


def test_reset_prefix_cache_without_dev_mode_is_reported(reset_answers) -> None:
    server, answers, _ = reset_answers
    answers.append((404, b'{"detail": "Not Found"}'))
    assert server.reset_prefix_cache() is False


# ------------------------------------------------------------------ real vLLM server (make test-vllm)

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


# Room to stop in: the prompt and this fit max_model_len (2048) with a margin.
LOOP_MAX_TOKENS = 1900


def _server_request(model: Path, launcher: list[str], port: int) -> dict:
    request = base_request(model, "openai", {"temperature": 0.0, "max_tokens": LOOP_MAX_TOKENS},
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


@pytest.mark.vllm
def test_batch_trial_equals_a_fresh_server(tiny_model: Path, tmp_path: Path) -> None:
    """Trial 1 on a server that ran trial 0 (prefix cache reset between) equals it on a fresh server.

    Trial 0 of a batch is a fresh start by construction: only trial 1 gets a single run.
    """
    request = base_request(tiny_model, "openai", {"temperature": 1.0, "top_p": 0.95, "max_tokens": 48})
    request["engine"].update(launcher=CPU_LAUNCHER, port=18433, startup_timeout_s=600)
    batch = batch_request(request, [7, 8], tmp_path / "batch")
    first, second = run_probe_batch(batch, tmp_path / "batch", "openai batch of 2 sampled")
    single = trial_requests(batch)[1]
    single["engine"] = {**single["engine"], "port": 18434}
    alone = run_probe(single, tmp_path / "single", "openai single, trial 1 of the batch")
    assert (first.trial, first.seed, second.trial, second.seed) == (0, 7, 1, 8)
    assert second.output_token_ids == alone.output_token_ids and len(alone.output_token_ids) == 48
    assert second.top_logprobs == alone.top_logprobs and second.sampling["seed"] == alone.sampling["seed"] == 8
    assert first.output_token_ids != second.output_token_ids
    assert first.timings.load_s > 0 and second.timings.load_s == 0.0 and alone.timings.load_s > 0
    assert second.extra["prefix_cache_reset"] is True  # the probe started the server in dev mode
    assert [obs.extra["batch"] for obs in (first, second)] == [{"index": 0, "size": 2}, {"index": 1, "size": 2}]
    assert first.extra["server_exit"] is None and second.extra["server_exit"] is None
    assert alone.extra["server_exit"] is not None and "batch" not in alone.extra
    assert first.extra["server_log"] == second.extra["server_log"]  # one server, one log


@pytest.mark.vllm
def test_sigterm_to_run_while_the_server_is_up_leaves_no_process(tiny_model: Path, tmp_path: Path) -> None:
    """What CI does when it cancels a job: SIGTERM to `bisect-npu run` while the probe's vLLM
    server (a session of its own) and its engine core process serve a request. Nothing the run
    started may be left: no process carries the session's mark afterwards."""
    port = 18435
    environment = {**VLLM_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # the engine core in a process of its own
    recipe = tmp_path / "sigterm.yaml"
    recipe.write_text(json.dumps({
        "name": "vllm-tier-sigterm", "model": {"path": str(tiny_model), "dtype": "float32"},
        "engine": {"backend": "openai", "port": port, "startup_timeout_s": 900,
                   "launcher": [str(require_vllm()), "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}"],
                   "args": {"max_model_len": 2048, "enforce_eager": True}},
        "environment": environment,
        "cases": [{"id": "long", "messages": [{"role": "user", "content": "count to one thousand"}],
                   "sampling": {"temperature": 1.0, "max_tokens": 1900}}],
        "trials": {"mode": "exact", "count": 1}}))
    repo = tmp_path / "repo"
    make_linear_repo(repo, 5, tags={0: "good", 4: "bad"})
    session = tmp_path / "session"
    run = subprocess.Popen([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", "good",
                            "--bad", "bad", "--recipe", str(recipe), "--session", str(session), "--quiet"],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 900
        while not _healthy(port):
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the server never answered /health"
            time.sleep(1)
        time.sleep(3)  # the probe's request is streaming
        before = owned_processes(session)
        assert any("EngineCore" in line for line in before), before
        sent = time.monotonic()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)
        stop_s = round(time.monotonic() - sent, 2)
    finally:
        run.kill()
    left = owned_processes(session)
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    with TIMINGS.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"run": "SIGTERM to run with the openai server up", "stop_s": stop_s,
                             "processes_before": len(before), "processes_left": len(left)}) + "\n")
    assert run.returncode == 130 and "bisect-npu: interrupted" in err, err
    assert left == [], left
    assert not _healthy(port)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _assert_cancelled_early(obs) -> None:
    """The detector fired, the connection closed, and the server stopped before max_tokens.

    How far the engine runs past the last token the probe read is how far the probe's reading lags
    it, which is load (717 against 190 read on a loaded CI machine): not a bound to assert. That the
    server's own counter stops short of max_tokens is what the cancel did.
    """
    assert obs.stop_reason == "repetition_detected" and obs.extra["loop"]["detected_by"] == "probe"
    produced = len(obs.output_token_ids)
    generated = obs.extra["server_generated_tokens"]
    assert produced <= generated < LOOP_MAX_TOKENS, (produced, generated)
    assert obs.prompt_token_ids and obs.top_logprobs and len(obs.top_logprobs) == produced
