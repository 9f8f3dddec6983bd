"""Server backend: start vLLM's OpenAI server with the recipe's flags, stream the case, stop it.

Standard library only (urllib/http.client). Tokens are fed to the loop detector as they stream;
when it fires the connection is closed, which makes vLLM abort the request, so a 32K loop costs
seconds. Server-side defaults (`--override-generation-config`) are checked, not assumed: the
server's own log line and, for each overridden penalty the case does not send, a greedy
comparison against explicit values (`extra["override_check"]`).

A recipe's `engine.load` puts the server under load while the case runs: each trial sends the case
`requests` times, at most `concurrency` at once; the first request is observed (and judged), the
others run to their end beside it (`extra["load"]` says how many did, and the most in flight).

A batch of trials shares one server start. Between trials the server's prefix cache is reset
(`POST /reset_prefix_cache`, a dev-mode endpoint: the probe starts the server with
VLLM_SERVER_DEV_MODE=1), so a later trial cannot reuse the KV blocks of an earlier one. A sampled
case that sends no seed draws from the server's global generator, which runs on from trial to
trial: such trials are reproducible only per batch, seeded ones (`case.sampling.seed`) per trial.
"""

from __future__ import annotations

import ast
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..accuracy import check_inputs, run_accuracy
from ..ports import check_own_listener, free_port, holder, port_is_free
from ..trials import (
    NEUTRAL_PENALTY,
    Stopwatch,
    TrialCounter,
    engine_versions,
    loop_detector,
    record_loop,
    run_once,
    top_logprobs_row,
)

