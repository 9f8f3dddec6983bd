"""LocalExecutor: run the probe or a user command as a subprocess in a candidate's worktree."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from bisect_npu.builders.base import Environment, tail
from bisect_npu.errors import UsageError
from bisect_npu.execute.base import RunResult, probe_log_path, with_outputs
from bisect_npu.execute.devices import VISIBLE_DEVICES_ENV, DevicePool

OWNER_ENV = "BISECT_NPU_OWNER"  # in every child's environment: which session (directory) started it
# In every process of one run: a probe's server in a session of its own still carries it, so a
# timeout, an interrupt or `close()` stops that run's whole tree without touching other slots' runs.
RUN_ENV = "BISECT_NPU_RUN"
STOP_GRACE_S = 5.0  # from SIGTERM to SIGKILL: time for a server to let go of its cards and ports


class LocalExecutor:
    """Subprocesses in their own process group, each process marked with its run (`RUN_ENV`) and
    its session (`OWNER_ENV`): a timeout, Ctrl-C, SIGTERM or `close()` stops every process of a
    run, servers the probe started in their own sessions included, and what a SIGKILLed run left
    behind can be found by the next one."""

    def __init__(self, env: dict[str, str] | None = None, python_paths: list[str] | None = None,
                 python: str = sys.executable, owner: str | None = None, devices: list[int] | None = None,
                 device_pool: DevicePool | None = None) -> None:
        self.env = env or {}
        self.python_paths = python_paths or ["."]
        self.python = python
        self.owner = owner
        # On an NPU host without containers: a run sees only its slot's share of `devices` (or all
        # of them with one slot), through the CANN runtime's visible-devices variable.
        self.devices = devices or []
        self.device_pool = device_pool
        self.stop_grace_s = STOP_GRACE_S
        self._lock = threading.Lock()
        self._live: dict[str, subprocess.Popen[bytes]] = {}  # run mark -> its process, while it runs
        self._stopped: set[str] = set()  # runs `close()` stopped: their threads unwind, nothing is judged

    def _environ(self, env: Environment) -> dict[str, str]:
        worktree = Path(env.path or ".")
        paths = [*env.python_paths_first, *(str((worktree / p).resolve()) for p in self.python_paths)]
        existing = os.environ.get("PYTHONPATH")
        environ = {**os.environ, **env.run_env, **self.env,  # the candidate's switches under the recipe's word
                   "PYTHONPATH": os.pathsep.join(paths + ([existing] if existing else []))}
        if env.python:  # a version's venv: its console scripts come first for user commands too
            environ["PATH"] = os.pathsep.join([str(Path(env.python).parent), environ.get("PATH", "")])
        if self.owner:
            environ[OWNER_ENV] = self.owner
        return environ

    def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
        out_dir = out_dir.resolve()  # the probe runs in the worktree: relative paths would point there
        out_dir.mkdir(parents=True, exist_ok=True)
        request, stem = with_outputs(request, out_dir)
        request_path = out_dir / f"request-{stem}.json"
        request_path.write_text(json.dumps(request, indent=1), encoding="utf-8")
        argv = [env.python or self.python, "-m", "bisect_npu.probe", str(request_path)]
        result = self._run(env, argv, probe_log_path(out_dir, stem), timeout_s)
        if result.returncode == 0 and Path(request["output"]).exists():
            result = result.model_copy(update={"observation": request["output"]})
        return result

    def close(self) -> None:
        """Stop every run still going (other slots' threads, when one slot is interrupted): each
        waiting thread then unwinds as interrupted instead of returning a result. Then whatever
        else of the session runs (a build a prefetch thread started, its compilers): the session
        is over."""
        self.stop_runs()
        if self.owner:
            kill_owned_processes(self.owner)

    def stop_runs(self) -> None:
        """Stop the runs this executor started, and only those (other engines of the session on
        this host go on): each waiting thread unwinds as interrupted."""
        with self._lock:
            live = dict(self._live)
            self._stopped.update(live)
        for mark, proc in live.items():
            stop_run(proc, mark, self.stop_grace_s)

    def spawn(self, env: Environment, argv: list[str], log: TextIO,
              extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
        """A long-lived process of the candidate (a headless node of an engine across hosts) in
        the worktree with the run's environment and cards, marked as a run: `stop_run(proc, mark)`
        stops it and all it started."""
        mark = uuid.uuid4().hex
        visible = {VISIBLE_DEVICES_ENV: ",".join(map(str, self.devices))} if self.devices else {}
        environ = {**self._environ(env), **visible, **(extra_env or {}), RUN_ENV: mark}
        try:
            proc = subprocess.Popen(argv, cwd=Path(env.path or "."), stdout=log, stderr=subprocess.STDOUT,
                                    env=environ, start_new_session=True, preexec_fn=_die_with_parent)
        except OSError as exc:
            raise UsageError(f"cannot start {argv[0]}: {exc.strerror or exc}; give a program on PATH") from exc
        return proc, mark

    def sweep(self) -> int:
        return kill_owned_processes(self.owner) if self.owner else 0

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        return self._run(env, argv, log_path, timeout_s, extra_env)

    def _run(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
             extra_env: dict[str, str] | None = None) -> RunResult:
        worktree = Path(env.path or ".")
        log_path = log_path.resolve()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.device_pool.lease() if self.device_pool else contextlib.nullcontext(self.devices) as cards:
            visible = {VISIBLE_DEVICES_ENV: ",".join(map(str, cards))} if cards else {}
            return self._run_on(argv, worktree, {**self._environ(env), **visible, **(extra_env or {})}, log_path,
                                timeout_s)

    def _run_on(self, argv: list[str], worktree: Path, environ: dict[str, str], log_path: Path,
                timeout_s: float) -> RunResult:
        started = time.monotonic()
        timed_out = False
        mark = uuid.uuid4().hex
        with log_path.open("w", encoding="utf-8") as log, self._running(argv, worktree, {**environ, RUN_ENV: mark},
                                                                        log, mark) as proc:
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                stop_run(proc, mark, self.stop_grace_s)
                returncode = proc.wait()
            except BaseException:
                stop_run(proc, mark, self.stop_grace_s)
                raise
        if mark in self._stopped:
            raise KeyboardInterrupt("the executor was closed during the run")
        return RunResult(returncode=returncode, seconds=round(time.monotonic() - started, 3),
                         log_path=str(log_path), timed_out=timed_out, log_tail=tail(log_path, 15))

    @contextlib.contextmanager
    def _running(self, argv: list[str], worktree: Path, environ: dict[str, str], log: TextIO,
                 mark: str) -> Iterator[subprocess.Popen[bytes]]:
        """The run's process, known to `close()` while it runs; whatever of the run outlives it (a
        server the probe left in its own session) is stopped when it ends."""
        try:
            proc = subprocess.Popen(argv, cwd=worktree, stdout=log, stderr=subprocess.STDOUT, env=environ,
                                    start_new_session=True)
        except FileNotFoundError as exc:
            raise UsageError(f"command not found: {argv[0]}; give a program on PATH or a path "
                             "relative to the repository root") from exc
        except PermissionError as exc:
            raise UsageError(f"command is not executable: {argv[0]}; chmod +x it") from exc
        with self._lock:
            self._live[mark] = proc
        try:
            yield proc
        finally:
            with self._lock:
                self._live.pop(mark, None)
            if _alive(proc) or marked_processes(RUN_ENV, mark):
                stop_run(proc, mark, self.stop_grace_s)


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL when the process that started it goes, so a
    node's engine does not outlive its Ray worker killed with its node."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def stop_run(proc: subprocess.Popen[bytes], mark: str, grace_s: float = STOP_GRACE_S) -> None:
    """Stop every process of one run at once: SIGTERM to its process group and to each process
    carrying its mark (a server in its own session or group), SIGKILL to what is still there after
    `grace_s`. Returns once none is left (processes that clear their environment excepted)."""
    _signal_run(proc.pid, mark, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (_alive(proc) or marked_processes(RUN_ENV, mark)):
        time.sleep(0.05)
    for _ in range(50):  # a process may fork while it is being killed: until none is left
        if not _signal_run(proc.pid, mark, signal.SIGKILL) and not _alive(proc):
            break
        time.sleep(0.05)
    proc.wait()


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the run's own process still runs (a zombie does not): from /proc, because another
    thread may be waiting on it, and then `poll()` cannot tell."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:  # reaped, or no /proc
        return proc.poll() is None
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _signal_run(group: int, mark: str, signum: int) -> int:
    """Send `signum` to the run's process group and its marked processes; how many were marked."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)
    pids = marked_processes(RUN_ENV, mark)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    return len(pids)


def marked_processes(name: str, value: str, below: bool = False) -> list[int]:
    """Processes (not this one) whose environment sets `name` to `value` (or, with `below`, to a
    path under it). Reads /proc (Linux); elsewhere none. A zombie's environment reads empty."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    wanted = f"{name}={value}".encode()
    prefix = f"{name}={value.rstrip('/')}/".encode() if below else None
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        if wanted in environ or (prefix and any(item.startswith(prefix) for item in environ)):
            found.append(int(entry.name))
    return found


def kill_owned_processes(owner: str) -> int:
    """SIGKILL every process whose environment marks it as started for `owner` (a session
    directory) or for a directory below it: a probe, server or command that a killed run left
    running, with their descendants, who inherit the mark."""
    killed = 0
    for pid in marked_processes(OWNER_ENV, owner.rstrip("/"), below=True):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed
