"""A damaged verdict store never stops the host's work: checked when it is opened, moved aside
(kept, named in the warning) and replaced, the session going on as it does when the store fails in
the middle of a run. Real SQLite files, damaged on disk as a torn write or a bad disk leaves them."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.observations import VerdictKind
from bisect_npu.store import Scope, StoredVerdict, StoreUnavailable, VerdictStore
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo

SCOPE = Scope("o", "e", "exact")
PAGE = 4096  # SQLite's default page size


def filled(path: Path, rows: int = 3000) -> Path:
    """A sound store holding `rows` verdicts: dozens of pages."""
    store = VerdictStore(path)
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [("o", "e", "exact", "", f"{i:040x}", "", f"s{i % 7}", "good", 1, 0, "command exited 0", "",
                         float(i)) for i in range(rows)])
    assert store.get(SCOPE, f"{7:040x}", "", besides="")
    return path


def damaged_pages(path: Path) -> bytes:
    """Overwrite two whole pages in the middle of the file, as a bad disk would; the bytes before."""
    before = path.read_bytes()
    middle = len(before) // PAGE // 2
    with path.open("r+b") as out:
        out.seek(middle * PAGE)
        out.write(b"\xff" * (2 * PAGE))
    return before


def asides(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.damaged-*"))


@pytest.mark.parametrize("damage", ["not a database", "pages in the middle"])
def test_a_damaged_store_is_moved_aside_and_replaced(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "v.sqlite"
    if damage == "not a database":
        path.write_bytes(b"not a database, " * 512)
    else:
        damaged_pages(filled(path))
    broken = path.read_bytes()
    store = VerdictStore(path)
    (aside,) = asides(path)
    assert aside.read_bytes() == broken  # kept as it was, for inspection
    assert store.set_aside.startswith(f"verdict store {path} was damaged (")
    assert f"moved aside to {aside}" in store.set_aside
    store.put(SCOPE, StoredVerdict("c", "", "s", VerdictKind.GOOD, 1, 0, "ok", 0.0))  # the new store works
    assert [v.commit for v in VerdictStore(path).get(SCOPE, "c", "", besides="")] == ["c"]
    assert VerdictStore(path).set_aside == "" and asides(path) == [aside]  # sound now: nothing moved again


def test_a_sound_store_is_used_as_it_is(tmp_path: Path) -> None:
    path = filled(tmp_path / "v.sqlite")
    assert VerdictStore(path).set_aside == "" and asides(path) == []
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 3000


def _open(path: str, results: multiprocessing.Queue) -> None:
    results.put(VerdictStore(Path(path)).set_aside)


def test_sessions_that_find_it_damaged_at_once_replace_it_once(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite"
    damaged_pages(filled(path))
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    workers = [context.Process(target=_open, args=(str(path), results)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [worker.exitcode for worker in workers] == [0] * 4
    said = [results.get(timeout=10) for _ in workers]
    assert len(asides(path)) == 1 and sum(bool(line) for line in said) == 1


def test_a_store_that_cannot_be_made_is_unavailable_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreUnavailable, match=r"cannot use verdict store .*--no-verdict-store") as refused:
        VerdictStore(tmp_path / "file" / "v.sqlite")
    assert "\n" not in str(refused.value)


@pytest.mark.e2e  # bisect-npu run in subprocesses
def test_a_run_with_a_damaged_or_unusable_store_goes_on(tmp_path: Path) -> None:
    """Exit 0 and the right culprit, the warning naming where the damaged file went; the next run
    reuses what the first kept in the new store. A store path that cannot be made: the run goes on
    without one, as when the store fails mid-run."""
    shas = make_linear_repo(tmp_path / "repo", 12, culprit=7)
    store = tmp_path / "v.sqlite"
    damaged_pages(filled(store))

    def run(session: str, verdict_store: Path) -> tuple[int, dict, str]:
        done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(tmp_path / "repo"), "--good",
                               shas[0], "--bad", shas[-1], "--cmd", " ".join(GOOD_CMD), "--no-fix", "--verdict-store",
                               str(verdict_store), "--session", str(tmp_path / session), "--json"],
                              capture_output=True, text=True, timeout=300, check=False)
        return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

    code, first, err = run("first", store)
    assert (code, first["culprit"]) == (0, shas[7]), err
    (aside,) = asides(store)
    assert f"moved aside to {aside}" in err
    code, again, err = run("again", store)
    assert (code, again["culprit"]) == (0, shas[7]) and "was damaged" not in err, err
    assert json.loads(Path(again["report_json"]).read_text())["reused_verdicts"] > 0
    (tmp_path / "file").write_text("x")
    code, without, err = run("without", tmp_path / "file" / "v.sqlite")
    assert (code, without["culprit"]) == (0, shas[7]), err
    assert "cannot use verdict store" in err and "this session goes on without it" in err
