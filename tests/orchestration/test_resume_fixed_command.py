"""A command that aborted the run (exit above 127) can be fixed and the session resumed: the dead
end of "fix it, then resume" refused by resume for the changed command is gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli_exit import run_cli
from tests.helpers.gitrepo import make_linear_repo


def test_a_command_that_exited_255_is_fixed_and_the_session_resumed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 20, culprit=13, tags={0: "good", 19: "bad"})
    script = tmp_path / "check.sh"
    script.write_text("exit 255\n")  # a typo'd check that cannot run
    session = tmp_path / "session"
    monkeypatch.chdir(repo)
    code, _out, err = run_cli(["run", "--good", "good", "--bad", "bad", "--cmd", f"sh {script}", "--no-fix",
                               "--session", str(session)], capsys)
    assert code == 5 and "command exited 255" in err
    assert "with --accept-changed-command where the fix changed the command's script" in err

    script.write_text("grep -qx good state\n")  # the fix
    code, _out, err = run_cli(["resume", "--session", str(session)], capsys)
    assert code == 2 and "changed since the session started" in err
    assert f"bisect-npu resume --session {session.resolve()} --accept-changed-command" in err

    code, out, err = run_cli(["resume", "--session", str(session), "--accept-changed-command", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["culprit"] == shas[13]
    assert "resuming with the command changed" in err
