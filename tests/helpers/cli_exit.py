"""The command line run in this process, for tests: its exit code and what it printed."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pytest

from bisect_npu.cli import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def cli_in_process(argv: list[str], cwd: Path | None = None,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`bisect-npu ARGV` (from `cwd`, with `env`'s variables set) as `subprocess.run` would report it
    (exit code, stdout, stderr), run in this process: a test of what a command prints or journals
    needs no process start of its own (the commands a session runs still run in theirs)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with pytest.MonkeyPatch.context() as patch, contextlib.chdir(cwd or Path.cwd()), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        try:
            main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(["bisect-npu", *argv], code, out.getvalue(), err.getvalue())
