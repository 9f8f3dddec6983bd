"""A small OpenAI-compatible server whose speed is the candidate's: it streams `max_tokens` tokens,
one every 1 ms where the working directory's `state` file says good and every 8 ms where it says
bad, so a throughput regression sits exactly at tests/helpers/gitrepo.py's culprit. It answers what the
openai probe backend asks of vLLM: /health, /v1/models, /v1/chat/completions (SSE with token ids
and logprobs), /tokenize, /detokenize, /metrics, /reset_prefix_cache.

Run as: python tests/helpers/nightly_server.py MODEL --host H --port P [vLLM flags, ignored].
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GENERATED = [0]
LOCK = threading.Lock()


def _delay() -> float:
    state = Path("state").read_text().strip() if Path("state").exists() else "good"
    return 0.001 if state == "good" else 0.008


class Handler(BaseHTTPRequestHandler):
    model = "model"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write((format % args) + "\n")

    def _json(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json({})
        elif self.path == "/v1/models":
            self._json({"data": [{"id": self.model}]})
        elif self.path == "/metrics":
            data = f"vllm:generation_tokens_total {GENERATED[0]}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/tokenize":
            self._json({"tokens": [1, 2, 3]})
        elif self.path == "/detokenize":
            self._json({"prompt": "hello"})
        elif self.path == "/reset_prefix_cache":
            self._json({"success": True})
        elif self.path == "/v1/chat/completions":
            self._stream(int(body.get("max_tokens", 16)))
        else:
            self.send_error(404)

    def _stream(self, count: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        delay = _delay()
        for index in range(count):
            time.sleep(delay)
            token = {"token": f"token_id:{7 + index % 5}", "logprob": -0.1,
                     "top_logprobs": [{"token": f"token_id:{7 + index % 5}", "logprob": -0.1}]}
            choice = {"index": 0, "delta": {"content": "w "}, "logprobs": {"content": [token]},
                      "finish_reason": "length" if index == count - 1 else None}
            self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            with LOCK:
                GENERATED[0] += 1
        self.wfile.write(b"data: [DONE]\n\n")


def main() -> None:
    args = sys.argv[1:]
    Handler.model = args[0]
    port = int(args[args.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
