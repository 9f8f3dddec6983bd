"""A stored verdict is reused only while it still holds: the wrong answers of a store keyed on too
little (a threshold in the check script, in a data file, in an environment variable, in a program
found on PATH, in a script named relative to a `cd`), each as a real run on a real git repository
whose commit i writes `value.txt` = i; and a property over generated checks and edits: after an
edit, the answer is a fresh run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.gitrepo import make_linear_repo

CLI = [sys.executable, "-m", "bisect_npu"]
N = 60


@pytest.fixture(scope="module")
def valued(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """60 commits; commit i writes value.txt = i."""
    path = tmp_path_factory.mktemp("valued") / "repo"
    return path, make_linear_repo(path, N, files=lambda i: {"value.txt": f"{i}\n"})


def bisect(repo: Path, session: Path, shas: list[str], command: str, *extra: str,
           env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[int, dict, str, str]:
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", shas[0], "--bad", shas[-1], "--cmd", command,
                           "--no-fix", "--session", str(session), "--json", *extra],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]), done.stdout, done.stderr


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def culprit_of(shas: list[str], summary: dict) -> int:
    return shas.index(summary["culprit"])


@pytest.mark.e2e
def test_an_edited_threshold_in_the_check_script_is_another_oracle(valued, tmp_path: Path) -> None:
    repo, shas = valued
    check = script(tmp_path / "check.sh", 'test "$(cat value.txt)" -lt 30')
    command = f"sh -c 'cd . && {check}'"
    code, first, out, err = bisect(repo, tmp_path / "first", shas, command)
    assert (code, culprit_of(shas, first)) == (0, 30), err
    assert "reused from the store" not in out
    code, again, out, err = bisect(repo, tmp_path / "again", shas, command)
    assert (code, culprit_of(shas, again)) == (0, 30), err
    reused = json.loads(Path(again["report_json"]).read_text())["reused_verdicts"]
    assert f"{reused} verdicts reused from the store" in out  # said with the answer
    assert again["steps"] - reused == 2  # the culprit and its parent, run fresh before answering
    report = Path(again["report"]).read_text()
    # Another person has no store: the Reproduce line runs every step without a store switch, and
    # the report says which verdicts came from this host's store.
    assert "--no-verdict-store" not in report.split("bisect-npu run", 1)[1].splitlines()[0]
    assert f"{reused} verdict{'s' if reused != 1 else ''} reused from the store" in report
    check.write_text(check.read_text().replace("30", "20"))
    code, edited, out, err = bisect(repo, tmp_path / "edited", shas, command)
    assert (code, culprit_of(shas, edited)) == (0, 20), err
    assert "reused from the store" not in out


@pytest.mark.e2e
def test_an_edited_data_file_the_script_reads_is_another_oracle(valued, tmp_path: Path) -> None:
    repo, shas = valued
    check = script(tmp_path / "check3.sh", 'test "$(cat value.txt)" -lt "$(cat "$1")"')
    threshold = tmp_path / "threshold.txt"
    threshold.write_text("30\n")
    command = f"{check} {threshold}"
    code, first, _, err = bisect(repo, tmp_path / "first", shas, command)
    assert (code, culprit_of(shas, first)) == (0, 30), err
    threshold.write_text("20\n")
    code, edited, out, err = bisect(repo, tmp_path / "edited", shas, command)
    assert (code, culprit_of(shas, edited)) == (0, 20), err
    assert "reused from the store" not in out


@pytest.mark.e2e
def test_an_environment_variable_the_command_names_is_part_of_the_key(valued, tmp_path: Path) -> None:
    repo, shas = valued
    command = "sh -c 'test $(cat value.txt) -lt $THRESH'"
    code, first, _, err = bisect(repo, tmp_path / "first", shas, command, env={"THRESH": "30"})
    assert (code, culprit_of(shas, first)) == (0, 30), err
    code, edited, out, err = bisect(repo, tmp_path / "edited", shas, command, env={"THRESH": "20"})
    assert (code, culprit_of(shas, edited)) == (0, 20), err
    assert "reused from the store" not in out


@pytest.mark.e2e
def test_a_variable_only_the_script_reads_is_declared_or_caught_by_the_fresh_runs(valued, tmp_path: Path) -> None:
    """No word names THRESH: --verdict-env declares it; without it the culprit and its parent are
    run fresh, disagree with the store, and the session searches again without it."""
    repo, shas = valued
    check = script(tmp_path / "check.sh", 'test "$(cat value.txt)" -lt "$THRESH"')
    code, _, _, err = bisect(repo, tmp_path / "first", shas, str(check), "--verdict-env", "THRESH",
                             env={"THRESH": "30"})
    assert code == 0, err
    code, declared, out, err = bisect(repo, tmp_path / "declared", shas, str(check), "--verdict-env", "THRESH",
                                      env={"THRESH": "20"})
    assert (code, culprit_of(shas, declared)) == (0, 20), err
    assert "reused from the store" not in out
    assert "--verdict-env THRESH" in Path(declared["report"]).read_text()

    code, _, _, err = bisect(repo, tmp_path / "undeclared-first", shas, str(check), env={"THRESH": "30"})
    assert code == 0, err
    code, caught, _, err = bisect(repo, tmp_path / "undeclared", shas, str(check), env={"THRESH": "20"})
    assert (code, culprit_of(shas, caught)) == (0, 20), err
    assert "disagrees with the verdict store" in err


@pytest.mark.e2e
def test_an_edited_program_on_path_is_another_oracle(valued, tmp_path: Path) -> None:
    repo, shas = valued
    bin_dir = tmp_path / "bin"
    program = script(bin_dir / "value-below", 'test "$(cat value.txt)" -lt 30')
    path = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    code, first, _, err = bisect(repo, tmp_path / "first", shas, "value-below", env=path)
    assert (code, culprit_of(shas, first)) == (0, 30), err
    program.write_text(program.read_text().replace("30", "20"))
    code, edited, out, err = bisect(repo, tmp_path / "edited", shas, "value-below", env=path)
    assert (code, culprit_of(shas, edited)) == (0, 20), err
    assert "reused from the store" not in out


@pytest.mark.e2e
def test_an_edited_script_named_relative_to_a_cd_is_another_oracle(valued, tmp_path: Path) -> None:
    repo, shas = valued
    checks = tmp_path / "checks"
    check = script(checks / "check.sh", 'test "$(cat "$OLDPWD/value.txt")" -lt 30')
    command = f"sh -c 'cd {checks} && ./check.sh'"
    code, first, _, err = bisect(repo, tmp_path / "first", shas, command)
    assert (code, culprit_of(shas, first)) == (0, 30), err
    check.write_text(check.read_text().replace("30", "20"))
    code, edited, out, err = bisect(repo, tmp_path / "edited", shas, command)
    assert (code, culprit_of(shas, edited)) == (0, 20), err
    assert "reused from the store" not in out


# A check reads its threshold from one of these places; an edit moves the threshold there.
_PLACES = ("script", "data", "variable", "hidden-variable", "hidden-script")


@pytest.mark.e2e
@pytest.mark.heavy  # thirty bisections; each place has its own lighter test above
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(3, 20), data=st.data())
def test_after_any_edit_the_answer_is_a_fresh_run_s(tmp_path: Path, n: int, data: st.DataObject) -> None:
    """Whatever the check reads its threshold from (its own text, a data file it names, a variable
    its words name, a variable or a second script no word names), a session after an edit that
    changes what it returns somewhere answers as a session without the store would."""
    place = data.draw(st.sampled_from(_PLACES), label="where the threshold is")
    before = data.draw(st.integers(1, n - 1), label="threshold")
    after = data.draw(st.integers(1, n - 1).filter(lambda t: t != before), label="edited threshold")
    work = Path(tempfile.mkdtemp(prefix=f"{place}-{n}-", dir=tmp_path))
    shas = make_linear_repo(work / "repo", n, files=lambda i: {"value.txt": f"{i}\n"})
    store = ["--verdict-store", str(work / "v.sqlite")]
    threshold, inner = work / "threshold.txt", work / "inner.sh"
    env: dict[str, str] = {}

    def write(value: int) -> str:
        """Put the threshold `value` in its place; the command that reads it from there."""
        if place == "script":
            check = script(work / "check.sh", f'test "$(cat value.txt)" -lt {value}')
            return str(check)
        if place == "data":
            threshold.write_text(f"{value}\n")
            check = script(work / "check.sh", 'test "$(cat value.txt)" -lt "$(cat "$1")"')
            return f"{check} {threshold}"
        if place == "variable":
            env["LIMIT"] = str(value)
            return "sh -c 'test $(cat value.txt) -lt $LIMIT'"
        if place == "hidden-variable":
            env["LIMIT"] = str(value)
            return str(script(work / "check.sh", 'test "$(cat value.txt)" -lt "$LIMIT"'))
        script(inner, f"echo {value}")
        return str(script(work / "check.sh", f'test "$(cat value.txt)" -lt "$({inner})"'))

    command = write(before)
    code, first, _, err = bisect(work / "repo", work / "first", shas, command, *store, env=env)
    assert (code, culprit_of(shas, first)) == (0, before), err
    command = write(after)
    code, fresh, _, err = bisect(work / "repo", work / "fresh", shas, command, "--no-verdict-store", env=env)
    assert code == 0, err
    code, edited, _, err = bisect(work / "repo", work / "edited", shas, command, *store, env=env)
    assert (code, edited["culprit"]) == (0, fresh["culprit"]), err


@pytest.mark.e2e
def test_resume_refuses_a_command_whose_script_changed(valued, tmp_path: Path) -> None:
    """An interrupted session resumed after its check was edited would mix two oracles' verdicts;
    the same check resumes (from another directory too: the header keeps where it was looked up)."""
    repo, shas = valued
    check = script(tmp_path / "check.sh", 'if [ -e "$0.abort" ]; then exit 255; fi\ntest "$(cat value.txt)" -lt 30')
    Path(f"{check}.abort").touch()  # the first run stops the session, as a lost runner would
    code, stopped, _, err = bisect(repo, tmp_path / "s", shas, str(check), "--no-verdict-store")
    assert code == 5 and stopped["status"] == "error", err
    Path(f"{check}.abort").unlink()
    check.write_text(check.read_text().replace("30", "20"))
    resume = [*CLI, "resume", "--session", str(tmp_path / "s"), "--json"]
    done = subprocess.run(resume, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    assert f"command {str(check)!r} changed since the session started" in done.stderr
    assert "start a new session with `bisect-npu run`" in done.stderr
    check.write_text(check.read_text().replace("20", "30"))
    done = subprocess.run(resume, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[30]


def test_what_a_command_writes_is_not_what_it_sees_and_secrets_stay_digests(tmp_path: Path, monkeypatch) -> None:
    """A redirection's target is the command's output, not its oracle; the header keeps a
    variable's value as a digest only; resume counts a changed file, not one the runs made or
    removed (a marker, a log)."""
    from bisect_npu.orchestration.opening.verdict_reuse import command_changed, command_oracle, command_view
    from tests.helpers.asked import spec_of

    log, data, marker = tmp_path / "runs.log", tmp_path / "limit.txt", tmp_path / "hold"
    for path in (log, data, marker):
        path.write_text("1\n")
    command = ["sh", "-c", f"echo x >> {log}; test -f {marker}; test $(cat value.txt) -lt $(cat {data}) $TOKEN"]
    view = command_view(command, [tmp_path])
    assert str(data) in view.files and str(marker) in view.files and str(log) not in view.files
    assert "sh" in view.programs and "cat" in view.programs and view.variables == {"TOKEN": None}

    monkeypatch.setenv("TOKEN", "s3cret")
    monkeypatch.chdir(tmp_path)
    options = spec_of(good="a", bad="b", repo=None, command=command)
    started = command_oracle(options)
    assert started is not None and "s3cret" not in started.model_dump_json()
    log.write_text("1\n2\n")
    marker.unlink()
    assert command_changed(options, started) == []
    data.write_text("2\n")
    monkeypatch.setenv("TOKEN", "other")
    assert command_changed(options, started) == [f"file:{data}", "variable:TOKEN"]
