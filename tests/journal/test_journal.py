"""journal.py with real files and real processes: torn writes, corruption, locks, SIGKILL."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bisect_npu.errors import UsageError
from bisect_npu.journal import JOURNAL_FILE, Journal, latest_session, new_session_dir
from bisect_npu.level import CommitsLevel
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.records import (
    CandidateRange,
    EndRecord,
    HeaderRecord,
    StepRecord,
    TrialRecord,
    TrialRun,
    parse_record,
)
from bisect_npu.request import RunRequest
from tests.helpers.paths import REPO_ROOT

HEADER = HeaderRecord(request=RunRequest.of(good="v0.9.0rc1", bad="v0.9.1"), level=CommitsLevel(), recipe_digest="abc",
                      tool_version="0.1.0",
                      range=CandidateRange(kind="commits", good="a" * 40, bad="b" * 40, base="a" * 40,
                                           good_ref="v0.9.0rc1", bad_ref="v0.9.1", candidates=["b" * 40]))


def trial(n: int, *, index: int = 0, commit: str = "abc", reason: str = "") -> TrialRecord:
    """A small record numbered `n` (its trial number), for the tests of the file's mechanics."""
    return TrialRecord(index=index, commit=commit, case_id="c", trial=n, reason=reason)


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    """A Python child that imports the package the way the test process does."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )


def _lines(session: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (session / JOURNAL_FILE).read_text().splitlines()]


def test_roundtrip(tmp_path: Path) -> None:
    session = tmp_path / "s"
    with Journal.create(session, HEADER) as journal:
        journal.append(StepRecord(index=1, commit="abc", verdict=Verdict(kind=VerdictKind.BAD, reason="重复"),
                                  trials=[TrialRun(case_id="c", trial=0, log=tmp_path / "x.log")]))
        journal.append(EndRecord(status="found", t=5.0))
    assert journal.entries[0].trials[0].log == str(tmp_path / "x.log")
    with Journal.open(session) as again:
        assert again.header.type == "header" and again.header.request.range.good == "v0.9.0rc1"
        assert isinstance(again.header.t, float)
        assert again.entries == journal.entries
        assert [e.type for e in again.entries] == ["step", "end"]
        assert again.entries[1].t == 5.0 and isinstance(again.entries[0].t, float)
        assert again.dropped_tail is None
    assert len(_lines(session)) == 3


def test_create_refuses_a_directory_that_holds_a_journal(tmp_path: Path) -> None:
    Journal.create(tmp_path, HEADER).close()
    with pytest.raises(UsageError, match="already holds a journal; continue it with `bisect-npu resume"):
        Journal.create(tmp_path, HEADER)


def test_append_refuses_what_json_cannot_hold_and_writes_nothing(tmp_path: Path) -> None:
    with Journal.create(tmp_path, HEADER) as journal:
        with pytest.raises(TypeError, match="not set"):
            journal.append(StepRecord(index=1, commit="abc",
                                      verdict=Verdict(kind=VerdictKind.BAD, reason="", figures={"bad": {1, 2}})))
        with pytest.raises(ValueError, match="header"):
            journal.append(HEADER)  # type: ignore[arg-type]
        journal.append(trial(0))
    assert len(_lines(tmp_path)) == 2
    with pytest.raises(ValueError, match="closed"):
        journal.append(trial(1))


def test_appends_from_several_threads_stay_whole_lines(tmp_path: Path) -> None:
    with Journal.create(tmp_path, HEADER) as journal:

        def write(worker: int) -> None:
            for n in range(15):
                journal.append(trial(n, index=worker, reason="y" * 5000))

        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(write, range(6)))
    on_disk = [parse_record(line) for line in _lines(tmp_path)[1:]]
    assert on_disk == journal.entries and len(on_disk) == 90
    for worker in range(6):
        assert [e.trial for e in on_disk if e.index == worker] == list(range(15))


@pytest.mark.parametrize("tail", [b'{"type": "step", "com', b'{"type": "st\n', b"\0\0\0\0"])
def test_torn_last_line_is_dropped_and_cut_before_the_next_append(tmp_path: Path, tail: bytes) -> None:
    with Journal.create(tmp_path, HEADER) as journal:
        journal.append(trial(1))
    path = tmp_path / JOURNAL_FILE
    good_size = path.stat().st_size
    with path.open("ab") as raw:
        raw.write(tail)
    with Journal.open(tmp_path) as journal:
        assert journal.dropped_tail == tail.decode().rstrip("\n")
        assert [e.trial for e in journal.entries] == [1]
        assert path.stat().st_size == good_size  # cut at open, before any append
        journal.append(trial(2))
    assert [line.get("trial") for line in _lines(tmp_path)] == [None, 1, 2]
    with Journal.open(tmp_path) as journal:
        assert journal.dropped_tail is None


def test_read_only_open_leaves_the_file_and_the_lock_alone(tmp_path: Path) -> None:
    with Journal.create(tmp_path, HEADER) as driver:
        driver.append(trial(1))
        with (tmp_path / JOURNAL_FILE).open("ab") as raw:
            raw.write(b'{"torn')
        with Journal.open(tmp_path, read_only=True) as viewer:
            assert [e.trial for e in viewer.entries] == [1] and viewer.dropped_tail == '{"torn'
            assert (tmp_path / JOURNAL_FILE).read_bytes().endswith(b'{"torn')
            with pytest.raises(ValueError, match="read-only"):
                viewer.append(trial(2))


def test_corruption_in_the_middle_names_file_and_line(tmp_path: Path) -> None:
    with Journal.create(tmp_path, HEADER) as journal:
        for n in range(3):
            journal.append(trial(n))
    path = tmp_path / JOURNAL_FILE
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"{not json"
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    with pytest.raises(UsageError, match=rf"^{re.escape(str(path))}:3: not a valid journal line"):
        Journal.open(tmp_path)
    assert path.read_bytes() == before  # nothing is cut when the damage is not a torn tail


def test_a_file_without_header_is_not_a_journal(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_FILE).write_text('{"type": "step"}\n')
    with pytest.raises(UsageError, match="has no header line"):
        Journal.open(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="no journal in"):
        Journal.open(tmp_path / "other")


@pytest.mark.parametrize("made", [False, True])
def test_a_session_whose_run_was_killed_before_it_journaled_says_so(tmp_path: Path, made: bool) -> None:
    """Killed before its directory existed (or before its header was written, the lock alone left):
    said as it is, with the way on, not "no journal in" a directory that does not exist."""
    where = tmp_path / "s"
    if made:
        where.mkdir()
        (where / "lock").write_text("123\n")
    with pytest.raises(UsageError) as refused:
        Journal.open(where)
    said = str(refused.value)
    assert said.startswith(f"{where} {'holds no session' if made else 'does not exist'}: the run that was to make it "
                           "stopped before anything was journaled") and "`bisect-npu run`" in said


def test_the_latest_file_names_the_session_it_points_at(tmp_path: Path) -> None:
    from bisect_npu.journal import LATEST_FILE, session_named

    made = new_session_dir(tmp_path)
    assert session_named(tmp_path / LATEST_FILE) == made
    assert session_named(made) == made and session_named(tmp_path / "elsewhere") == tmp_path / "elsewhere"
    for text in ("../..\n", "/etc\n", "\n"):  # names no session beside it: the path is taken as given
        (tmp_path / LATEST_FILE).write_text(text)
        assert session_named(tmp_path / LATEST_FILE) == tmp_path / LATEST_FILE


HOLD_LOCK = """
    import sys
    from pathlib import Path
    from bisect_npu.journal import Journal
    from bisect_npu.records import TrialRecord
    journal = Journal.open(Path(sys.argv[1]))
    print("locked", flush=True)
    sys.stdin.read()
    journal.append(TrialRecord(index=0, commit="child", case_id="c", trial=0))
