"""Helpers for tests that interrupt a child process."""

from __future__ import annotations

import signal


def interruptible() -> None:
    """Popen preexec_fn: let SIGINT reach the child as KeyboardInterrupt.

    A run started as a background job (nohup, `cmd &` in a script) inherits SIGINT ignored, and
    Python keeps an inherited SIG_IGN instead of installing its Ctrl-C handler; the tests that
    send SIGINT would then test nothing.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
