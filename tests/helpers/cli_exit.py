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


def cli_in_process(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`bisect-npu ARGV` (from `cwd`) as `subprocess.run` would report it (exit code, stdout, stderr),
    run in this process: for tests of what a command prints, which need no process start of their own."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.chdir(cwd or Path.cwd()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(["bisect-npu", *argv], code, out.getvalue(), err.getvalue())
