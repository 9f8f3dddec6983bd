"""A round's queries over the search's slots, whatever each tests (a commit search's positions, a
settings search's configurations): one thread per slot, each query's trial numbers handed out
before any starts where two queries may test one thing (so they never share a number and a seed);
an interrupt stops the other slots' runs at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

Q = TypeVar("Q")


def run_in_slots(queries: Sequence[Q], slots: int, run: Callable[[Q, int | None], None], stop: Callable[[], None],
                 firsts: Callable[[Sequence[Q]], Sequence[int]] | None = None) -> None:
    """Run `queries` with `run(query, first_trial)`, `slots` at a time (one after the other with
    one slot or one query, each query's first trial then its own to find: None); `firsts` numbers
    the trials of queries run at once (None: each query's own); `stop` ends what the other slots run
    when one is interrupted."""
    if len(queries) <= 1 or slots <= 1:
        for query in queries:
            run(query, None)
        return
    numbers: Sequence[int | None] = firsts(queries) if firsts is not None else [None] * len(queries)
    with ThreadPoolExecutor(max_workers=slots) as pool:
        futures = [pool.submit(run, query, first) for query, first in zip(queries, numbers, strict=True)]
        try:
            for future in futures:
                future.result()
        except KeyboardInterrupt:  # stop the other slots' runs now: the pool waits for them
            stop()
            raise
