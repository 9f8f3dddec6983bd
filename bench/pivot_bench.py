"""Build-cost-aware pivots against the midpoint, on histories shaped like vllm-ascend's.

A range falls into build groups: the first commit tested with a build key pays a full build,
the others a python overlay. Both searches bisect the same cases with a perfect oracle:

  midpoint   the exact search without build groups (plain bisection; what `git bisect` does)
  pivots     the exact search told the groups and the costs (SearchProblem.build_groups, as a
             session with container builds is), choosing pivots by least expected cost

Histories: synthetic linear ones of N = 32, 128, 176 and 1,000 commits where each commit opens a
new build key with probability 1/17 (vllm-ascend's v0.9.0rc1..v0.9.1 share; 20 seeded layouts
per N, 64 culprits spread over each), and with ``--repo PATH`` a real range's own keys (every
culprit position). Costs in minutes (full build, overlay, probe run): 30/2/5 (`bisect-npu plan`'s
defaults), 60/2/5 (a CANN kernel compile), 20/1/15 (long generations). Cost = the ends' and
the steps' builds, overlays and runs. Then the noisy search at 0.8/0.2, N = 128: told the groups
against told only "an untested commit costs a build" (costs in trials; 240 runs per cell). Then
the likelihood search on a -7% throughput drop (spread 2%), N = 128: told nothing of builds (the
posterior's median, its quantiles with several slots) against told the groups (the round of most
information per cost; 480 sessions per cell), one table per slot count (``--slots``, 1 2 4);
``--tune`` runs it on the tuning seeds (1000+) that chose costs.INFORMATION_FLOOR.

    .venv/bin/python bench/pivot_bench.py [--repo PATH --good REF --bad REF] [--quick] [--likelihood-only [--tune]]
                                          [--slots 1 2 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bisect_npu.forecast.simulate import Minutes, SimulationSummary, Throughput, simulate

SIZES = (32, 128, 176, 1000)
NEW_KEY_SHARE = 1 / 17
MINUTES = ((30.0, 2.0, 5.0), (60.0, 2.0, 5.0), (20.0, 1.0, 15.0))
CULPRITS = 64
NOISY_MINUTES = ((20.0, 1.0, 1.0), (100.0, 2.0, 1.0))  # (build, overlay, trial), engine start 2 trials
LIKELIHOOD_MINUTES = ((30.0, 2.0, 5.0), (60.0, 2.0, 5.0))  # (build, overlay, throughput run)
THROUGHPUT = Throughput(drop=0.07, spread=0.02)  # the nightly bench's throughput row
TUNING_SEED = 1000  # --tune: layouts and runs from seeds 1000+, apart from the reported 7 and 0+


def layout(n: int, rng: np.random.Generator) -> list[str]:
    """Build keys of positions 0..n on a linear history: a new key where a commit changes compiled code."""
    opens = rng.random(n + 1) < NEW_KEY_SHARE
    opens[0] = False
    return [str(k) for k in np.cumsum(opens)]


def spread(n: int, count: int = CULPRITS) -> list[int]:
    count = min(n, count)
    return sorted({1 + (i * (n - 1)) // max(count - 1, 1) for i in range(count)})


def exact_figures(keys: list[str], culprits: list[int], minutes: tuple[float, float, float],
                  told: bool) -> SimulationSummary:
    build, overlay, run = minutes
    return simulate(len(keys) - 1, culprits, bad_rate=1.0, good_rate=0.0, mode="exact", runs=1,
                    build_key_of=keys.__getitem__, costs=Minutes(build=build, overlay=overlay, run=run),
                    tell_build_groups=told)


def pooled(summaries: list[SimulationSummary]) -> tuple[float, float, float, float]:
    """Mean steps, full builds, hours and the worst steps over several layouts (equal weights)."""
    return (float(np.mean([s.mean_trials for s in summaries])), float(np.mean([s.mean_builds for s in summaries])),
            float(np.mean([s.mean_machine_hours for s in summaries])), float(max(s.max_trials for s in summaries)))


def exact_table(layouts: int, repo_keys: tuple[str, list[str]] | None) -> None:
    print("exact mode, perfect oracle: midpoint vs cost-aware pivots")
    print("| history | build/overlay/run min | keys | midpoint: steps (max), full builds, hours "
          "| pivots: steps (max), full builds, hours | full builds | hours |")
    print("|---|---|---|---|---|---|---|")
    histories: list[tuple[str, list[list[str]], bool]] = []
    for n in SIZES:
        rng = np.random.default_rng(n)
        histories.append((f"synthetic N = {n} ({layouts} layouts)", [layout(n, rng) for _ in range(layouts)], False))
    if repo_keys is not None:
        histories.append((repo_keys[0], [repo_keys[1]], True))
    for name, key_lists, every_culprit in histories:
        for minutes in MINUTES:
            started = time.perf_counter()
            rows = {}
            for told in (False, True):
                rows[told] = pooled([exact_figures(keys, list(range(1, len(keys))) if every_culprit
                                                   else spread(len(keys) - 1), minutes, told) for keys in key_lists])
            distinct = np.mean([len(set(keys)) for keys in key_lists])
            (s0, b0, h0, m0), (s1, b1, h1, m1) = rows[False], rows[True]
            print(f"| {name} | {minutes[0]:g}/{minutes[1]:g}/{minutes[2]:g} | {distinct:.1f} "
                  f"| {s0:.2f} ({m0:.0f}), {b0:.2f}, {h0:.2f} | {s1:.2f} ({m1:.0f}), {b1:.2f}, {h1:.2f} "
                  f"| {b1 / b0:.2f}x | {h1 / h0:.2f}x |  ({time.perf_counter() - started:.1f} s)", flush=True)


def noisy_table(layouts: int, each: int) -> None:
    print(f"\nnoisy mode, 0.8/0.2, N = 128, engine start = 2 trials, {layouts * 8 * each} runs per cell "
          f"({layouts} layouts x 8 culprits x {each}): told only 'an untested commit costs a build' vs told "
          "the groups; cost in trials")
    print("| build/overlay/trial | told B: accuracy | trials | full builds | overlays | cost "
          "| told groups: accuracy | trials | full builds | overlays | cost | cost ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(7)
    keys_list = [layout(128, rng) for _ in range(layouts)]
    for build, overlay, trial in NOISY_MINUTES:
        started = time.perf_counter()
        cells = []
        for told in (False, True):
            summaries = [simulate(128, spread(128, 8), bad_rate=0.8, good_rate=0.2, mode="noisy", runs=each,
                                  seed=j, build_key_of=keys.__getitem__,
                                  costs=Minutes(build=build, overlay=overlay, run=trial, load=2.0 * trial),
                                  tell_build_groups=told)
                         for j, keys in enumerate(keys_list)]
            cells.append(tuple(float(np.mean([getattr(s, f) for s in summaries]))
                               for f in ("accuracy", "mean_trials", "mean_builds", "mean_overlays",
                                         "mean_machine_hours")))
        (a0, t0, b0, o0, h0), (a1, t1, b1, o1, h1) = cells
        print(f"| {build:g}/{overlay:g}/{trial:g} | {a0:.1%} | {t0:.1f} | {b0:.2f} | {o0:.1f} | {h0 * 60:.0f} "
              f"| {a1:.1%} | {t1:.1f} | {b1:.2f} | {o1:.1f} | {h1 * 60:.0f} | {h1 / h0:.2f}x |"
              f"  ({time.perf_counter() - started:.1f} s)", flush=True)


def likelihood_table(layouts: int, each: int, tune: bool, slots: int) -> None:
    """The likelihood search on throughput steps, N = 128, ``slots`` commits a round: told nothing
    of builds (the posterior's median, its quantiles with several slots) against told the groups
    and costs (the round of most information per cost); hours per session, their mean and median
    (a few sessions that run hundreds of runs weigh on the mean), and the wall-clock hours."""
    base = TUNING_SEED if tune else 0
    print(f"\nlikelihood mode, {slots} slot{'s' if slots > 1 else ''}, throughput -{THROUGHPUT.drop:.0%} "
          f"(spread {THROUGHPUT.spread:.0%}), N = 128, {layouts * 8 * each} sessions per cell ({layouts} layouts x "
          f"8 culprits x {each}, seeds {base}+{', tuning' if tune else ''}): "
          f"{'median' if slots == 1 else 'quantiles'} vs most information per cost")
    print("| build/overlay/run | told nothing: right | runs | full builds | overlays | hours (median) | wall hours "
          "| per cost: right | runs | full builds | overlays | hours (median) | wall hours | hours ratio (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(base + 7)
    keys_list = [layout(128, rng) for _ in range(layouts)]
    for build, overlay, run in LIKELIHOOD_MINUTES:
        started = time.perf_counter()
        cells = []
        for told in (False, True):
            sessions = [simulate(128, culprit, bad_rate=1.0, good_rate=0.0, runs=1, seed=base + j * 1000 + k,
                                 slots=slots, build_key_of=keys.__getitem__, throughput=THROUGHPUT,
                                 costs=Minutes(build=build, overlay=overlay, run=run), tell_build_groups=told)
                        for j, keys in enumerate(keys_list) for culprit in spread(128, 8) for k in range(each)]
            hours = [s.mean_machine_hours for s in sessions]
            cells.append((*(float(np.mean([getattr(s, f) for s in sessions]))
                            for f in ("accuracy", "mean_trials", "mean_builds", "mean_overlays")),
                          float(np.mean(hours)), float(np.median(hours)),
                          float(np.mean([s.mean_wall_hours for s in sessions]))))
        (a0, t0, b0, o0, h0, m0, w0), (a1, t1, b1, o1, h1, m1, w1) = cells
        print(f"| {build:g}/{overlay:g}/{run:g} | {a0:.1%} | {t0:.1f} | {b0:.2f} | {o0:.1f} | {h0:.2f} ({m0:.2f}) "
              f"| {w0:.2f} | {a1:.1%} | {t1:.1f} | {b1:.2f} | {o1:.1f} | {h1:.2f} ({m1:.2f}) | {w1:.2f} "
              f"| {h1 / h0:.2f}x ({m1 / m0:.2f}x) |  ({time.perf_counter() - started:.1f} s)", flush=True)


def repo_keys(path: str, good: str, bad: str) -> tuple[str, list[str]]:
    from bisect_npu.builders.key import BuildKeyReader
    from bisect_npu.upstream import history

    repo = history.open_repo(path)
    brange = history.resolve_range(repo, good, bad)
    reader = BuildKeyReader(repo)
    keys = [reader.key(sha).digest for sha in (brange.base, *brange.candidates)]
    return f"{good}..{bad} ({len(brange.candidates)} commits, every culprit)", keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", help="a real repository whose range's build keys make one more row")
    parser.add_argument("--good", default="v0.9.0rc1")
    parser.add_argument("--bad", default="v0.9.1")
    parser.add_argument("--quick", action="store_true", help="3 layouts per N, 40 noisy runs: a smoke test")
    parser.add_argument("--likelihood-only", action="store_true", help="only the likelihood table")
    parser.add_argument("--tune", action="store_true", help="the likelihood table on the tuning seeds (1000+)")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4],
                        help="commits a round in the likelihood tables (one table each)")
    args = parser.parse_args()
    started = time.perf_counter()
    if not args.likelihood_only:
        exact_table(3 if args.quick else 20, repo_keys(args.repo, args.good, args.bad) if args.repo else None)
        noisy_table(5, 1) if args.quick else noisy_table(10, 3)
    for slots in args.slots:
        likelihood_table(5, 1, args.tune, slots) if args.quick else likelihood_table(20, 3, args.tune, slots)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
