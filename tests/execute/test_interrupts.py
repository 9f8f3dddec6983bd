"""Interrupts stop everything a run started, servers in sessions of their own included.

Real processes throughout: `slow_to_stop_server.py` starts a server-like child with
`start_new_session=True` (out of the run's process group) that answers SIGTERM politely and goes
on running, with an "engine core" child of its own, also in its own session. After a SIGTERM or
Ctrl-C to a real `bisect-npu run`, or a trial's timeout, no process may carry the session's mark
(`BISECT_NPU_OWNER`) in its environment.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.execute.local import LocalExecutor
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import HELPERS
from tests.helpers.signals import interruptible, owned_processes, running

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "bisect_npu"]
SERVER = HELPERS / "slow_to_stop_server.py"
LAUNCH = f"{sys.executable} {SERVER} launch --ready"


def wait_for(path: Path, proc: subprocess.Popen[str] | None = None, limit_s: float = 120) -> dict:
    deadline = time.monotonic() + limit_s
    while not (path.is_file() and path.read_text()):
        assert proc is None or proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)
    return json.loads(path.read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_run(tmp_path: Path, oracle: list[str]) -> tuple[subprocess.Popen[str], Path]:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 9, culprit=5, tags={0: "good", 8: "bad"})
    session = tmp_path / "session"
    proc = subprocess.Popen([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", *oracle,
                             "--session", str(session), "--quiet"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)
    return proc, session


def stop_and_check(proc: subprocess.Popen[str], signum: int, session: Path, pids: dict) -> float:
    """Signal the run; it must exit 130 with nothing of its session left. Returns the seconds it took."""
    assert all(running(pid) for pid in pids.values()), pids
    assert len(owned_processes(session)) >= 3  # the oracle or probe, the server, its engine core
    sent = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 130, err
    assert "bisect-npu: interrupted" in err
    assert owned_processes(session) == []
    assert not any(running(pid) for pid in pids.values()), pids
    return took


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_run_stops_a_command_s_server_in_its_own_session(tmp_path: Path, signum: int) -> None:
    ready = tmp_path / "ready.json"
    proc, session = start_run(tmp_path, ["--cmd", f"{LAUNCH} {ready}"])
    try:
        took = stop_and_check(proc, signum, session, wait_for(ready, proc))
    finally:
        proc.kill()
    assert took < 30  # SIGTERM, 5 s of grace, SIGKILL: not the server's own pace


def test_sigterm_to_run_stops_the_openai_probe_s_server(tmp_path: Path) -> None:
    """The real probe (`openai` backend) starts the server as it starts vLLM's; the request hangs."""
    ready = tmp_path / "ready.json"
    recipe = tmp_path / "slow-server.yaml"
    recipe.write_text(f"""name: slow-server
model: {{path: {tmp_path / "model"}}}
engine:
  backend: openai
  launcher: ["{{python}}", "{SERVER}", serve, --ready, "{ready}"]
  port: {free_port()}
  startup_timeout_s: 60
cases: [{{id: c, messages: [{{role: user, content: hi}}], sampling: {{temperature: 0.0, max_tokens: 8}}}}]
trials: {{mode: exact, count: 1}}
""")
    proc, session = start_run(tmp_path, ["--recipe", str(recipe)])
    try:
        pids = wait_for(ready, proc)
        time.sleep(1)  # the probe has its answer from /health and sends the request that hangs
        stop_and_check(proc, signal.SIGTERM, session, pids)
    finally:
        proc.kill()


def test_a_trial_past_its_timeout_is_stopped_whole(tmp_path: Path) -> None:
    """The timeout ends the run's processes before the result comes back, not at the session's end."""
    ready = tmp_path / "ready.json"
    executor = LocalExecutor(owner=str(tmp_path))
    env = Environment(kind="worktree", commit="c" * 40, path=str(tmp_path))
    result = executor.run_command(env, [*LAUNCH.split(), str(ready)], tmp_path / "cmd.log", timeout_s=3)
    pids = json.loads(ready.read_text())
    assert result.timed_out and result.returncode != 0
    assert result.seconds < 3 + executor.stop_grace_s + 5
    assert owned_processes(tmp_path) == []
    assert not any(running(pid) for pid in pids.values())
    assert "draining" in Path(result.log_path).read_text()  # asked politely first, then killed


def test_close_stops_the_runs_of_other_slots_and_their_threads_unwind(tmp_path: Path) -> None:
    """One slot interrupted: the session closes the executor, which stops the runs other threads
    wait on; those threads raise instead of returning a result that would be journaled."""
    executor = LocalExecutor(owner=str(tmp_path))
    executor.stop_grace_s = 1.0
    env = Environment(kind="worktree", commit="c" * 40, path=str(tmp_path))
    outcomes: list[BaseException | None] = []

    def slot(n: int) -> None:
        try:
            executor.run_command(env, [*LAUNCH.split(), str(tmp_path / f"ready-{n}.json")], tmp_path / f"{n}.log",
                                 timeout_s=600)
            outcomes.append(None)
        except BaseException as exc:  # what the thread ends with is the point
            outcomes.append(exc)

    threads = [threading.Thread(target=slot, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    pids = [wait_for(tmp_path / f"ready-{n}.json") for n in range(2)]
    executor.close()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == 2 and all(isinstance(o, KeyboardInterrupt) for o in outcomes), outcomes
    assert owned_processes(tmp_path) == []
    assert not any(running(pid) for ready in pids for pid in ready.values())


def test_a_run_that_left_a_server_behind_has_it_stopped_when_it_ends(tmp_path: Path) -> None:
    """A command that exits while its server (own session) runs on: the run's end stops it."""
    ready = tmp_path / "ready.json"
    script = (f"import subprocess, sys; subprocess.Popen([sys.executable, {str(SERVER)!r}, 'serve', '--port', '0', "
              f"'--ready', {str(ready)!r}], start_new_session=True)")
    executor = LocalExecutor(owner=str(tmp_path))
    env = Environment(kind="worktree", commit="c" * 40, path=str(tmp_path))
    result = executor.run_command(env, [sys.executable, "-c", script], tmp_path / "cmd.log", timeout_s=60)
    assert result.returncode == 0 and not result.timed_out
    assert owned_processes(tmp_path) == []
    if ready.exists():  # the server got as far as listening before it was stopped
        assert not any(running(pid) for pid in json.loads(ready.read_text()).values())


@pytest.mark.parametrize("prefetch", ["--no-prefetch", "--prefetch"])
def test_sigterm_during_a_local_build_stops_the_build_s_processes(tmp_path: Path, prefetch: str) -> None:
    """A recipe's `build.local_command` (a compile that runs for minutes), in the main thread or a
    prefetch thread: SIGTERM must not wait for it, nor leave its processes running."""
    ready = tmp_path / "ready.json"
    recipe = tmp_path / "slow-build.yaml"
    recipe.write_text(f"""name: slow-build
model: {{path: {tmp_path / "model"}}}
build:
  local_command: ["{sys.executable}", "{SERVER}", launch, --ready, "{ready}"]
cases: [{{id: c, prompt: hi}}]
trials: {{mode: exact, count: 1}}
""")
    proc, session = start_run(tmp_path, ["--recipe", str(recipe), prefetch])
    try:
        took = stop_and_check(proc, signal.SIGTERM, session, wait_for(ready, proc))
    finally:
        proc.kill()
    assert took < 30
