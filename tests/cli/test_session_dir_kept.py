"""A session directory the user made is never removed by a command that failed on it: `resume` of
an empty directory (or of one holding only another run's lock) refuses with exit 2 and leaves the
directory, whichever way --session is spelled; a directory `run` made itself and journaled
nothing in is still cleared away."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli_exit import cli_in_process


@pytest.mark.parametrize("spelled", ["--session", "--session="])
@pytest.mark.parametrize("lock", [False, True])
def test_resume_of_an_empty_directory_keeps_it(tmp_path: Path, spelled: str, lock: bool) -> None:
    where = tmp_path / "mine"
    where.mkdir()
    if lock:
        (where / "lock").write_text("123\n")
    args = [spelled + str(where)] if spelled.endswith("=") else [spelled, str(where)]
    done = cli_in_process(["resume", *args])
    assert done.returncode == 2, done.stderr
    assert "holds no session" in done.stderr and "is removed" not in done.stderr
    assert where.is_dir()


def test_a_directory_run_made_and_journaled_nothing_in_is_cleared(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    where = tmp_path / "new"
    done = cli_in_process(["run", "--repo", str(tmp_path / "repo"), "--good", "a", "--bad", "b", "--cmd", "true",
                           "--session", str(where)])
    assert done.returncode == 2 and not where.exists(), done.stderr
