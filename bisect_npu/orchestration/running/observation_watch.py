"""A probe run's observation files noticed as they appear, so each trial is journaled the moment it
finished (an interrupted batch keeps its finished trials), and the machine the run went to."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path


def node_named(path: Path) -> str | None:
    """The machine an executor says a probe run went to (`run_node_path`); None on this host."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


class ObservationWatcher:
    """Notices, in trial order, the observation files of one probe run as they appear.

    A file's modification time is when the probe finished writing it (written whole, then
    renamed), so the seconds between two files are the later trial's cost however late the
    host looks. One thread asks at a time: the poller while the probe runs, then the caller."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.seen = 0
        self.last = time.time()

    def arrived(self) -> list[tuple[int, Path, float]]:
        """(index, path, seconds since the previous file) for each file new since the last call."""
        found: list[tuple[int, Path, float]] = []
        while self.seen < len(self.paths) and self.paths[self.seen].exists():
            written = self.paths[self.seen].stat().st_mtime
            found.append((self.seen, self.paths[self.seen], max(0.0, written - self.last)))
            self.last = max(self.last, written)
            self.seen += 1
        return found


def poll(collect: Callable[[], None], stop: threading.Event, every_s: float = 0.2) -> None:
    while not stop.wait(every_s):
        collect()