"""


def test_a_second_process_cannot_drive_the_session(tmp_path: Path) -> None:
    Journal.create(tmp_path, HEADER).close()
    with _child(HOLD_LOCK, str(tmp_path)) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "locked\n"
            with pytest.raises(UsageError) as err:
                Journal.open(tmp_path)
            assert str(err.value) == (
                f"session {tmp_path} is being driven by another bisect-npu process (pid {child.pid}); "
                "wait for it or stop it (a new bisection needs a --session of its own)"
            )
            with pytest.raises(UsageError, match="being driven"):
                Journal.create(tmp_path / ".." / tmp_path.name, HEADER)
            assert child.stdin is not None
            child.stdin.close()
            assert child.wait(timeout=20) == 0
        finally:
            child.kill()
    with Journal.open(tmp_path) as journal:
        assert journal.entries[-1].commit == "child"


def test_sigkill_releases_the_lock(tmp_path: Path) -> None:
    Journal.create(tmp_path, HEADER).close()
    with _child(HOLD_LOCK, str(tmp_path)) as child:
        assert child.stdout is not None and child.stdout.readline() == "locked\n"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=20)
    with Journal.open(tmp_path) as journal:
        assert journal.entries == []


def _fork_appender(session: Path) -> tuple[int, int]:
    """Fork a process that reopens the journal and appends numbered records until killed.

    Returns (pid, read end of a pipe that yields b"1" or b"0" once the journal is open: whether
    it had to drop a torn tail). Forking skips interpreter start-up, so 20 kills take a second.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            os.close(read_end)
            journal = Journal.open(session)
            seq = len(journal.entries)
            rng = random.Random(seq)
            os.write(write_end, b"1" if journal.dropped_tail is not None else b"0")
            while True:
                journal.append(trial(seq, reason="x" * rng.randrange(10, 120_000)))
                seq += 1
        finally:
            os._exit(1)
    os.close(write_end)
    return pid, read_end


