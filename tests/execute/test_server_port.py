"""The candidate's server is the candidate's (issue: never a wrong answer with exit 0, round two):
with a server already listening on the recipe's port, each candidate's own server gets a free port
(not the foreign one's measurements), and a foreign process found answering on the candidate's
port stops the run as an infrastructure failure naming it, not a verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bisect_npu.nightly.at_commit import recipe_dump
from bisect_npu.nightly.cases import import_case
from bisect_npu.probe.ports import PortHeld, check_own_listener, free_port, holder, port_is_free
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import HELPERS

SERVER = HELPERS / "nightly_server.py"
HOST = "127.0.0.1"


def start_server(port: int, cwd: Path, *, own_session: bool = True) -> subprocess.Popen[bytes]:
    """tests/helpers/nightly_server.py on `port` (fast where cwd's `state` says good); up once /health answers."""
    proc = subprocess.Popen([sys.executable, str(SERVER), "foreign", "--port", str(port)], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=own_session)
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the foreign server did not start")


@pytest.fixture
def foreign(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """A server already listening on a port, as a user's own vLLM would be."""
    home = tmp_path / "foreign"
    home.mkdir()
    (home / "state").write_text("good\n")  # fast: every candidate measured through it would look good
    port = free_port(HOST)
    proc = start_server(port, home)
    yield port, proc
    proc.kill()
    proc.wait()


def test_a_held_port_is_seen_with_its_holder(foreign: tuple[int, subprocess.Popen[bytes]]) -> None:
    port, proc = foreign
    assert not port_is_free(HOST, port)
    assert holder(port).startswith(f"pid {proc.pid} (") and "nightly_server.py" in holder(port)
    check_own_listener(port, proc.pid)  # its own session: the server it is
    with pytest.raises(PortHeld, match=rf"port {port} is answered by pid {proc.pid} .*not by the server this probe "
                                       rf"started \(pid {os.getpid()}\)"):
        check_own_listener(port, os.getpid())


def _speed_recipe(port: int) -> str:
    """The nightly perf case of tests/nightly/test_nightly.py (tests/helpers/nightly_server.py as its server)
    on `port`."""
    case = {"name": "speed-a2", "model": "tiny", "envs": {"SERVER_PORT": "DEFAULT_PORT"},
            "launcher": ["{python}", str(SERVER), "{model}"], "server_cmd": ["--port", "$SERVER_PORT"],
            "benchmarks": {"perf": {"case_type": "performance", "dataset_path": "vllm-ascend/GSM8K-in3500-bs400",
                                    "request_conf": "vllm_api_stream_chat",
                                    "dataset_conf": "gsm8k/gsm8k_gen_0_shot_cot_str_perf", "num_prompts": 4,
                                    "max_out_len": 24, "batch_size": 4, "baseline": 800, "threshold": 0.5}}}
    recipe = import_case({"test_cases": [case]}, "Speed-A2.yaml", "speed-a2", "perf")
    raw = yaml.safe_load(recipe_dump(recipe))
    raw["engine"]["port"] = port
    raw["trials"]["count"] = 3  # the nightly's 5, fewer: each trial waits 2 s for the server's counter to settle
    return str(yaml.safe_dump(raw))


# A launcher whose "server" leaves a process of another session to answer on its port (a race: the
# port was free when the probe looked), then waits.
SQUATTER = f"""
import subprocess, sys, time
port = sys.argv[sys.argv.index("--port") + 1]
subprocess.Popen([sys.executable, {str(SERVER)!r}, "squatter", "--port", port], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(600)
"""


def test_a_foreign_process_answering_the_candidates_port_stops_the_probe_as_infrastructure(tmp_path: Path) -> None:
    launcher = tmp_path / "launcher.py"
    launcher.write_text(SQUATTER)
    port = free_port(HOST)
    request = {"schema_version": 1, "commit": "c", "recipe": "r", "case_id": "c", "trial": 0, "seed": 0,
               "backend": "openai", "model": {"path": "tiny", "dtype": "auto", "tokenizer": None},
               "engine": {"args": {}, "server_flags": [], "port": port, "startup_timeout_s": 60,
                          "launcher": ["{python}", str(launcher)]},
               "case": {"messages": [{"role": "user", "content": "hi"}], "sampling": {"max_tokens": 4}},
               "loop_guard": None, "logits": {"top_k": 5, "dump_dir": None}, "output": str(tmp_path / "obs.json")}
    (tmp_path / "request.json").write_text(json.dumps(request))
    try:
        done = subprocess.run([sys.executable, "-m", "bisect_npu.probe", str(tmp_path / "request.json")],
                              capture_output=True, text=True, timeout=120, check=False)
        squatter = holder(port)
    finally:
        for pid in [int(word) for word in holder(port).split()[1:2] if word.isdigit()]:
            os.kill(pid, 9)
    assert done.returncode == 4, done.stderr[-2000:]  # HARNESS_FAILED_EXIT: the host stops the run (exit 5)
    assert f"port {port} is answered by {squatter}" in done.stderr and "squatter" in squatter
    assert "not by the server this probe started" in done.stderr
    assert not (tmp_path / "obs.json").exists()


@pytest.mark.heavy
@pytest.mark.e2e
def test_a_server_on_the_recipes_port_does_not_name_the_wrong_culprit(
        tmp_path: Path, foreign: tuple[int, subprocess.Popen[bytes]]) -> None:
    """The reproduction: a perf case, --no-check-ends, culprit Change 17 of 30; a server already on
    the port used to be measured for every candidate, which named Change 29."""
    port, _proc = foreign
    repo = tmp_path / "up"
    shas = make_linear_repo(repo, 30, culprit=17, tags={0: "good", 29: "bad"})
    recipe = tmp_path / "speed.yaml"
    recipe.write_text(_speed_recipe(port))
    env = {**os.environ, "BISECT_NPU_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", "good", "--bad",
                           "bad", "--recipe", str(recipe), "--no-check-ends", "--no-fix", "--quiet", "--json",
                           "--session", str(tmp_path / "session"), "--timeout", "120"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["culprit"] == shas[17]
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "session").rglob("*.log"))
    assert f"port {port} is held by pid {_proc.pid}" in logs


@pytest.mark.e2e
def test_a_run_whose_candidate_port_is_answered_by_another_process_stops_with_exit_5(tmp_path: Path) -> None:
    """Not a verdict: the run stops as an infrastructure failure naming the holder."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(SQUATTER)
    port = free_port(HOST)
    raw = yaml.safe_load(_speed_recipe(port))
    raw["engine"]["launcher"] = ["{python}", str(launcher), "{model}"]
    recipe = tmp_path / "squatted.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    repo = tmp_path / "up"
    make_linear_repo(repo, 6, culprit=3, tags={0: "good", 5: "bad"})
    env = {**os.environ, "BISECT_NPU_CACHE": str(tmp_path / "cache")}
    try:
        done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", "good",
                               "--bad", "bad", "--recipe", str(recipe), "--no-fix", "--quiet",
                               "--session", str(tmp_path / "session"), "--timeout", "60"],
                              capture_output=True, text=True, env=env, timeout=300)
    finally:
        for pid in [int(word) for word in holder(port).split()[1:2] if word.isdigit()]:
            os.kill(pid, 9)
    assert done.returncode == 5, done.stderr[-3000:]
    assert f"port {port} is answered by pid " in done.stderr and "squatter" in done.stderr