DEFAULT_LAUNCHER = ["vllm", "serve", "{model}"]
HOST = "127.0.0.1"
DEFAULT_TOP_K = 5
OVERRIDE_CHECK_TOKENS = 48
# Older servers: "Using default chat sampling params from model: {...}"; newer: "Default vLLM sampling
# parameters have been overridden by the model's `generation_config.json`: `{...}`".
_DEFAULTS_LINES = (
    re.compile(r"default (?:chat |completion )?sampling params from [^:]*: (\{.*\})", re.IGNORECASE),
    re.compile(r"sampling parameters have been overridden by .*?: `(\{.*?\})`", re.IGNORECASE),
)
_GENERATION_COUNTER = re.compile(r"^vllm:generation_tokens(?:_total)?(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)
_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
# The probe's own package as the candidate imports it (bisect_npu.probe here, another name in an
# image): a launcher's `{probe}`, e.g. `["{python}", "-m", "{probe}.serve_mini", "{model}"]`.
PROBE_PACKAGE = __package__.rsplit(".", 1)[0] if __package__ else "bisect_npu.probe"
# Dev mode adds only the dev endpoints (and error stacks in the log): /reset_prefix_cache among them.
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
# How often a starting server is asked for /health (and checked for having exited): a refused
# connection costs microseconds, and each start waits on average half of this past its readiness.
HEALTH_POLL_S = 0.1


def _flag_values(key: str, value: Any) -> list[str]:
    flag = "--" + key.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def server_argv(request: dict[str, Any], python: str = sys.executable) -> list[str]:
    """The server command line: launcher (with {model}/{python}/{port}), port, dtype, args, flags."""
    engine = request.get("engine", {})
    model = request["model"]
    port = str(engine.get("port", 8000))
    launcher = engine.get("launcher") or DEFAULT_LAUNCHER
    argv = [part.format(model=model["path"], python=python, port=port, probe=PROBE_PACKAGE) for part in launcher]
    argv += ["--host", HOST, "--port", port]
    if model.get("dtype") and model["dtype"] != "auto":
        argv += ["--dtype", model["dtype"]]
    if model.get("tokenizer"):
        argv += ["--tokenizer", model["tokenizer"]]
    if request.get("seed") is not None:
        argv += ["--seed", str(request["seed"])]
    for key, value in engine.get("args", {}).items():
        argv += _flag_values(key, value)
    return argv + list(engine.get("server_flags", []))


def probe_import_env(engine: dict[str, Any]) -> dict[str, str]:
    """For a launcher that runs the probe's own package (`{probe}`, the demo server): the directory
    holding that package at the end of PYTHONPATH, after the candidate's own entries. In a
    container the package is mounted outside every path the image's Python searches."""
    if not any("{probe}" in part for part in engine.get("launcher") or []):
        return {}
    holder_dir = os.path.dirname(os.path.abspath(__file__))
    for _ in range(1 + len(PROBE_PACKAGE.split("."))):  # backends/, then the package's own levels
        holder_dir = os.path.dirname(holder_dir)
    have = [part for part in os.environ.get("PYTHONPATH", "").split(os.pathsep) if part]
    return {"PYTHONPATH": os.pathsep.join([*have, holder_dir])}


def override_generation_config(argv: list[str]) -> dict[str, Any]:
    """The JSON given to `--override-generation-config` on a command line, or {}."""
    for index, arg in enumerate(argv):
        given = None
        if arg.startswith("--override-generation-config="):
            given = arg.split("=", 1)[1]
        elif arg == "--override-generation-config" and index + 1 < len(argv):
            given = argv[index + 1]
        if given is not None:
            config: dict[str, Any] = json.loads(given)
            return config
    return {}


def logged_defaults(log_text: str) -> dict[str, Any] | None:
    """The default sampling params the server says it uses (its startup log line), if logged."""
    found = None
    for pattern in _DEFAULTS_LINES:
        for match in pattern.finditer(log_text):
            try:
                found = ast.literal_eval(match.group(1))
            except (ValueError, SyntaxError):
                continue
    return found


def generation_tokens(metrics_text: str) -> float:
    """Total tokens the server has generated, from its Prometheus `/metrics` page."""
    return sum(float(value) for value in _GENERATION_COUNTER.findall(metrics_text))


class Server:
    """A vLLM server process in its own process group; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, argv: list[str], log_path: str, port: int, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.env = env or {}  # the serving node's own environment, for an engine across hosts
        self.log_path = log_path
        self.base = f"http://{HOST}:{port}"
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float) -> float:
        clock = Stopwatch()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **SERVER_ENV, **self.env})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before /health answered; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as response:
                    if response.status == 200:
                        check_own_listener(self.port, self.proc.pid)  # not a server already listening there
                        return clock.seconds()
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException):
                pass
            time.sleep(HEALTH_POLL_S)
        raise RuntimeError(f"server not healthy after {timeout_s:.0f}s; log {self.log_path}:\n{self.log_tail()}")

    def log_text(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, grace_s: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                return self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    def reset_prefix_cache(self, limit_s: float = 30.0) -> bool:
        """Drop the KV blocks earlier requests left for reuse; False where the server cannot.

        The endpoint exists only in dev mode (404 otherwise). vLLM refuses (`success: false`) while
        blocks are still held, e.g. by a request the loop guard cancelled a moment ago: ask again
        until it succeeds or `limit_s` passes.
        """
        deadline = time.monotonic() + limit_s
        while True:
            req = urllib.request.Request(self.base + "/reset_prefix_cache", data=b"", method="POST")
            try:
                with urllib.request.urlopen(req, timeout=60) as response:
                    body = response.read()
            except urllib.error.HTTPError as exc:
                if exc.code in (404, 405):
                    return False
                raise
            done = bool(json.loads(body).get("success", True)) if body.strip() else True
            if done or time.monotonic() >= deadline:
                return done
            time.sleep(0.5)

    def generated_tokens(self) -> float:
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as response:
            return generation_tokens(response.read().decode("utf-8", errors="replace"))

    def settled_generated_tokens(self, quiet_s: float = 2.0, limit_s: float = 60.0,
                                 finished_at: float | None = None) -> float:
        """The generation counter once it stops moving: what a cancelled request really cost.
        `finished_at`: where it ends when no request was cancelled (each streamed to its end, every
        token it generated read); found there, it moves no more, and no quiet spell is waited for."""
        deadline = time.monotonic() + limit_s
        last = self.generated_tokens()
        if last == finished_at:
            return last
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.generated_tokens()
            if now in (last, finished_at):
                return now
            last = now
        return last

    def model_id(self) -> str:
        with urllib.request.urlopen(self.base + "/v1/models", timeout=30) as response:
            return str(json.loads(response.read())["data"][0]["id"])


def sse_events(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """Server-sent events as JSON objects; stops at `data: [DONE]`."""
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


def _token_id(token: str) -> int | None:
    match = _TOKEN_ID.match(token or "")
    return int(match.group(1)) if match else None


def _candidate_id(token: str) -> int:
    """A top-logprobs candidate's id: return_tokens_as_token_ids spells every one as token_id:N."""
    token_id = _token_id(token)
    assert token_id is not None, token
    return token_id


def request_body(model_id: str, case: dict[str, Any], sampling: dict[str, Any],
                 top_k: int) -> tuple[str, dict[str, Any]]:
    """The endpoint and JSON body: chat for messages, completions for a prompt; sampling as sent."""
    body: dict[str, Any] = {"model": model_id, "stream": True, "return_tokens_as_token_ids": True,
                            "return_token_ids": True, **sampling}
    if case.get("messages") is not None:
        body.update(messages=case["messages"], logprobs=True, top_logprobs=top_k)
        return "/v1/chat/completions", body
    body.update(prompt=case["prompt"], logprobs=top_k)
    return "/v1/completions", body


def stream_case(server: Server, path: str, body: dict[str, Any], detector: Any, observation: dict[str, Any],
                timeout_s: float) -> None:
    """Stream one request into the observation; close the connection when the detector fires."""
    conn = http.client.HTTPConnection(HOST, server.port, timeout=timeout_s)
    tokens: list[int] = []
    rows: list[list[list[Any]]] = []
    text: list[str] = []
    top_k = int(body.get("top_logprobs") or body.get("logprobs") or DEFAULT_TOP_K)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{path} answered {response.status}: {response.read()[:2000]!r}")
        for event in sse_events(response):
            if event.get("prompt_token_ids"):
                observation["prompt_token_ids"] = list(event["prompt_token_ids"])
            for choice in event.get("choices", []):
                new_tokens, new_rows = choice_tokens(choice, top_k)
                if choice.get("prompt_token_ids"):
                    observation["prompt_token_ids"] = list(choice["prompt_token_ids"])
                text.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
                if choice.get("finish_reason"):
                    observation["finish_reason"] = choice["finish_reason"]
                    stop = choice.get("stop_reason")
                    observation["stop_reason"] = stop if stop is None or isinstance(stop, str) else str(stop)
                # Token by token with its logprob row: a server under load sends several tokens in
                # one chunk, and a loop found mid-chunk keeps the two lists the same length.
                for index, token in enumerate(new_tokens):
                    tokens.append(token)
                    rows.extend(new_rows[index:index + 1])
                    hit = detector.push(token) if detector is not None else None
                    if hit is not None:
                        record_loop(observation, hit, detected_by="probe")
                        return
                rows.extend(new_rows[len(new_tokens):])
    finally:
        conn.close()  # an early close is the cancellation: vLLM aborts a request whose client left
        observation["output_token_ids"] = tokens
        observation["text"] = "".join(text)
        observation["top_logprobs"] = rows or None


def under_load(server: Server, path: str, body: dict[str, Any], load: dict[str, Any], observe: Callable[[], None],
               timeout_s: float) -> dict[str, Any]:
    """Run `observe` (the observed request) with `requests - 1` copies of the request beside it,
    at most `concurrency` in flight; what the load did, for `extra["load"]`."""
    concurrency, requests = int(load.get("concurrency", 1)), int(load.get("requests", 1))
    lock = threading.Lock()
    state = {"in_flight": 0, "max_in_flight": 0, "completed": 0}
    errors: list[str] = []

    def tracked(work: Callable[[], None]) -> None:
        with lock:
            state["in_flight"] += 1
            state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
        try:
            work()
        finally:
            with lock:
                state["in_flight"] -= 1

    def one_more() -> None:
        try:
            stream_case(server, path, body, None, {"extra": {}}, timeout_s)
        except (OSError, RuntimeError, http.client.HTTPException) as exc:
            with lock:
                errors.append(str(exc)[:500])
            return
        with lock:
            state["completed"] += 1

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        observed = pool.submit(tracked, observe)
        others = [pool.submit(tracked, one_more) for _ in range(requests - 1)]
        observed.result()
        for other in others:
            other.result()
    return {"concurrency": concurrency, "requests": requests, "completed": state["completed"] + 1,
            "max_in_flight": state["max_in_flight"], "errors": errors[:3]}


def choice_tokens(choice: dict[str, Any], top_k: int) -> tuple[list[int], list[list[list[Any]]]]:
    """Token ids and best-first logprob rows of one streamed choice (chat or completions shape)."""
    logprobs = choice.get("logprobs") or {}
    rows: list[list[list[Any]]] = []
    ids: list[int | None] = []
    if "content" in logprobs:  # chat
        for item in logprobs.get("content") or []:
            ids.append(_token_id(item.get("token", "")))
            rows.append(top_logprobs_row([(_candidate_id(c["token"]), c["logprob"])
                                          for c in item.get("top_logprobs") or []], top_k))
    elif logprobs.get("tokens"):  # completions
        ids = [_token_id(token) for token in logprobs["tokens"]]
        for candidates in logprobs.get("top_logprobs") or []:
            rows.append(top_logprobs_row([(_candidate_id(t), lp) for t, lp in (candidates or {}).items()], top_k))
    explicit = choice.get("token_ids") or (choice.get("delta") or {}).get("token_ids")
    tokens = list(explicit) if explicit else [t for t in ids if t is not None]
    return tokens, rows


def _greedy_tokens(server: Server, model_id: str, case: dict[str, Any], sampling: dict[str, Any],
                   max_tokens: int) -> list[int]:
    check = {**sampling, "temperature": 0.0, "max_tokens": max_tokens}
    path, body = request_body(model_id, case, check, 1)
    observation: dict[str, Any] = {"extra": {}}
    stream_case(server, path, body, None, observation, timeout_s=600.0)
    return [int(token) for token in observation["output_token_ids"]]


def override_check(server: Server, model_id: str, case: dict[str, Any], sent: dict[str, Any],
                   overrides: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """For each overridden penalty the case leaves to the server: did the default arrive?

    Three greedy runs: the default (not sent), the override value sent explicitly, and the
    neutral value sent explicitly. `applied` is True when the default run matches only the
    override, False when it matches only the neutral value, None when the prompt cannot tell.
    """
    results: dict[str, Any] = {}
    base = {key: value for key, value in sent.items() if key not in ("temperature", "max_tokens")}
    default_run = None
    for param, value in overrides.items():
        if param not in NEUTRAL_PENALTY or param in sent:
            continue
        if default_run is None:
            default_run = _greedy_tokens(server, model_id, case, base, max_tokens)
        with_value = _greedy_tokens(server, model_id, case, {**base, param: value}, max_tokens)
        neutral = _greedy_tokens(server, model_id, case, {**base, param: NEUTRAL_PENALTY[param]}, max_tokens)
        matches_override, matches_neutral = default_run == with_value, default_run == neutral
        results[param] = {
            "override": value, "neutral": NEUTRAL_PENALTY[param], "tokens": max_tokens,
            "matches_override": matches_override, "matches_neutral": matches_neutral,
            "applied": matches_override if matches_override != matches_neutral else None,
        }
    return results


class ServerEngine(TrialCounter):
    """One vLLM OpenAI server, started for the request's case, that runs trials until `close()`."""

    def __init__(self, request: dict[str, Any]) -> None:
        if request.get("accuracy") is not None:
            check_inputs(request)
        engine = request.get("engine", {})
        self.versions = engine_versions()
        port = int(engine.get("port", 8000))
        if not port_is_free(HOST, port):  # another process's: the candidate's server gets a port of its own
            held, port = port, free_port(HOST)
            print(f"port {held} is held by {holder(held)}: the server listens on {port}", file=sys.stderr)
            request = {**request, "engine": {**engine, "port": port}}
        self.argv = server_argv(request)
        self.log_path = engine.get("server_log") or (os.path.splitext(request["output"])[0] + ".server.log")
        self.server = Server(self.argv, self.log_path, port, {**probe_import_env(engine), **{
            str(k): str(v) for k, v in (engine.get("server_env") or {}).items()}})
        try:
            self.load_s = self.server.start(float(engine.get("startup_timeout_s", 600.0)))
            self.model_id = self.server.model_id()
        except BaseException:
            self.server.stop()
            raise

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """One trial; `server_exit` stays None (known once stopped: `run_case` fills it in)."""
        if request.get("accuracy") is not None:
            return self.run_accuracy(request)
        index, observation = self.begin_trial(request)
        server, model_id = self.server, self.model_id
        case = request["case"]
        sent = {key: value for key, value in case.get("sampling", {}).items() if value is not None}
        logits = request.get("logits") or {}
        top_k = int(logits.get("top_k", DEFAULT_TOP_K))
        sent.pop("logprobs", None)  # the probe always asks for top-k logprobs itself
        observation["extra"].update(server_argv=self.argv, server_log=self.log_path)
        if index:
            observation["extra"]["prefix_cache_reset"] = server.reset_prefix_cache()
        path, body = request_body(model_id, case, sent, top_k)
        before = server.generated_tokens()
        clock = Stopwatch()
        timeout_s = float(request.get("timeout_s", 3600.0))

        def observe() -> None:
            stream_case(server, path, body, loop_detector(request.get("loop_guard")), observation, timeout_s)

        load = request.get("engine", {}).get("load") or {}
        if int(load.get("requests", 1)) > 1:
            observation["extra"]["load"] = under_load(server, path, body, load, observe, timeout_s)
        else:
            observe()
        observation["timings"]["generate_s"] = clock.seconds()
        # Tokens the server generated for this trial's requests, cancelled or not (its own counter). A
        # lone request the probe read to its end generated what it read: the counter is there at once.
        alone = int(load.get("requests", 1)) <= 1 and "loop" not in observation["extra"]
        finished_at = before + len(observation["output_token_ids"]) if alone else None
        observation["extra"]["server_generated_tokens"] = int(
            server.settled_generated_tokens(finished_at=finished_at) - before)
        if not observation["prompt_token_ids"]:
            tokenized = server.post("/tokenize", {"model": model_id, **_tokenize_input(case)})
            observation["prompt_token_ids"] = list(tokenized.get("tokens", []))
        detok = server.post("/detokenize", {"model": model_id, "tokens": observation["prompt_token_ids"]})
        observation["extra"]["rendered_prompt"] = detok.get("prompt")
        overrides = override_generation_config(self.argv)
        if overrides and request.get("trial", 0) == 0:
            check_tokens = min(int(sent.get("max_tokens", OVERRIDE_CHECK_TOKENS)), OVERRIDE_CHECK_TOKENS)
            observation["extra"]["override_check"] = override_check(server, model_id, case, sent, overrides,
                                                                    check_tokens)
        observation["extra"]["server_exit"] = None
        defaults = logged_defaults(server.log_text())  # logged at start-up: readable while it runs
        observation["extra"]["server_defaults"] = defaults
        observation["sampling"] = effective_sampling(sent, defaults, observation["extra"].get("override_check"))
        observation["extra"]["stages"] = {
            "chat_template": observation["extra"].get("rendered_prompt"),
            "prompt_token_ids": observation["prompt_token_ids"], "sampler": observation["sampling"],
            "text": observation["text"]}
        return observation

    def run_accuracy(self, request: dict[str, Any]) -> dict[str, Any]:
        """One trial of an accuracy recipe: the harness scores this server; its samples are the observation's."""
        _, observation = self.begin_trial(request)
        clock = Stopwatch()
        samples = run_accuracy(request, HOST, self.server.port, self.model_id)
        observation["timings"]["generate_s"] = clock.seconds()
        observation["samples"] = samples
        observation["sampling"] = {k: v for k, v in request["case"].get("sampling", {}).items() if v is not None}
        observation["extra"].update(server_argv=self.argv, server_log=self.log_path, server_exit=None,
                                    harness=request["accuracy"].get("harness"), samples_run=len(samples))
        return observation

    def close(self) -> int | None:
        """Stop the server; its exit status."""
        return self.server.stop()


def open_engine(request: dict[str, Any], trials: int = 1) -> ServerEngine:
    """Start the server for the request's case (flags, port and seed from this request)."""
    return ServerEngine(request)


def run_case(request: dict[str, Any]) -> dict[str, Any]:
    """One trial on its own server start, which is stopped before the observation is returned."""
    observation, server_exit = run_once(open_engine(request), request)
    observation["extra"]["server_exit"] = server_exit
    return observation


def _tokenize_input(case: dict[str, Any]) -> dict[str, Any]:
    if case.get("messages") is not None:
        return {"messages": case["messages"], "add_generation_prompt": True}
    return {"prompt": case["prompt"]}


def effective_sampling(sent: dict[str, Any], defaults: dict[str, Any] | None,
                       checks: dict[str, Any] | None) -> dict[str, Any]:
    """What the server applied: what was sent, over the defaults it logged, corrected by the checks."""
    applied = {**(defaults or {}), **sent}
    for param, check in (checks or {}).items():
        if check["applied"] is True:
            applied[param] = check["override"]
        elif check["applied"] is False:
            applied[param] = check["neutral"]
    return applied