def test_sigkill_at_random_moments_never_leaves_an_unreadable_journal(tmp_path: Path) -> None:
    """20 real processes appending in a loop, each SIGKILLed at a random moment.

    Every child first reopens the journal its killed predecessor left, so the recovery path
    runs in a fresh process each time; the sequence numbers prove no line was lost or doubled.
    """
    Journal.create(tmp_path, HEADER).close()
    rng = random.Random(20261129)
    torn_seen = 0
    for kill in range(20):
        pid, ready = _fork_appender(tmp_path)
        try:
            if kill % 4 == 3:  # now and then, kill it while it may still be opening (and cutting)
                time.sleep(rng.uniform(0, 0.005))
            else:
                opened = os.read(ready, 1)
                assert opened in (b"0", b"1"), "the child could not open the journal"
                torn_seen += opened == b"1"
                time.sleep(rng.uniform(0, 0.03))
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(ready)
        with Journal.open(tmp_path, read_only=True) as journal:
            assert [e.trial for e in journal.entries] == list(range(len(journal.entries)))
    with Journal.open(tmp_path) as journal:
        survivors = len(journal.entries)
        assert [e.trial for e in journal.entries] == list(range(survivors))
    assert survivors > 0
    assert len(_lines(tmp_path)) == survivors + 1  # every line on disk is valid JSON
    print(f"{survivors} records survived 20 kills; {torn_seen} torn tails recovered")


FILL_TO_LIMIT = """
    import resource, signal, sys
    from pathlib import Path
    from bisect_npu.journal import Journal
    from bisect_npu.errors import InfrastructureError
    from bisect_npu.records import TrialRecord
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    journal = Journal.open(Path(sys.argv[1]))
    size = journal.path.stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 300, resource.RLIM_INFINITY))
    try:
        journal.append(TrialRecord(index=0, commit="c", case_id="c", trial=0, reason="x" * 1000))
    except InfrastructureError as exc:
        print("refused", journal.path.stat().st_size == size, exc, flush=True)
    journal.append(TrialRecord(index=0, commit="small", case_id="c", trial=1))
"""


def test_a_write_that_does_not_fit_is_rolled_back(tmp_path: Path) -> None:
    Journal.create(tmp_path, HEADER).close()
    with _child(FILL_TO_LIMIT, str(tmp_path)) as child:
        out, _ = child.communicate(timeout=30)
    assert out.startswith("refused True no room to write"), out
    assert child.returncode == 0
    with Journal.open(tmp_path) as journal:
        assert journal.dropped_tail is None
        assert journal.entries[-1].commit == "small" and len(journal.entries) == 1


def test_new_and_latest_sessions(tmp_path: Path) -> None:
    root = tmp_path / ".bisect-npu" / "sessions"
    with pytest.raises(UsageError) as err:
        latest_session(root)
    assert str(err.value) == f"no session found under {root}; start one with `bisect-npu run`"
    first = new_session_dir(root)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", first.name)
    Journal.create(first, HEADER).close()
    assert latest_session(root) == first
    second = new_session_dir(root)
    assert (root / "latest").read_text() == second.name + "\n"
    # `latest` names a session that never got its journal (a crash right after mkdir): fall back.
    assert latest_session(root) == first
    Journal.create(second, HEADER).close()
    assert latest_session(root) == second
    (root / "latest").unlink()
    assert latest_session(root) == max(first, second)


def test_default_root_is_relative_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    session = new_session_dir()
    assert session.parent.resolve() == (tmp_path / ".bisect-npu" / "sessions").resolve()



def test_what_a_newer_writer_adds_is_left_out_and_a_record_that_does_not_fit_is_named(tmp_path: Path) -> None:
    with Journal.create(tmp_path, HEADER) as journal:
        journal.append(trial(0))
    path = tmp_path / JOURNAL_FILE
    with path.open("a") as raw:  # a newer writer: a field and a record type this version does not know
        raw.write(json.dumps({**_lines(tmp_path)[1], "trial": 1, "gpu_temperature": 71}) + "\n")
        raw.write(json.dumps({"type": "dependency_level", "package": "torch"}) + "\n")
    with Journal.open(tmp_path) as journal:
        assert [e.trial for e in journal.entries] == [0, 1]
        assert not hasattr(journal.entries[1], "gpu_temperature")
        journal.append(trial(2))
    assert [line.get("trial") for line in _lines(tmp_path)] == [None, 0, 1, None, 2]  # the file keeps every line
    with path.open("a") as raw:
        raw.write(json.dumps({"type": "step", "index": "three"}) + "\n")
    with pytest.raises(UsageError, match=rf"^{re.escape(str(path))}:6: a step record this bisect-npu cannot read "
                                         r"\(index: .*\); the journal is corrupt$"):
        Journal.open(tmp_path, read_only=True)


def test_a_journal_of_a_newer_schema_is_read_but_not_appended_to(tmp_path: Path) -> None:
    Journal.create(tmp_path, HEADER.model_copy(update={"schema_version": 3})).close()
    with Journal.open(tmp_path, read_only=True) as journal:
        assert journal.header.schema_version == 3
    with pytest.raises(UsageError, match="written by a newer bisect-npu \\(journal schema version 3; this one "
                                         "writes 2\\): resume it with that version"):
        Journal.open(tmp_path)
