"""A process of its own writing verdicts into one store, for the concurrent-writers test: a module
that imports only the store, so each spawned writer starts without the test module's imports."""

from __future__ import annotations

from pathlib import Path

from bisect_npu.observations import VerdictKind
from bisect_npu.store import Scope, StoredVerdict, VerdictStore


def put_many(path: str, worker: int) -> None:
    """Forty verdicts (commits c0..c39) of one session, `s{worker}`."""
    store = VerdictStore(Path(path))
    for i in range(40):
        store.put(Scope("o", "e", "exact"), StoredVerdict(f"c{i}", "", f"s{worker}", VerdictKind.GOOD, 1, 0, "", 0.0))
