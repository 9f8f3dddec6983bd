"""A stand-in for a vLLM OpenAI server that is slow to stop, for the interrupt tests.

`serve --port N --ready FILE [...]`: answers /health, /v1/models and /metrics, never answers a
completion (the request hangs, as a long generation does), and starts an "engine core" child in
a session of its own, as vLLM's EngineCore is a process of its own. Both take SIGTERM politely:
they say so and go on sleeping, so only a SIGKILL ends them. FILE gets both pids once it listens.

`launch --ready FILE`: what a user's oracle command might do: start `serve` in a session of its
own (`start_new_session=True`, out of the command's process group) and wait for it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

POLITE = "import signal, time\nsignal.signal(signal.SIGTERM, lambda *_: print('draining', flush=True))\n" \
         "while True:\n    time.sleep(1)\n"


def _polite(signum: int, frame: object) -> None:
    print("SIGTERM: draining requests first", flush=True)  # and never gets round to stopping


class Handler(BaseHTTPRequestHandler):
    def _answer(self, body: object) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer({})
        elif self.path == "/v1/models":
            self._answer({"data": [{"id": "slow-to-stop"}]})
        else:
            self._answer("vllm:generation_tokens_total 0\n")

    def do_POST(self) -> None:
        while True:  # a generation that never ends
            time.sleep(1)


def serve(port: int, ready: Path) -> None:
    signal.signal(signal.SIGTERM, _polite)
    core = subprocess.Popen([sys.executable, "-c", POLITE], start_new_session=True)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.write_text(json.dumps({"server": os.getpid(), "core": core.pid}))
    server.serve_forever()


def launch(ready: Path) -> None:
    signal.signal(signal.SIGTERM, _polite)
    server = subprocess.Popen([sys.executable, __file__, "serve", "--port", "0", "--ready", str(ready)],
                              start_new_session=True)
    server.wait()


def _flag(name: str) -> str:
    return sys.argv[sys.argv.index(name) + 1]


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(_flag("--port")), Path(_flag("--ready")))
    else:
        launch(Path(_flag("--ready")))
