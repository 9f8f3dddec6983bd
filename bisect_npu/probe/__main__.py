"""Entry point: ``python -m bisect_npu.probe REQUEST.json`` writes one observation per trial.

A request without ``batch`` is one trial: exit 0 with its observation written. A request with
``batch`` runs its trials in order on one engine start and writes each observation the moment
its trial finishes; exit 0 once all are written. Exit 3 when the engine could not start or a
trial raised (the host turns that into a ``skip``; the last lines of stderr explain why): the
observations written before stay, the later trials are not run. Exit 4 (``HARNESS_FAILED_EXIT``)
when an accuracy harness failed (missing, exited non-zero, wrote nothing or nonsense, a missing
or empty dataset) or another process answers on the server's port (``ports.PortHeld``): the
host stops the run as an infrastructure error. Exit 2: usage errors.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from .backends import ProbeBackend, UnknownBackend, load_backend
from .harness import HARNESS_FAILED_EXIT, HarnessError
from .ports import PortHeld
from .request import read_request, trial_requests, write_json_atomic


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bisect_npu.probe REQUEST.json", file=sys.stderr)
        return 2
    request = read_request(argv[0])
    try:
        trials = trial_requests(request)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        backend = load_backend(str(request.get("backend", "")))
    except UnknownBackend as exc:
        print(exc, file=sys.stderr)
        return 2
    if "batch" in request:
        return _run_batch(backend, trials)
    try:
        observation = backend.run_case(request)
    except Exception as exc:
        return _failed(exc)
    write_json_atomic(request["output"], observation)
    return 0


def _run_batch(backend: ProbeBackend, trials: list[dict[str, Any]]) -> int:
    """One engine start for all trials; each observation lands on disk as soon as it exists."""
    try:
        engine = backend.open_engine(trials[0], trials=len(trials))
    except Exception as exc:
        return _failed(exc)
    try:
        for index, trial in enumerate(trials):
            observation = engine.run(trial)
            observation["extra"]["batch"] = {"index": index, "size": len(trials)}
            write_json_atomic(trial["output"], observation)
    except Exception as exc:
        return _failed(exc)
    finally:
        engine.close()
    return 0


def _failed(exc: Exception) -> int:
    """The exit code of a trial or engine start that raised, its cause on stderr: a failed accuracy
    harness or a port another process answers on stops the run (4); anything else is a skip whose
    reason the host reads from the traceback's last lines (3)."""
    if isinstance(exc, HarnessError):
        print(f"accuracy harness failed: {exc}", file=sys.stderr)
        return HARNESS_FAILED_EXIT
    if isinstance(exc, PortHeld):
        print(exc, file=sys.stderr)
        return HARNESS_FAILED_EXIT
    traceback.print_exc()  # called inside the except block: the exception being handled
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
