"""Prefetcher: build the candidates the next step can need while the current one runs.

Builds use the CPU, runs use the NPUs, so they overlap. The session calls

    prefetcher = Prefetcher(builder, log_root)
    # before running position i: what the next step can need, whichever verdict i gets
    wanted = speculative_queries(problem, evidence, running=[i])
    prefetcher.prefetch([commit_at(j) for j in wanted])   # returns at once
    env = prefetcher.get(commit, log_dir)        # the prefetched result, or a build right now
    prefetcher.seconds_saved()                   # for the report
    prefetcher.close()                           # cancel what has not started; wait for the rest

A Prefetcher is itself a Builder (`acquire` = `get`, `release` passes through), so the session
can hand it to the evaluator in place of the builder it wraps.

`prefetch` replaces the wish list: queued builds that are no longer wanted are cancelled (one
already building finishes, its image stays cached). The time saved for a candidate is the part
of its build that ran before `get` asked for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bisect_npu.builders.base import Builder, Environment
from bisect_npu.search import Evidence, Next, SearchProblem, decide


@dataclass
class PrefetchRecord:
    commit: str
    build_s: float = 0.0  # how long the background build took
    waited_s: float = 0.0  # how long `get` still had to wait for it
    used: bool = False

    @property
    def saved_s(self) -> float:
        return max(self.build_s - self.waited_s, 0.0) if self.used else 0.0


class Prefetcher:
    """One background builder thread (builds are CPU-bound; more would only compete for the cores)."""

    def __init__(self, builder: Builder, log_root: Path, workers: int = 1) -> None:
        self.builder = builder
        self.log_root = log_root
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bisect-npu-prefetch")
        self._futures: dict[str, Future[Environment]] = {}
        self.records: dict[str, PrefetchRecord] = {}
        self._lock = threading.Lock()

    def prefetch(self, commits: list[str]) -> None:
        """Start building `commits` in the background (those not yet asked for), cancel the rest."""
        with self._lock:
            for commit, future in list(self._futures.items()):
                if commit not in commits and future.cancel():
                    del self._futures[commit]
                    self.records.pop(commit, None)
            for commit in commits:
                if commit not in self._futures:
                    self.records[commit] = PrefetchRecord(commit)
                    self._futures[commit] = self._pool.submit(self._build, commit)

    def get(self, commit: str, log_dir: Path) -> Environment:
        """The environment for `commit`: the prefetched one (waiting if it is still building), or a
        build now. A failed prefetched build raises its BuildFailed here, like a direct build."""
        with self._lock:
            future = self._futures.pop(commit, None)
        if future is None or future.cancelled():
            return self.builder.acquire(commit, log_dir)
        asked = time.monotonic()
        try:
            env = future.result()
        except CancelledError:
            return self.builder.acquire(commit, log_dir)
        finally:
            record = self.records.get(commit)
            if record is not None:
                record.used = True
                record.waited_s = round(time.monotonic() - asked, 3)
        return env

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        """The Builder protocol: a Prefetcher can stand wherever its builder would."""
        return self.get(commit, log_dir)

    def release(self, env: Environment) -> None:
        self.builder.release(env)

    def seconds_saved(self) -> float:
        return round(sum(record.saved_s for record in self.records.values()), 3)

    def build_key(self, commit: str) -> str | None:
        return self.builder.build_key(commit)

    def built_keys(self) -> frozenset[str]:
        return self.builder.built_keys()

    def close(self) -> None:
        """Cancel what has not started, wait for the rest, then close the wrapped builder."""
        with self._lock:
            for future in self._futures.values():
                future.cancel()
        self._pool.shutdown(wait=True)
        self.builder.close()

    def _build(self, commit: str) -> Environment:
        started = time.monotonic()
        try:
            return self.builder.acquire(commit, self.log_root / commit[:12])
        finally:
            self.records[commit].build_s = round(time.monotonic() - started, 3)


def speculative_queries(problem: SearchProblem, evidence: Mapping[int, Evidence], running: list[int]) -> list[int]:
    """Positions the search will ask for next, whichever verdicts the `running` positions get.

    Asks `search.decide` itself with each outcome assumed (all good, all bad, and each one flipped
    for k-ary steps), so prefetch follows the real search, skips and noisy mode included.
    """
    outcomes: list[dict[int, Literal["good", "bad"]]] = [{i: "good" for i in running}, {i: "bad" for i in running}]
    outcomes += [{j: ("bad" if j >= i else "good") for j in running} for i in running[1:]]
    wanted: list[int] = []
    for outcome in outcomes:
        assumed = dict(evidence)
        for index, verdict in outcome.items():
            assumed[index] = assumed.get(index, Evidence()).add(verdict)
        decision = decide(problem, assumed)
        if isinstance(decision, Next):
            wanted += [q.index for q in decision.queries if q.index not in running and q.index not in wanted]
    return wanted
