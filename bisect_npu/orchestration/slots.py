"""A round's queries over the session's slots: one thread per slot, each query's trial numbers
handed out before any starts, so concurrent queries of one commit never share a number (and a
seed); an interrupt stops the other slots' runs at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from bisect_npu import search


def first_trials(queries: Sequence[search.Query], next_trial: Callable[[int], int]) -> list[int]:
    """Each query's first trial number: a noisy round may put several slots on one commit."""
    firsts: list[int] = []
    following: dict[int, int] = {}
    for query in queries:
        first = following.get(query.index, next_trial(query.index))
        firsts.append(first)
        following[query.index] = first + query.trials
    return firsts


def run_in_slots(queries: Sequence[search.Query], slots: int, next_trial: Callable[[int], int],
                 run: Callable[[search.Query, int | None], None], stop: Callable[[], None]) -> None:
    """Run `queries` with `run(query, first_trial)`, `slots` at a time (one after the other with
    one slot or one query); `stop` ends what the other slots run when one is interrupted."""
    if len(queries) <= 1 or slots <= 1:
        for query in queries:
            run(query, None)
        return
    firsts = first_trials(queries, next_trial)
    with ThreadPoolExecutor(max_workers=slots) as pool:
        futures = [pool.submit(run, query, first) for query, first in zip(queries, firsts, strict=True)]
        try:
            for future in futures:
                future.result()
        except KeyboardInterrupt:  # stop the other slots' runs now: the pool waits for them
            stop()
            raise
