"""Progress on long work: live on a terminal (rich), plain log lines in CI (stdout not a TTY)."""

from __future__ import annotations

import sys
import time
from typing import ClassVar, Protocol, TextIO

from rich.console import Console

from bisect_npu.observations import Verdict


class Progress(Protocol):
    def note(self, text: str) -> None: ...

    def step_started(self, index: int, commit: str, title: str, left: int, steps_left: int) -> None: ...

    def trial_finished(self, index: int, trial: int, outcome: str, done: int, of: int) -> None: ...

    def step_finished(self, index: int, commit: str, verdict: Verdict, seconds: float) -> None: ...

    def close(self) -> None: ...


class PlainProgress:
    """One line per event, with a timestamp; what CI logs and `--json` users want."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr

    def _line(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        self._line(text)

    def step_started(self, index: int, commit: str, title: str, left: int, steps_left: int) -> None:
        self._line(f"testing #{index} {commit[:12]} {title!r} ({left} candidates left, ~{steps_left} steps)")

    def trial_finished(self, index: int, trial: int, outcome: str, done: int, of: int) -> None:
        if of > 1:  # a one-trial step's own line says it all
            self._line(f"  #{index} trial {trial}: {outcome} ({done} of {of})")

    def step_finished(self, index: int, commit: str, verdict: Verdict, seconds: float) -> None:
        self._line(f"#{index} {commit[:12]}: {verdict.kind.value} in {seconds:.1f}s: {verdict.reason}")

    def close(self) -> None:
        return None


class RichProgress:
    """A live status line with the current commit, plus one coloured line per finished step."""

    COLOURS: ClassVar[dict[str, str]] = {"good": "green", "bad": "red", "skip": "yellow"}

    def __init__(self, console: Console | None = None) -> None:
        # No log path: rich would end every line with this module's `progress.py:NN`, a fact about
        # this tool's code, not the user's run.
        self.console = console or Console(stderr=True, log_path=False)
        self._step = ""
        self._bad = 0
        self._status = self.console.status("starting")
        self._status.start()

    @property
    def status_line(self) -> str:
        """What the status line shows now (rich markup included)."""
        return str(self._status.status)

    def note(self, text: str) -> None:
        self.console.log(text)

    def step_started(self, index: int, commit: str, title: str, left: int, steps_left: int) -> None:
        self._step = (f"[bold]#{index}[/] {commit[:12]} {title[:70]}  "
                      f"[dim]{left} candidates left, ~{steps_left} steps[/]")
        self._bad = 0
        self._status.update(self._step)

    def trial_finished(self, index: int, trial: int, outcome: str, done: int, of: int) -> None:
        self._bad += outcome == "bad"
        self._status.update(f"{self._step}  trials {done}/{of}, {self._bad} bad")

    def step_finished(self, index: int, commit: str, verdict: Verdict, seconds: float) -> None:
        colour = self.COLOURS[verdict.kind.value]
        self.console.log(f"#{index} {commit[:12]} [{colour}]{verdict.kind.value}[/] "
                         f"({seconds:.1f}s) {verdict.reason}", markup=True, highlight=False)

    def close(self) -> None:
        self._status.stop()


def make_progress(quiet: bool = False) -> Progress:
    if quiet or not sys.stderr.isatty():
        return PlainProgress()
    return RichProgress()
