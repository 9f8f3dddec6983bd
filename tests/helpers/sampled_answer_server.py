"""A small OpenAI-compatible server whose every answer is a fresh sampled draw: /v1/completions
answers a question right (the word `right`) with one chance for every question, `--good-rate`
where the working directory's `state` file says good and `--bad-rate` where it says bad, drawn
anew for every request, so a question's runs agree no more often than chance (an intraclass
correlation of 0). It answers /health and /v1/models too, what the openai backend asks first.

Run as: python sampled_answer_server.py MODEL --seed S --count FILE --host H --port P [vLLM flags,
ignored]. Each start appends a line to FILE and draws from a generator seeded by S and the number
of starts before it: a session that starts its servers in the same order draws the same answers,
while two starts (two trials of one commit) draw independently.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    model = "model"
    rate = 0.0
    draws = random.Random(0)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # thousands of requests a trial: the server log stays short

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
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self.send_error(404)
            return
        with LOCK:
            right = self.draws.random() < self.rate
        self._json({"choices": [{"text": " right" if right else " wrong", "finish_reason": "length"}]})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=Path, required=True)
    parser.add_argument("--good-rate", type=float, default=0.82)
    parser.add_argument("--bad-rate", type=float, default=0.70)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, _ = parser.parse_known_args()
    starts = len(args.count.read_text().splitlines()) if args.count.exists() else 0
    with args.count.open("a", encoding="utf-8") as fh:
        fh.write("start\n")
    state = Path("state").read_text().strip() if Path("state").exists() else "good"
    Handler.model = args.model
    Handler.rate = args.good_rate if state == "good" else args.bad_rate
    Handler.draws = random.Random(f"{args.seed}-{starts}")
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops it without a traceback
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
