"""An interrupt that Python drops where it arrives still stops the session.

Ctrl-C raises `KeyboardInterrupt` wherever the main thread is; inside a finalizer (a `__del__`, a
C extension's deallocation such as a Ray object reference's) Python prints it and drops it. The
command line's handler records the signal too, and the session loops raise it again before the
next step, so the run ends "interrupted" (130), never with an answer the user stopped.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from bisect_npu import api, interrupts
from tests.helpers.gitrepo import make_linear_repo


class SignalsInItsFinalizer:
    """Sends this process SIGINT while it is being finalized, where the handler's exception is dropped."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


@pytest.fixture
def handlers() -> Iterator[None]:
    """The command line's handlers for the test, Python's own put back after it."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    interrupts.install()
    try:
        yield
    finally:
        interrupts.install()  # forgets what the test recorded
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def drop_an_interrupt() -> None:
    """Deliver SIGINT inside a finalizer: its KeyboardInterrupt goes to sys.unraisablehook, not here."""
    holder = [SignalsInItsFinalizer()]
    holder.clear()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupt_dropped_in_a_finalizer_is_recorded(handlers: None) -> None:
    interrupts.raise_if_received()  # nothing recorded yet
    drop_an_interrupt()  # returns: the KeyboardInterrupt did not reach this frame
    with pytest.raises(KeyboardInterrupt, match="arrived earlier"):
        interrupts.raise_if_received()  # but it was recorded
    interrupts.install()  # the next command starts with nothing recorded
    interrupts.raise_if_received()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_sigterm_is_recorded_and_raised(handlers: None) -> None:
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        signal.raise_signal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="arrived earlier"):
        interrupts.raise_if_received()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_session_stops_at_the_next_step_after_a_dropped_interrupt(tmp_path: Path, handlers: None) -> None:
    shas = make_linear_repo(tmp_path / "repo", 40, culprit=23)
    judged: list[str] = []

    def oracle(checkout: Path, commit: str) -> bool:
        judged.append(commit)
        if len(judged) == 1:
            drop_an_interrupt()  # the user's Ctrl-C, lost inside some library's finalizer
        return (checkout / "state").read_text().strip() == "good"

    session = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        api.bisect(tmp_path / "repo", shas[0], shas[39], oracle=oracle, session_dir=session, quiet=True)
    assert len(judged) == 1  # without the record the search would have gone on to its answer
    records = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    assert [r["commit"] for r in records if r["type"] == "step"] == judged  # the finished step is kept
    assert not [r for r in records if r["type"] == "end"]

    interrupts.install()
    result = api.bisect(tmp_path / "repo", shas[0], shas[39], oracle=oracle, session_dir=session, quiet=True)
    assert (result.status, result.culprit) == ("found", shas[23])
    assert judged.count(judged[0]) == 1  # resumed: the step before the interrupt is not run again
