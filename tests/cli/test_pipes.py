"""Stdout's reader leaving early (`| head -1`) or stdout closed (`>&-`) ends a command quietly with
its own exit code: under `git bisect run` in a `set -o pipefail` script a good commit stays good. A
stdout that cannot be written (`> /dev/full`) loses the output: one line says so, exit 5 (judge:
128, no verdict), never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.observations import Observation

# The command line in a subprocess, its stdout a real pipe.
pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent / "bisect-npu"

RECIPE = """
name: pipes
model: {path: /models/tiny}
cases: [{id: loop, prompt: "repeat"}]
oracle: {kinds: [repetition]}
"""
CLEAN = Observation(case_id="loop", finish_reason="stop", output_token_ids=list(range(300)))
LOOPING = Observation(case_id="loop", finish_reason="length", output_token_ids=list(range(100)) + [1, 2, 3, 4, 5] * 80)


def shell(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`script` under bash with pipefail, as a `git bisect run` script would be."""
    return subprocess.run(["bash", "-c", f"set -o pipefail; {script}"], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture
def judged(tmp_path: Path) -> Path:
    (tmp_path / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    (tmp_path / "clean.json").write_text(CLEAN.model_dump_json(), encoding="utf-8")
    (tmp_path / "looping.json").write_text(LOOPING.model_dump_json(), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(("observation", "code"), [("clean.json", 0), ("looping.json", 1)])
def test_judge_into_a_reader_that_left_exits_with_the_verdict(judged: Path, observation: str, code: int) -> None:
    # A reader gone before the first line (`head -1` gone after its line, made certain): every write
    # meets a closed pipe.
    done = shell(f"{BIN} judge --recipe recipe.yaml {observation} | true", judged)
    assert done.returncode == code, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(("observation", "code"), [("clean.json", 0), ("looping.json", 1)])
def test_judge_with_stdout_closed_exits_with_the_verdict(judged: Path, observation: str, code: int) -> None:
    done = shell(f"{BIN} judge --recipe recipe.yaml {observation} >&-", judged)
    assert done.returncode == code, done.stderr
    assert done.stderr == ""


def test_a_listing_into_a_reader_that_left_exits_0(tmp_path: Path) -> None:
    done = shell(f"{BIN} recipes list | true", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(("command", "code"), [("recipes list", 5), ("recipes show demo-presence-penalty", 5),
                                               ("judge --recipe recipe.yaml clean.json", 128),
                                               ("recipes list --help", 5)])
def test_output_on_a_full_device_is_one_line(judged: Path, command: str, code: int) -> None:
    done = shell(f"{BIN} {command} > /dev/full", judged)
    assert done.returncode == code, done.stderr
    assert done.stderr.strip().splitlines() == [
        "bisect-npu: error: standard output cannot be written (No space left on device): the output is lost; write "
        "it where there is room (another file or device), then run the command again"], done.stderr
