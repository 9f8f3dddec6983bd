"""`bisect-npu judge` under `git bisect run`: a verdict is 0, 1 or 125; anything else ends >= 128
so git aborts instead of blaming a commit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu import oracle
from bisect_npu.cli import NOT_A_VERDICT_EXIT, main
from bisect_npu.observations import Observation
from tests.helpers.gitrepo import git, make_linear_repo

# `git bisect run` drives `bisect-npu judge` end to end.
pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent / "bisect-npu"

RECIPE = """
name: protocol
model: {path: /models/tiny}
cases: [{id: loop, prompt: "repeat"}]
oracle: {kinds: [repetition]}
"""

CLEAN = Observation(case_id="loop", finish_reason="stop", output_token_ids=list(range(300))).model_dump_json()
LOOPING = Observation(case_id="loop", finish_reason="length",
                      output_token_ids=list(range(100)) + [1, 2, 3, 4, 5, 6, 7] * 60).model_dump_json()


def run_judge(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(["judge", *argv])
    return int(exc.value.code or 0), capsys.readouterr().err


def test_git_bisect_run_aborts_on_a_corrupt_observation_and_names_no_commit(tmp_path: Path) -> None:
    """The observation is clean before commit 10, a loop from 10 on, and cut short (the probe was
    killed) from 6 to 14: git's first test lands in the corrupt stretch and must stop there."""
    def observation(i: int) -> dict[str, str | None]:
        text = CLEAN if i < 10 else LOOPING
        return {"obs.json": text[:40] if 6 <= i <= 14 else text}

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 21, files=observation)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    git(repo, "bisect", "start", shas[20], shas[0])
    done = subprocess.run(["git", "-C", str(repo), "bisect", "run", str(BIN), "judge", "--recipe", str(recipe),
                           "obs.json"], capture_output=True, text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"exit code {NOT_A_VERDICT_EXIT}" in output and "obs.json: not valid JSON" in output
    assert "is the first bad commit" not in output
    assert git(repo, "bisect", "log").count("# bad:") == 1  # only the bad end git was given


def test_git_bisect_run_finds_the_culprit_when_every_observation_reads(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 21, files=lambda i: {"obs.json": CLEAN if i < 10 else LOOPING})
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    git(repo, "bisect", "start", shas[20], shas[0])
    done = subprocess.run(["git", "-C", str(repo), "bisect", "run", str(BIN), "judge", "--recipe", str(recipe),
                           "obs.json"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and f"{shas[10]} is the first bad commit" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("case", ["unknown recipe", "missing file", "unknown option", "a directory", "newer schema"])
def test_no_verdict_ends_above_127_with_one_line(case: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    good = tmp_path / "good.json"
    good.write_text(CLEAN, encoding="utf-8")
    newer = tmp_path / "newer.json"
    newer.write_text(CLEAN.replace('"schema_version":1', '"schema_version":999'), encoding="utf-8")
    argv, needle = {
        "unknown recipe": (["--recipe", "no-such-recipe", str(good)], "recipe not found: no-such-recipe"),
        "missing file": (["--recipe", str(recipe), str(tmp_path / "gone.json")], "observation file not found"),
        "unknown option": (["--recipe", str(recipe), "--no-such-option", str(good)], "No such option"),
        "a directory": (["--recipe", str(recipe), str(tmp_path)], "is a directory"),
        "newer schema": (["--recipe", str(recipe), str(newer)], "schema 999 is newer than this bisect-npu reads"),
    }[case]
    code, err = run_judge(argv, capsys)
    assert code == NOT_A_VERDICT_EXIT and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_internal_error_is_no_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the oracle prints its traceback and still ends >= 128: `git bisect run` must not
    read it as "bad"."""
    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(oracle, "judge", broken)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    good = tmp_path / "good.json"
    good.write_text(CLEAN, encoding="utf-8")
    code, err = run_judge(["--recipe", str(recipe), str(good)], capsys)
    assert code == NOT_A_VERDICT_EXIT and "internal error: ZeroDivisionError: a bug" in err
