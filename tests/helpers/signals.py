"""Helpers for tests that interrupt a child process."""

from __future__ import annotations

import signal
from pathlib import Path

from bisect_npu.execute.local import OWNER_ENV


def interruptible() -> None:
    """Popen preexec_fn: let SIGINT reach the child as KeyboardInterrupt.

    A run started as a background job (nohup, `cmd &` in a script) inherits SIGINT ignored, and
    Python keeps an inherited SIG_IGN instead of installing its Ctrl-C handler; the tests that
    send SIGINT would then test nothing.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def owned_processes(owner: Path) -> list[str]:
    """`pid: command line` of every live process whose environment marks it as `owner`'s (a
    session directory, or one below it): what a run must not leave behind."""
    mark = f"{OWNER_ENV}={owner.resolve()}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, another user's, or a zombie
            continue
        if any(item == mark or item.startswith(mark + b"/") for item in environ):
            found.append(f"{entry.name}: {cmdline}")
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever reaps orphans here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
