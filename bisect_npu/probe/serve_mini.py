"""The demo engine (tinyvllm) behind an OpenAI-compatible HTTP server, as `vllm serve` serves a model.

    python -m bisect_npu.probe.serve_mini seed:0 --port 8000 [--max-model-len 2048]
        [--override-generation-config JSON] [--async-scheduling] [--served-model-name NAME]
        [--data-parallel-size N --data-parallel-address IP --data-parallel-rpc-port PORT
         [--headless --data-parallel-start-rank R]]

The server lives beside the probe, not in the demo's history (whose shas are fixed): like vLLM's
API server over vllm-ascend's engine, it serves whatever `tinyvllm` the candidate's PYTHONPATH
holds. The openai probe backend starts it with the launcher
`["{python}", "-m", "{probe}.serve_mini", "{model}"]`, and the accuracy harnesses (lm-eval,
AISBench) speak to it over HTTP.

Endpoints: `/health`, `/v1/models`, `/v1/completions`, `/v1/chat/completions` (stream or not,
SSE `data:` lines ending in `data: [DONE]`), and what the openai backend reads from vLLM:
`/tokenize`, `/detokenize`, `/metrics` (`vllm:generation_tokens_total`), `/reset_prefix_cache`.
Requests run one at a time (the engine has one KV cache per request and the CPU to itself).
Standard library only, besides the candidate's tinyvllm and its torch.

Across hosts, as `vllm serve` runs data parallel over nodes: rank 0 serves the API with
`--data-parallel-address` its own address, each other rank runs `--headless` with the serving
node's address and its `--data-parallel-start-rank`; all ranks meet over torch.distributed (gloo,
at the address and rpc port) before the API answers /health. Each request is sent to every rank,
each computes it with its own engine, and rank 0 answers only when every rank produced the same
tokens (a rank that disagrees or is gone fails the request): the forward pass runs on every node.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Request fields the engine's SamplingParams takes as they are.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "max_tokens", "seed")
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's (and OpenAI's) default for /v1/completions


class BadRequest(ValueError):
    """A request the server refuses with 400, as vLLM answers a bad field."""


def render_messages(messages: list[dict[str, Any]]) -> str:
    """The demo's chat template: one `role: content` line per message (the mini backend's rendering)."""
    lines = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        lines.append(f"{message.get('role', 'user')}: {content or ''}")
    return "\n".join(lines)


class Generation:
    """One choice being generated: its token ids, text pieces and why it stopped."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.pieces: list[str] = []
        self.finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class MiniServer:
    """The engine and what the HTTP layer needs of it: sampling, stop strings, EOS, counters."""

    def __init__(self, model: str, served_name: str, max_model_len: int,
                 override_generation_config: dict[str, Any] | None, engine_args: dict[str, Any],
                 ranks: DataParallel | None = None) -> None:
        from tinyvllm.engine import LLM
        from tinyvllm.server import CompletionServer

        self.llm = LLM(model, max_model_len=max_model_len, **engine_args)
        self.completions = CompletionServer(self.llm, override_generation_config)
        self.model_name = served_name
        self.max_model_len = max_model_len
        self.lock = threading.Lock()
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.ranks = ranks

    def encode(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str):
            raise BadRequest(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        return [int(token) for token in self.llm.tokenizer.encode(prompt)]

    def token_text(self, token_id: int) -> str:
        word = self.llm.tokenizer.decode([token_id])
        return f" {word}" if word else ""

    def params(self, body: dict[str, Any], default_max_tokens: int) -> tuple[Any, dict[str, Any]]:
        """The engine's SamplingParams (request fields over the server defaults) and the HTTP-only options."""
        sent: dict[str, Any] = {key: body[key] for key in SAMPLING_KEYS if body.get(key) is not None}
        if "max_tokens" not in sent and body.get("max_completion_tokens") is not None:
            sent["max_tokens"] = body["max_completion_tokens"]
        if "max_tokens" not in sent and "max_tokens" not in self.completions.defaults:
            sent["max_tokens"] = default_max_tokens
        for key in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            if key in sent and not isinstance(sent[key], (int, float)):
                raise BadRequest(f"{key} must be a number, got {sent[key]!r}")
        stop = body.get("stop") or []
        stops = [stop] if isinstance(stop, str) else list(stop)
        if not all(isinstance(s, str) for s in stops):
            raise BadRequest(f"stop must be a string or a list of strings, got {stop!r}")
        n = body.get("n", 1)
        if n not in (1, None):
            raise BadRequest(f"n={n}: this server generates one choice per prompt")
        extra = {"stop": [s for s in stops if s], "ignore_eos": bool(body.get("ignore_eos", False)),
                 "logprobs": body.get("logprobs"), "top_logprobs": body.get("top_logprobs")}
        try:
            return self.completions.sampling_params(sent), extra
        except (TypeError, ValueError) as exc:
            raise BadRequest(str(exc)) from exc

    def generate(self, prompt_ids: list[int], params: Any, extra: dict[str, Any],
                 top_k: int) -> Iterator[tuple[Generation, list[tuple[int, str, float, list[tuple[int, float]]]]]]:
        """Yield (the generation so far, the new tokens as (id, text, logprob, top candidates)) per step.

        Stops at EOS (unless ignore_eos), at a stop string (the text is cut before it, as vLLM
        does) or at max_tokens; the caller holds the lock."""
        if not prompt_ids:
            raise BadRequest("the prompt is empty")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise BadRequest(f"This model's maximum context length is {self.max_model_len} tokens; the prompt "
                             f"({len(prompt_ids)}) plus max_tokens ({params.max_tokens}) is longer")
        if self.ranks is not None:
            yield from self._on_every_rank(prompt_ids, params, extra, top_k)
            return
        yield from self.generate_here(prompt_ids, params, extra, top_k)

    def _on_every_rank(self, prompt_ids: list[int], params: Any, extra: dict[str, Any],
                       top_k: int) -> Iterator[tuple[Generation, list[Token]]]:
        """The request on every rank: sent to the others first, computed here while they compute
        it there, and held back at its end until every rank's tokens agree with these."""
        assert self.ranks is not None
        self.ranks.send_request((prompt_ids, params, extra, top_k))
        steps = list(self.generate_here(prompt_ids, params, extra, top_k))
        ours = steps[-1][0].token_ids if steps else []
        self.ranks.check_agreement(ours)
        yield from steps

    def generate_here(self, prompt_ids: list[int], params: Any, extra: dict[str, Any],
                      top_k: int) -> Iterator[tuple[Generation, list[Token]]]:
        """The generation on this rank's own engine (see `generate`)."""
        if top_k:
            params.logprobs = top_k
        eos = self.llm.tokenizer.eos_token_id
        self.prompt_tokens += len(prompt_ids)
        generation = Generation()
        sent_chars = 0
        for output in self.llm.stream(prompt_ids, params):
            self.generation_tokens += 1
            token = output.token_id
            generation.token_ids.append(token)
            if token == eos and not extra["ignore_eos"]:
                generation.finish_reason = "stop"
                yield generation, []
                return
            generation.pieces.append(self.token_text(token))
            text = generation.text
            cut = min((text.find(s) for s in extra["stop"] if s in text), default=-1)
            if cut >= 0:
                generation.pieces = [text[:cut]]
                generation.finish_reason = "stop"
            elif len(generation.token_ids) >= params.max_tokens:
                generation.finish_reason = "length"
            visible = generation.text[sent_chars:]
            # Hold back text that may be the start of a stop string until it is decided.
            held = 0 if generation.finish_reason else _held_back(generation.text, extra["stop"])
            piece = visible[:len(visible) - held] if held else visible
            sent_chars += len(piece)
            logprob = _logprob_of(output.top_logprobs, token)
            yield generation, [(token, piece, logprob, list(output.top_logprobs))]
            if generation.finish_reason:
                return
        generation.finish_reason = generation.finish_reason or "length"
        yield generation, []


def _held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` could begin a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                longest = max(longest, size)
                break
    return longest


def _logprob_of(candidates: list[tuple[int, float]], token: int) -> float:
    for candidate, logprob in candidates:
        if candidate == token:
            return logprob
    return candidates[0][1] if candidates else 0.0


class RanksDisagree(RuntimeError):
    """Another rank computed other tokens for the same request, or is gone."""


class DataParallel:
    """The ranks of one engine across nodes, met over torch.distributed (gloo). Requests go as
    pickled bytes in a uint8 tensor and tokens as int64 tensors, never through torch's object
    collectives, which need numpy (not in every candidate's image)."""

    def __init__(self, size: int, rank: int, address: str, port: int, timeout_s: float) -> None:
        import datetime

        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        self.size = size
        self.rank = rank
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        print(f"data parallel rank {rank} of {size} joined at {address}:{port}", flush=True)

    def send_request(self, request: Any) -> None:
        try:
            self._broadcast(pickle.dumps(request))
        except RuntimeError as exc:
            raise RanksDisagree(f"a data parallel rank is gone ({str(exc).splitlines()[0][:200]})") from exc

    def receive_request(self) -> Any:
        return pickle.loads(self._broadcast(b""))  # what rank 0 sent (a headless rank sends nothing)

    def _broadcast(self, payload: bytes) -> bytes:
        """Rank 0's `payload` on every rank (the others' is ignored)."""
        torch = self.torch
        size = torch.tensor([len(payload)], dtype=torch.int64)
        self.dist.broadcast(size, src=0)
        data = (torch.tensor(list(payload), dtype=torch.uint8) if self.rank == 0
                else torch.empty(int(size.item()), dtype=torch.uint8))
        self.dist.broadcast(data, src=0)
        return bytes(data.tolist())

    def _gather_tokens(self, tokens: list[int]) -> list[list[int]]:
        """Every rank's tokens on rank 0 (an empty list elsewhere): lengths first, then the tokens
        padded to the longest."""
        torch = self.torch
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self.dist.all_gather(lengths, torch.tensor([len(tokens)], dtype=torch.int64))
        longest = max(1, *(int(length.item()) for length in lengths))
        padded = torch.zeros(longest, dtype=torch.int64)
        padded[:len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
        if self.rank != 0:
            self.dist.gather(padded, None, dst=0)
            return []
        gathered = [torch.zeros(longest, dtype=torch.int64) for _ in range(self.size)]
        self.dist.gather(padded, gathered, dst=0)
        return [tensor[:int(length.item())].tolist() for tensor, length in zip(gathered, lengths, strict=True)]

    def check_agreement(self, tokens: list[int]) -> None:
        """Rank 0: every rank's tokens for the request just sent; RanksDisagree unless all are these."""
        try:
            gathered = self._gather_tokens(tokens)
        except RuntimeError as exc:
            raise RanksDisagree(f"a data parallel rank is gone ({str(exc).splitlines()[0][:200]})") from exc
        for rank, theirs in enumerate(gathered):
            if theirs != tokens:
                raise RanksDisagree(f"data parallel rank {rank} computed other tokens ({theirs[:8]}...) than rank 0 "
                                    f"({tokens[:8]}...)")
        print(f"data parallel: {self.size} ranks agree on {len(tokens)} tokens", file=sys.stderr, flush=True)

    def send_tokens(self, tokens: list[int]) -> None:
        self._gather_tokens(tokens)


def run_headless(engine: MiniServer, ranks: DataParallel) -> None:
    """A headless rank: compute every request rank 0 sends, send back its tokens; ends when rank 0 goes."""
    while True:
        try:
            prompt_ids, params, extra, top_k = ranks.receive_request()
        except RuntimeError as exc:  # rank 0 stopped: the engine is over
            print(f"data parallel rank {ranks.rank}: rank 0 is gone ({str(exc).splitlines()[0][:200]})", flush=True)
            return
        _, generation = _run_to_end(engine.generate_here(prompt_ids, params, extra, top_k))
        ranks.send_tokens(generation.token_ids)


class Handler(BaseHTTPRequestHandler):
    server_version = "tinyvllm-serve/1"
    protocol_version = "HTTP/1.1"
    engine: MiniServer  # set on the class by `serve`

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        self._send_json(status, {"object": "error", "message": message, "type": kind, "code": status})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/ping"):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [{
                "id": self.engine.model_name, "object": "model", "created": int(time.time()),
                "owned_by": "tinyvllm", "root": self.engine.model_name, "max_model_len": self.engine.max_model_len}]})
        elif path == "/metrics":
            text = (f"vllm:generation_tokens_total {float(self.engine.generation_tokens)}\n"
                    f"vllm:prompt_tokens_total {float(self.engine.prompt_tokens)}\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self._error(404, f"no route {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path == "/reset_prefix_cache":  # no prefix cache to reset: every request gets a fresh KV cache
            self._send_json(200, {"success": True})
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            if path == "/v1/completions":
                self._completions(body)
            elif path == "/v1/chat/completions":
                self._chat(body)
            elif path == "/tokenize":
                text = render_messages(body["messages"]) if body.get("messages") else body.get("prompt", "")
                tokens = self.engine.encode(text)
                self._send_json(200, {"tokens": tokens, "count": len(tokens), "max_model_len":
                                      self.engine.max_model_len})
            elif path == "/detokenize":
                self._send_json(200, {"prompt": self.engine.llm.tokenizer.decode(list(body.get("tokens") or []))})
            else:
                self._error(404, f"no route {path}")
        except (BadRequest, json.JSONDecodeError, KeyError) as exc:
            self._error(400, str(exc))
        except RanksDisagree as exc:
            self._error(500, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left mid-stream (a loop guard closing the connection): the request is dropped

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model not in (None, self.engine.model_name):
            raise BadRequest(f"The model `{model}` does not exist; this server serves `{self.engine.model_name}`")

    def _completions(self, body: dict[str, Any]) -> None:
        self._check_model(body)
        prompt = body.get("prompt")
        prompts = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        if prompt is None or not prompts:
            raise BadRequest("prompt is required")
        params, extra = self.engine.params(body, COMPLETIONS_DEFAULT_MAX_TOKENS)
        top_k = int(extra["logprobs"] or 0)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        created, request_id = int(time.time()), f"cmpl-{uuid.uuid4().hex}"
        if body.get("stream"):
            if len(prompts) != 1:
                raise BadRequest("stream=true takes one prompt")
            self._stream(body, self.engine.encode(prompts[0]), params, extra, top_k, chat=False)
            return
        choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0}
        with self.engine.lock:
            for index, one in enumerate(prompts):
                ids = self.engine.encode(one)
                tokens, generation = _run_to_end(self.engine.generate(ids, params, extra, top_k))
                choice: dict[str, Any] = {"index": index, "text": generation.text,
                                          "logprobs": _completion_logprobs(self.engine, tokens, as_ids) if top_k
                                          else None, "finish_reason": generation.finish_reason,
                                          "stop_reason": None}
                if body.get("return_token_ids"):
                    choice.update(prompt_token_ids=ids, token_ids=generation.token_ids)
                choices.append(choice)
                usage["prompt_tokens"] += len(ids)
                usage["completion_tokens"] += len(generation.token_ids)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        self._send_json(200, {"id": request_id, "object": "text_completion", "created": created,
                              "model": self.engine.model_name, "choices": choices, "usage": usage})

    def _chat(self, body: dict[str, Any]) -> None:
        self._check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        ids = self.engine.encode(render_messages(messages))
        params, extra = self.engine.params(body, max(1, self.engine.max_model_len - len(ids)))
        top_k = int(extra["top_logprobs"] or (1 if extra["logprobs"] else 0))
        if body.get("stream"):
            self._stream(body, ids, params, extra, top_k, chat=True)
            return
        with self.engine.lock:
            tokens, generation = _run_to_end(self.engine.generate(ids, params, extra, top_k))
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": generation.text},
                                  "logprobs": _chat_logprobs(self.engine, tokens, bool(
                                      body.get("return_tokens_as_token_ids"))) if extra["logprobs"] else None,
                                  "finish_reason": generation.finish_reason, "stop_reason": None}
        if body.get("return_token_ids"):
            choice.update(token_ids=generation.token_ids)
        self._send_json(200, {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                              "created": int(time.time()), "model": self.engine.model_name, "choices": [choice],
                              "usage": _usage(len(ids), len(generation.token_ids)),
                              **({"prompt_token_ids": ids} if body.get("return_token_ids") else {})})

    def _stream(self, body: dict[str, Any], ids: list[int], params: Any, extra: dict[str, Any], top_k: int,
                chat: bool) -> None:
        """SSE chunks as vLLM streams them; `data: [DONE]` last. A client that leaves stops the generation."""
        created = int(time.time())
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        kind = "chat.completion.chunk" if chat else "text_completion"
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        with_ids = bool(body.get("return_token_ids"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        with self.engine.lock:
            steps = self.engine.generate(ids, params, extra, top_k)  # validated before the headers go out
            first = next(steps)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def send(choice: dict[str, Any], **top: Any) -> None:
                event = {"id": request_id, "object": kind, "created": created, "model": self.engine.model_name,
                         "choices": [choice], **top}
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()

            if chat:
                send({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None}, **({"prompt_token_ids": ids} if with_ids else {}))
            sent_prompt_ids = chat
            generation = first[0]
            for step in _chain(first, steps):
                generation, new = step
                for token, piece, logprob, candidates in new:
                    choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                    entry = [(token, piece, logprob, candidates)]
                    if chat:
                        choice["delta"] = {"content": piece}
                        choice["logprobs"] = _chat_logprobs(self.engine, entry, as_ids) if extra["logprobs"] else None
                    else:
                        choice["text"] = piece
                        choice["logprobs"] = _completion_logprobs(self.engine, entry, as_ids) if top_k else None
                    if with_ids:
                        choice["token_ids"] = [token]
                        if not sent_prompt_ids:
                            choice["prompt_token_ids"] = ids
                            sent_prompt_ids = True
                    send(choice)
            final: dict[str, Any] = {"index": 0, "finish_reason": generation.finish_reason, "stop_reason": None}
            if chat:
                final["delta"] = {}
            else:
                final["text"] = ""
            send(final)
            if include_usage:
                event = {"id": request_id, "object": kind, "created": created, "model": self.engine.model_name,
                         "choices": [], "usage": _usage(len(ids), len(generation.token_ids))}
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()


Token = tuple[int, str, float, list[tuple[int, float]]]


def _run_to_end(steps: Iterator[tuple[Generation, list[Token]]]) -> tuple[list[Token], Generation]:
    """A whole generation (non-streaming): every token and the finished generation."""
    tokens: list[Token] = []
    generation = Generation()
    for generation, new in steps:  # noqa: B007 (the last step's generation is the finished one)
        tokens.extend(new)
    return tokens, generation


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _token_name(engine: MiniServer, token: int, as_ids: bool) -> str:
    return f"token_id:{token}" if as_ids else engine.token_text(token)


def _completion_logprobs(engine: MiniServer, tokens: list[tuple[int, str, float, list[tuple[int, float]]]],
                         as_ids: bool) -> dict[str, Any]:
    return {"tokens": [_token_name(engine, t, as_ids) for t, _, _, _ in tokens],
            "token_logprobs": [lp for _, _, lp, _ in tokens],
            "top_logprobs": [{_token_name(engine, c, as_ids): lp for c, lp in cands} for _, _, _, cands in tokens],
            "text_offset": []}


def _chat_logprobs(engine: MiniServer, tokens: list[tuple[int, str, float, list[tuple[int, float]]]],
                   as_ids: bool) -> dict[str, Any]:
    return {"content": [{"token": _token_name(engine, t, as_ids), "logprob": lp, "bytes": None,
                         "top_logprobs": [{"token": _token_name(engine, c, as_ids), "logprob": clp}
                                          for c, clp in cands]} for t, _, lp, cands in tokens]}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="serve_mini", description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None, help="seed:N or a JSON object of ModelConfig fields")
    parser.add_argument("--model", dest="model_option", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="float32", help="accepted for vllm serve's flags; the engine is fp32")
    parser.add_argument("--seed", type=int, default=None, help="accepted; each request seeds its own generator")
    parser.add_argument("--override-generation-config", default=None, help="JSON: the server's sampling defaults")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--speculative-config", default=None, help="JSON, as the engine's speculative_config")
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--data-parallel-size", type=int, default=1, help="ranks of the engine across nodes")
    parser.add_argument("--data-parallel-size-local", type=int, default=1, help="accepted; one rank per process")
    parser.add_argument("--data-parallel-start-rank", type=int, default=0, help="this node's rank (headless)")
    parser.add_argument("--data-parallel-address", default="127.0.0.1", help="the serving node's address")
    parser.add_argument("--data-parallel-rpc-port", type=int, default=None, help="where the ranks meet")
    parser.add_argument("--headless", action="store_true", help="compute for rank 0, serve no API")
    parser.add_argument("--data-parallel-timeout-s", type=float, default=600.0)
    return parser.parse_args(argv)


def serve(argv: list[str]) -> None:
    args = parse_args(argv)
    model = args.model_option or args.model or "seed:0"
    override = json.loads(args.override_generation_config) if args.override_generation_config else None
    engine_args: dict[str, Any] = {"async_scheduling": args.async_scheduling, "num_threads": args.num_threads}
    if args.speculative_config:
        engine_args["speculative_config"] = json.loads(args.speculative_config)
    ranks = None
    if args.data_parallel_size > 1:
        if args.data_parallel_rpc_port is None:
            raise SystemExit("--data-parallel-size > 1 needs --data-parallel-rpc-port (where the ranks meet)")
        rank = args.data_parallel_start_rank if args.headless else 0
        ranks = DataParallel(args.data_parallel_size, rank, args.data_parallel_address, args.data_parallel_rpc_port,
                             args.data_parallel_timeout_s)
    elif args.headless:
        raise SystemExit("--headless needs --data-parallel-size > 1 (the engine's other ranks)")
    engine = MiniServer(model, args.served_model_name or model, args.max_model_len, override, engine_args,
                        ranks if not args.headless else None)
    if args.headless and ranks is not None:
        run_headless(engine, ranks)
        # The process group's destructors may abort on a peer that is gone (gloo's store is rank 0's):
        # leave without them, so an engine over ends with 0, which the Ray executor reads as not lost.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if override:
        print(f"Using default completion sampling params from --override-generation-config: "
              f"{engine.completions.defaults!r}", flush=True)
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    httpd = ThreadingHTTPServer((args.host, args.port), handler)
    httpd.daemon_threads = True
    print(f"tinyvllm serving {engine.model_name} on http://{args.host}:{args.port}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (the probe's stop) ends serve_forever as Ctrl-C does."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    serve(sys.argv[1:])
