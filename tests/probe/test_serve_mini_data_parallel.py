"""The demo server's data parallel mode, two real processes: the serving rank and a headless one
meet over torch.distributed (gloo) before /health answers, every request is computed on both and
answered when their tokens agree, and a headless rank that is killed fails the next request (500)
instead of a silent answer from one rank."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.paths import REPO_ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path_factory.mktemp("dp-demo") / "upstream"
    manifest = generate_upstream(repo, seed=0)
    dest = repo.parent / "bad"
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(dest),
                    manifest.case("rope-longseq").bad_sha], check=True)
    subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=dest, check=True, capture_output=True)
    return dest


def post(port: int, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture()
def ranks(tree: Path, tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes], subprocess.Popen[bytes], Path]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO_ROOT)])}
    rpc, port = free_port(), free_port()
    meet = ["--data-parallel-size", "2", "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(rpc)]
    serve = [sys.executable, "-m", "bisect_npu.probe.serve_mini", "seed:0"]
    logs = tmp_path / "serving.log", tmp_path / "headless.log"
    with logs[1].open("wb") as out:
        headless = subprocess.Popen([*serve, "--headless", "--data-parallel-start-rank", "1", *meet], env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
    with logs[0].open("wb") as out:
        serving = subprocess.Popen([*serve, "--port", str(port), *meet], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert serving.poll() is None and time.monotonic() < deadline, logs[0].read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        yield port, serving, headless, tmp_path
    finally:
        for proc in (serving, headless):
            proc.kill()
            proc.wait()


def test_both_ranks_compute_each_request_and_must_agree(
        ranks: tuple[int, subprocess.Popen[bytes], subprocess.Popen[bytes], Path]) -> None:
    port, _, headless, logs = ranks
    status, answer = post(port, {"prompt": "please repeat the story", "max_tokens": 24, "temperature": 0.0})
    assert status == 200 and answer["usage"]["completion_tokens"] == 24  # type: ignore[index]
    assert "data parallel rank 1 of 2 joined" in (logs / "headless.log").read_text()
    assert "data parallel: 2 ranks agree on 24 tokens" in (logs / "serving.log").read_text()
    headless.send_signal(signal.SIGKILL)
    headless.wait()
    status, answer = post(port, {"prompt": "please repeat the story", "max_tokens": 24, "temperature": 0.0})
    assert status == 500 and "data parallel rank is gone" in str(answer["message"])


def test_the_headless_rank_ends_when_the_serving_one_goes(
        ranks: tuple[int, subprocess.Popen[bytes], subprocess.Popen[bytes], Path]) -> None:
    _, serving, headless, logs = ranks
    serving.send_signal(signal.SIGTERM)
    assert headless.wait(timeout=60) == 0  # ended on its own: what the Ray executor reads as "not lost"
    assert "rank 0 is gone" in (logs / "headless.log").read_text()


def test_headless_without_its_ranks_is_refused(tree: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bisect_npu.probe.serve_mini", "seed:0", "--headless"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(REPO_ROOT)])})
    assert done.returncode == 1 and "--headless needs --data-parallel-size > 1" in done.stderr
