"""Every input checked before the first step (issue: never a wrong answer with exit 0, round two):
a value that cannot act is refused in one line naming its own option, before a session exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from gitrepo import make_linear_repo

from bisect_npu.cli import main

TAGS = {1: "t1", 40: "t40"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    make_linear_repo(path, 45, culprit=17, tags=TAGS, files=lambda i: {"check.sh": "grep -qx good state\n"} if i == 0
                     else {})
    return path


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a command that must exit 2."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("bisect-npu: error:")]
    assert len(errors) == 1, err
    return errors[0]


@pytest.mark.parametrize(("setting", "expected"), [
    ("cases[*].sampling.temprature=0.5", "--settings cases[*].sampling.temprature: no such key in the recipe schema; "
                                         "nearest: cases[*].sampling.temperature"),
    ("cases[*].sampling.max_tokens=abc", "--settings cases[*].sampling.max_tokens=abc: cases.0.sampling.max_tokens: "
                                         "Input should be a valid integer"),
    ("engine.args.async_scheduling=true", "--settings engine.args.async_scheduling=true: the recipe has that value "
                                          "already"),
    ("engine.args.async_scheduling=", "--settings 'engine.args.async_scheduling=': give a value after `=` "
                                      "(engine.args.async_scheduling=null unsets the key)"),
])
def test_run_settings_are_checked_before_the_commit_search(repo: Path, tmp_path: Path, setting: str, expected: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    session = tmp_path / "session"
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--recipe", "demo-async-penalty",
                    "--settings", setting, "--session", str(session)], capsys)
    assert expected in line and "--good-set" not in line
    assert not (session / "journal.jsonl").exists()


def test_run_settings_with_a_command_is_refused(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--cmd", "sh check.sh",
                    "--settings", "engine.args.async_scheduling=false", "--session", str(tmp_path / "s")], capsys)
    assert "--settings searches which of a recipe's settings the culprit needs: give --recipe" in line


@pytest.mark.parametrize(("vary", "expected"), [
    ("engine.args.async_scheduling=true,false", "--vary engine.args.async_scheduling: true is the recipe's own value"),
    ("cases[*].sampling.temperature=0.5,0.5", "--vary cases[*].sampling.temperature: a value is given twice"),
])
def test_vary_values_are_each_a_configuration_of_their_own(repo: Path, tmp_path: Path, vary: str, expected: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    session = tmp_path / "search"
    line = refused(["settings", "--repo", str(repo), "--at", "t40", "--recipe", "demo-async-penalty", "--vary", vary,
                    "--session", str(session), "--no-verdict-store"], capsys)
    assert expected in line and "--good-set" not in line
    assert not (session / "settings.jsonl").exists()


def test_an_empty_value_does_not_unset_a_key(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["settings", "--repo", str(repo), "--at", "t40", "--recipe", "demo-async-penalty", "--good-set",
                    "engine.args.async_scheduling=", "--session", str(tmp_path / "s"), "--no-verdict-store"], capsys)
    assert "give a value after `=` (engine.args.async_scheduling=null unsets the key)" in line
