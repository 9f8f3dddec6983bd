"""A `{probe}` launcher's server finds the probe's own package wherever it lies (in a container it
is mounted outside every path the image's Python searches), after the candidate's own entries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import bisect_npu
from bisect_npu.probe.backends.openai import probe_import_env


def test_a_probe_launcher_gets_the_packages_parent_last_on_pythonpath(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONPATH", f"/candidate/first{':'}/candidate/second")
    env = probe_import_env({"launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"]})
    holder = str(Path(bisect_npu.__file__).resolve().parent.parent)
    assert env == {"PYTHONPATH": f"/candidate/first:/candidate/second:{holder}"}
    # what a process started with it imports (-S: not through this venv's install of bisect_npu),
    # from a directory where the package is not beside it
    done = subprocess.run([sys.executable, "-S", "-c", "import bisect_npu.probe.ports as m; print(m.__file__)"],
                          cwd=tmp_path, env={"PYTHONPATH": env["PYTHONPATH"], "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(holder)


def test_a_launcher_of_the_candidates_own_server_is_left_alone() -> None:
    assert probe_import_env({"launcher": ["vllm", "serve", "{model}"]}) == {}
    assert probe_import_env({}) == {}
