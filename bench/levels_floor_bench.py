"""Where the levels search's runs go: the search as it is against the same search handed the truth.

    .venv/bin/python bench/levels_floor_bench.py [--seeds 200] [--first-seed 1000] [--candidates 39]
        [--drop 0.07] [--spread 0.02] [--know nothing prior spread means both] [--late 0.9]
        [--baseline-error 0.05] [--no-baseline]

The worlds, the runs and the crashes are `bench/nightly_bench.py`'s (`make_world`, the throughput
row with the pin fixed, each crashed run run again and every attempt counted as `Ours.attempt`
does), and the search is driven as its `bisect_levels` drives it (`decide` in a loop, one run a
query), so `--know nothing` is `nightly_bench.py --rows throughput --search levels` on the same
seeds, run for run. Each `--know` variant hands the search part of the truth (oracles: what no
session can have; they live here only):

- `prior`: the spread's prior as the product has it (``SPREAD_PRIOR_RUNS`` pseudo-runs) but as
  wide as the world's spread instead of the line's gap: what the prior's width costs, apart from
  what learning the spread costs;
- `spread`: the run-to-run spread exactly: its prior is ``KNOWN_RUNS`` pseudo-runs at the world's
  spread instead of the recipe's (the posterior and the query's predictive alike);
- `means`: both sides' means exactly: every split's side means are the world's levels (the good
  and the bad side's), the spread still learned from the runs under the product's prior, its
  degrees of freedom no longer spent on the means;
- `both`: the two together (the likelihood of each split is then the normal one, exact).

Every other rule is the product's, unchanged: the ends' first runs (`_ready`), the ends-wrong
check, the query rule (`expected_information` over the same askable positions, the cost of a
build), the answer at the recipe's confidence and the side rule. The variants replace the
model's pieces in `bisect_npu.search.two_levels` for the length of their row (`known`), so they
follow that module as it changes: the search takes no model of its own (`SearchProblem` holds the
case, `posterior` and `expected_information` the runs), so there is no seam to hand the truth
through, and a piece renamed there fails the row loudly (`mock.patch.object` on a missing name).
Per bisection the table counts the runs (crashed attempts included) by where they went: the
first runs before the model can weigh a change (`_ready`), the ends (0 and n) after those, the
candidates; and by when: the runs asked once the likeliest position held ``--late`` of the
posterior (the confirmation phase), and how many of those went beside the leader (to it or to
the commit before it: the runs that tell it from its neighbours).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ and tests.helpers

from bench.nightly_bench import GOOD_TPUT, TOKENS_PER_S, TPUT_DROP, TPUT_SD, Ours, World, make_world, recipe_of
from bisect_npu.search import Evidence, Next, SearchProblem, decide, two_levels

# A known spread's prior: this many pseudo-runs at the world's spread (the t's degrees of freedom
# stay where the incomplete beta's fraction converges; a session's runs move it by under 0.5%).
KNOWN_RUNS = 1e4
# A known mean's weight in runs: every split's side mean stands where the world puts it.
KNOWN_WEIGHT = 1e12
KNOWS = ("nothing", "prior", "spread", "means", "both")


@contextlib.contextmanager
def known(world: World, what: str) -> Iterator[None]:
    """The levels model with ``what`` of the world's truth handed to it, for the block's length."""
    good, sigma = GOOD_TPUT * TOKENS_PER_S, world.spread * GOOD_TPUT * TOKENS_PER_S
    bad = good * (1 - world.drop)
    spread, means = what in ("spread", "both"), what in ("means", "both")
    own_prior = two_levels._with_spread_prior

    def with_spread_prior(within: np.ndarray, runs: float, level: np.ndarray,
                          threshold: float) -> tuple[np.ndarray, float]:
        freed = 2.0 if means else 0.0  # known means spend none of the runs' degrees of freedom
        if spread:
            return within + KNOWN_RUNS * sigma * sigma, runs - 2.0 + freed + KNOWN_RUNS
        if what == "prior" and threshold != 1.0:
            return within + two_levels.SPREAD_PRIOR_RUNS * sigma * sigma, runs - 2.0 + two_levels.SPREAD_PRIOR_RUNS
        within, df = own_prior(within, runs, level, threshold)
        return within, df + freed

    def split(count: np.ndarray, total: np.ndarray,
              squares: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # the sums are about the good mean (``_center``): the good side's mean is 0, the bad side's
        # the drop; the squared deviations about those, the side counts no longer matter
        q_left = np.cumsum(squares, axis=-1)[..., :-1]
        n_right, s_right, q_right = (np.cumsum(a[..., ::-1], axis=-1)[..., ::-1][..., 1:]
                                     for a in (count, total, squares))
        step = bad - good
        within = q_left + (q_right - 2 * step * s_right + n_right * step * step)
        weight = np.full_like(within, KNOWN_WEIGHT)
        return np.zeros_like(within), weight, np.full_like(within, step), weight, within

    def at_good(runs: object) -> float:
        return good

    patches: list[contextlib.AbstractContextManager[object]] = [
        mock.patch.object(two_levels, "_with_spread_prior", with_spread_prior)]
    if means:
        patches += [mock.patch.object(two_levels, "_split", split),
                    mock.patch.object(two_levels, "_center", at_good)]
    with contextlib.ExitStack() as stack:
        for one in patches:
            stack.enter_context(one)
        yield


@dataclass
class Count:
    """One bisection's runs (attempts) by where and when they went, and its answer."""

    runs: int = 0
    first: int = 0  # before `_ready`: the model cannot weigh a change yet
    ends: int = 0  # positions 0 and n, after the first runs
    inside: int = 0  # the candidates
    late: int = 0  # asked once the likeliest position held ``--late``
    beside: int = 0  # of those, at the leader or the commit before it (what tells it from its neighbours)
    best: bool = False
    named: bool = False
    wrong: bool = False


