"""The command line run in this process, for tests: its exit code and what it printed."""

from __future__ import annotations

import pytest

from bisect_npu.cli import main


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err
