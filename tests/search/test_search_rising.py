"""The levels search of a fix (search/rising.py): a rising throughput history, the low level at the
old end (the search's good side), searched as the drop it mirrors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.search import EndsWrong, Evidence, Found, Narrowed, Next, Query, SearchProblem, decide

THRESHOLD = 0.97
N = 10


def _level(index: int, change: int, low_first: bool) -> float:
    """1000 tokens/s on the restored side, 7% less on the broken one."""
    broken = index < change if low_first else index >= change
    return 1000 * (1 - 0.07 * broken)


@settings(max_examples=8, deadline=None)
@given(st.integers(1, N), st.integers(0, 10_000), st.sets(st.integers(1, N - 1), max_size=2))
def test_the_mirrored_search_names_the_fix_and_is_the_plain_search_on_the_mirrored_history(
        fix: int, seed: int, unbuildable: set[int]) -> None:
    """Driven to the end on a noisy rising history (the fix at `fix`, some commits that do not
    build): every decision is the plain search's on the same runs read from the new end (the fix's
    parent there the culprit), mapped back, and the answer names the fix or a range holding it."""
    rng = np.random.default_rng(seed)
    rising = SearchProblem(n=N, mode="levels", confidence=0.99, threshold=THRESHOLD, max_trials_per_query=6,
                           rising=True, build_groups=tuple(range(N + 1)), weights=(1,) * (N + 1))
    plain = replace(rising, rising=False)
    evidence: dict[int, Evidence] = {}
    for _ in range(8 * N):
        decision = decide(rising, evidence)
        mirrored = decide(plain, {N - i: replace(ev, good=ev.bad, bad=ev.good) for i, ev in evidence.items()})
        if not isinstance(decision, Next):
            break
        assert isinstance(mirrored, Next)
        assert [N - q.index for q in mirrored.queries] == [q.index for q in decision.queries]
        (query,) = decision.queries
        ev = evidence.get(query.index, Evidence())
        if query.index in unbuildable - {fix, fix - 1}:
            evidence[query.index] = ev.add("skip")
        else:
            value = _level(query.index, fix, low_first=True) + 20 * rng.normal()
            evidence[query.index] = ev.measure((value,))
    if isinstance(decision, Found):
        assert isinstance(mirrored, Found) and decision.index == N + 1 - mirrored.index
        assert decision.figures["good_mean"] == mirrored.figures["bad_mean"] < decision.figures["bad_mean"]
        assert decision.index == fix
    else:
        assert isinstance(decision, Narrowed) and isinstance(mirrored, Narrowed)
        assert (decision.lo, decision.hi) == (N - mirrored.hi, N - mirrored.lo)
        assert decision.lo < fix <= decision.hi


def test_a_rising_history_is_found_where_the_plain_search_would_end_wrong() -> None:
    """The same runs (low at the old end, restored from commit 6): the rising search names commit 6
    with the old side's mean as the good side's; the plain search, which looks for a drop, judges
    its bad end not under the good end's line."""
    rng = np.random.default_rng(3)
    runs = {i: [_level(i, 6, low_first=True) + 20 * rng.normal() for _ in range(3)] for i in range(N + 1)}
    evidence = {i: Evidence(measured=tuple(values)) for i, values in runs.items()}
    problem = SearchProblem(n=N, mode="levels", confidence=0.95, threshold=THRESHOLD, rising=True)
    found = decide(problem, evidence)
    assert isinstance(found, Found) and found.index == 6
    assert found.figures["good_mean"] < THRESHOLD * found.figures["bad_mean"]
    assert isinstance(decide(replace(problem, rising=False), evidence), EndsWrong)


def test_an_old_end_as_fast_as_the_new_one_is_the_old_end_judged_wrong() -> None:
    """No rise: the old end is not under the new end's line, which under --find-fix is the old
    end (the search's good one) not showing the symptom. The new end, whose runs draw the line,
    runs first, unless an earlier run (given by level: (new end, old end)) speaks for it."""
    problem = SearchProblem(n=N, mode="levels", confidence=0.99, threshold=THRESHOLD, rising=True)
    assert decide(problem, {}) == Next((Query(N),))
    assert decide(replace(problem, earlier_levels=((1000.0,), ())), {}) == Next((Query(0),))
    assert decide(replace(problem, earlier_levels=((), (930.0,))), {}) == Next((Query(N),))
    # six close runs an end: under the spread's prior (two pseudo-runs as wide as the line's gap)
    # fewer leave the ends' check unsure
    flat = {0: Evidence(measured=(1000.0, 1003.0, 999.0, 1002.0, 1001.0, 998.0)),
            N: Evidence(measured=(998.0, 1001.0, 1000.0, 1002.0, 999.0, 1003.0))}
    wrong = decide(problem, flat)
    assert isinstance(wrong, EndsWrong) and wrong.which == "good" and wrong.figures["under_line"] < 0.01
    assert decide(problem, {0: Evidence(skipped=True)}) == EndsWrong("good", {"skipped": 1.0})