def bisect(world: World, what: str, late: float, baseline_error: float, weigh_baseline: bool) -> Count:
    """The levels search on one world as `Ours.bisect_levels` runs it, each query's runs tallied."""
    recipe = recipe_of("perf", search="levels", throughput_baseline=GOOD_TPUT * TOKENS_PER_S * (1 + baseline_error))
    spec = recipe.oracle.throughput
    assert spec is not None
    problem = SearchProblem(n=world.n, mode="levels", confidence=recipe.trials.confidence, threshold=spec.threshold,
                            baseline=spec.baseline if weigh_baseline else None)
    ours, count = Ours(world, recipe, levels=True), Count()
    evidence: dict[int, Evidence] = {}
    with known(world, what):
        for _ in range(20 * world.n):
            decision = decide(problem, evidence)
            if not isinstance(decision, Next):
                outcome = ours.outcome(decision)
                count.runs, count.best, count.named, count.wrong = ours.runs, outcome.best, outcome.named, outcome.wrong
                return count
            runs = two_levels.measured_runs(evidence)
            post = two_levels.posterior(world.n, runs, problem.threshold, problem.baseline)
            for query in decision.queries:
                i, before, spent = query.index, evidence.get(query.index, Evidence()), ours.runs
                value = None if i in world.unbuildable else ours.attempt(functools.partial(world.throughput_run, i))
                measured = (value * TOKENS_PER_S,) if isinstance(value, float) else ()
                evidence[i] = before.measure(measured) if measured else before.add("skip")
                cost = ours.runs - spent
                if post is None:
                    count.first += cost
                elif i in (0, world.n):
                    count.ends += cost
                else:
                    count.inside += cost
                if post is not None and float(post.max()) >= late:
                    count.late += cost
                    leader = int(np.argmax(post)) + 1
                    count.beside += cost if i in (leader - 1, leader) else 0
    count.runs = ours.runs
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=39)
    parser.add_argument("--drop", type=float, default=TPUT_DROP, help="the throughput regression (share)")
    parser.add_argument("--spread", type=float, default=TPUT_SD, help="a throughput run's spread (share)")
    parser.add_argument("--know", choices=KNOWS, nargs="+", default=list(KNOWS),
                        help="what of the truth the search is handed (one row each)")
    parser.add_argument("--late", type=float, default=0.9,
                        help="the likeliest position's share from which a run counts as confirmation")
    parser.add_argument("--baseline-error", type=float, default=0.0,
                        help="the case's published throughput baseline off the good side's mean by this share")
    parser.add_argument("--no-baseline", action="store_true", help="the case's baseline unread")
    args = parser.parse_args()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"seeds {seeds.start}-{seeds.stop - 1}, {args.candidates} candidates; throughput drop {args.drop:.0%}, "
          f"spread {args.spread:.0%}; the case's baseline "
          f"{'unread' if args.no_baseline else f'{1 + args.baseline_error:.0%} of the good side'}")
    print(f"| handed | best answer | culprit named | wrong culprits, exit 0 | runs | first runs | ends after | "
          f"candidates | after the leader held {args.late:g} | of them beside it |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for what in args.know:
        started = time.monotonic()
        rows = [bisect(make_world(seed, args.candidates, "throughput", False, args.drop, args.spread), what,
                       args.late, args.baseline_error, not args.no_baseline) for seed in seeds]

        def mean(field: str, rows: list[Count] = rows) -> float:
            return float(np.mean([getattr(r, field) for r in rows]))

        print(f"| {what} | {mean('best'):.1%} | {mean('named'):.1%} | {sum(r.wrong for r in rows)} | "
              f"{mean('runs'):.2f} | {mean('first'):.2f} | {mean('ends'):.2f} | {mean('inside'):.2f} | "
              f"{mean('late'):.2f} | {mean('beside'):.2f} | ({time.monotonic() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
