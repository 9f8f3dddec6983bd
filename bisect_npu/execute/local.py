"""LocalExecutor: run the probe or a user command as a subprocess in a candidate's worktree."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bisect_npu.builders.base import Environment, tail
from bisect_npu.errors import UsageError
from bisect_npu.execute.base import RunResult, probe_log_path, with_outputs
from bisect_npu.execute.devices import VISIBLE_DEVICES_ENV, DevicePool

OWNER_ENV = "BISECT_NPU_OWNER"  # in every child's environment: which session (directory) started it


class LocalExecutor:
    """Subprocesses in their own process group, so a timeout or Ctrl-C kills the whole tree; each
    carries its session's mark (`OWNER_ENV`), so what a SIGKILLed run left behind can be found."""

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
        """Nothing outlives a run: every subprocess is waited for (or killed) before `_run` returns."""

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
        with log_path.open("w", encoding="utf-8") as log:
            try:
                proc = subprocess.Popen(argv, cwd=worktree, stdout=log, stderr=subprocess.STDOUT, env=environ,
                                        start_new_session=True)
            except FileNotFoundError as exc:
                raise UsageError(f"command not found: {argv[0]}; give a program on PATH or a path "
                                 "relative to the repository root") from exc
            except PermissionError as exc:
                raise UsageError(f"command is not executable: {argv[0]}; chmod +x it") from exc
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                returncode = proc.wait()
            except BaseException:
                _kill_group(proc)
                proc.wait()
                raise
        return RunResult(returncode=returncode, seconds=round(time.monotonic() - started, 3),
                         log_path=str(log_path), timed_out=timed_out, log_tail=tail(log_path, 15))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_owned_processes(owner: str) -> int:
    """SIGKILL every process whose environment marks it as started for `owner` (a session
    directory) or for a directory below it: a probe, server or command that a killed run left
    running, with their descendants, who inherit the mark. Reads /proc (Linux); elsewhere none."""
    proc = Path("/proc")
    if not proc.is_dir():
        return 0
    prefix = owner.rstrip("/") + "/"
    killed = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        for item in environ:
            name, _, value = item.decode(errors="replace").partition("=")
            if name == OWNER_ENV and (value == owner or value.startswith(prefix)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed += 1
                break
    return killed
