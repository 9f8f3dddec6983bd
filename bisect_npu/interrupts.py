"""Ctrl-C and SIGTERM that are never lost.

Python raises `KeyboardInterrupt` wherever the main thread is when the signal arrives. Inside a
finalizer (a `__del__`, or a C extension's deallocation such as a Ray object reference's) the
exception cannot propagate: Python prints it and drops it, and the bisection would go on to exit
0. So the command line's handler also records the signal, and the loops of a session ask
`raise_if_received` before each step: an interrupt dropped where it arrived stops the session
there, as one that propagated does.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import NoReturn

_received = threading.Event()


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    _received.set()
    raise KeyboardInterrupt(f"signal {signum}")


def install() -> None:
    """SIGINT and SIGTERM raise `KeyboardInterrupt` and are recorded (main thread only, as
    `signal.signal` requires); an interrupt recorded before this call is forgotten."""
    _received.clear()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)


def raise_if_received() -> None:
    """Raise the interrupt again where a session can stop: it may have been dropped where it arrived."""
    if _received.is_set():
        raise KeyboardInterrupt("an interrupt that arrived earlier")
