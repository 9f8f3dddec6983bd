"""Noisy bisection benchmark: this tool against three baselines, on the same simulated histories.

For N = 32, 128, 1000 candidates and failure-rate pairs (bad/good) 1.0/0.0, 0.95/0.05, 0.8/0.2,
0.2/0.0, every method bisects the same seeded cases (culprit uniform over 1..N):

  tool      bisect_npu.search noisy mode (ends, Bayesian bisection, sandwich), confidence 0.99
  exact     bisect_npu.search exact mode (a recipe's ``trials.mode: exact``), one verdict per
            commit: what the tool does for a deterministic oracle; run on the 1.0/0.0 cells only
  plain     git-bisect style: both ends, then binary search with one trial per commit
  fixed20   binary search with 20 trials per commit; bad when the failure share exceeds the
            midpoint of the two ends' measured shares (a threshold vote)
  bayesect  Bayesian bisection as published for git-bayesect: uniform Beta priors on the two
            rates integrated out, greedy minimum expected entropy of the change point, one
            trial at a time, stop at posterior 0.99 (written here from the description)

Two more tables at N = 128 show what the trial count depends on:
  earlier runs   the tool when each end was run 10, 20 or 40 times before the session (a
                 recipe's ``trials.earlier_runs``; counts drawn from the true rates, not told)
  calibration    the tool at confidence 0.9, 0.95, 0.97 and 0.99 (0.8/0.2): how accuracy
                 follows the confidence asked for, i.e. what fewer trials cost

Then the k-slot checks: rounds of the exact search with k = 1, 3, 7 slots against log_{k+1} N,
and rounds and trials of the noisy search with k slots at 0.8/0.2. Last, costs: when starting
the engine (loading the model) costs L trials and building a new commit B trials, the tool told
L (a recipe's ``trials.load_cost``, measured by default) asks several trials per query, and told
B too (``trials.build_cost``) prefers commits it has built; against the same search asking one
trial per query, on the same seeded cases (cost = trials + L x starts + B x builds).

    .venv/bin/python bench/noisy_bench.py            # 1,000 runs per cell
    .venv/bin/python bench/noisy_bench.py --quick    # 40 runs per cell, a smoke test
"""

from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from bisect_npu.forecast.simulate import Minutes, simulate, simulate_one
from bisect_npu.search import Evidence, Found, Next, SearchProblem, decide
from bisect_npu.search.noisy import information_gain

SIZES = (32, 128, 1000)
RATES = ((1.0, 0.0), (0.95, 0.05), (0.8, 0.2), (0.2, 0.0))
METHODS = ("tool", "plain", "fixed20", "bayesect")
PERFECT = (1.0, 0.0)
BAYESECT_TRIAL_CAP = 3000
EARLIER = (10, 20, 40)
CALIBRATION = (0.9, 0.95, 0.97, 0.99)
DETAIL_N = 128
# (L, B): an engine start and a build, in trials. A 30-minute build and 3-minute trials: B = 10;
# a 2-minute model load and 20-second trials: L = 6.
COSTS = ((2.0, 0.0), (10.0, 0.0), (50.0, 0.0), (2.0, 20.0), (10.0, 100.0))
LOAD_RATES = ((0.95, 0.05), (0.8, 0.2), (0.2, 0.0))


@dataclass(frozen=True)
class Cell:
    method: str
    n: int
    bad_rate: float
    good_rate: float
    accuracy: float
    mean_trials: float
    p95_trials: float
    seconds: float
    earlier: int = 0
    confidence: float = 0.99


def trial_failures(rng: np.random.Generator, position: int, culprit: int, p: float, q: float, k: int) -> int:
    return int((rng.random(k) < (p if position >= culprit else q)).sum())


def run_tool(n: int, culprit: int, p: float, q: float, rng: np.random.Generator,
             mode: str = "noisy", earlier: int = 0, confidence: float = 0.99) -> tuple[bool, int]:
    problem = SearchProblem(n=n, mode=mode, confidence=confidence)  # type: ignore[arg-type]
    outcome = simulate_one(problem, culprit, bad_rate=p, good_rate=q, build_fail=0.0, rng=rng,
                           build_key_of=str, earlier_runs=earlier)
    return outcome.correct, outcome.trials


def run_vote(n: int, culprit: int, p: float, q: float, rng: np.random.Generator, per_commit: int) -> tuple[bool, int]:
    """Exact search where each commit's verdict is a vote over ``per_commit`` trials."""
    problem = SearchProblem(n=n)
    evidence: dict[int, Evidence] = {}
    shares: dict[int, float] = {}
    trials = 0
    while isinstance(decision := decide(problem, evidence), Next):
        for query in decision.queries:
            i = query.index
            shares[i] = trial_failures(rng, i, culprit, p, q, per_commit) / per_commit
            trials += per_commit
            if i in (0, n):
                verdict = "good" if i == 0 else "bad"
                if i == 0 and n in shares and shares[0] >= shares[n]:
                    verdict = "bad"
            else:
                threshold = (shares.get(0, 0.0) + shares.get(n, 1.0)) / 2 if per_commit > 1 else 0.5
                verdict = "bad" if shares[i] > threshold else "good"
            evidence[i] = Evidence().add(verdict)
    return isinstance(decision, Found) and decision.index == culprit, trials


def _log_beta_marginal(bad: np.ndarray, good: np.ndarray, logfact: np.ndarray) -> np.ndarray:
    """log of the integral of r^bad (1-r)^good over a uniform prior: B(bad+1, good+1)."""
    return logfact[bad] + logfact[good] - logfact[bad + good + 1]


def run_bayesect(n: int, culprit: int, p: float, q: float, rng: np.random.Generator,
                 confidence: float = 0.99) -> tuple[bool, int]:
    """Greedy expected-entropy Bayesian bisection with independent uniform Beta rate priors."""
    logfact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, 2 * BAYESECT_TRIAL_CAP + 3)))))
    bad = np.zeros(n + 1, dtype=np.int64)
    good = np.zeros(n + 1, dtype=np.int64)
    for trials in range(BAYESECT_TRIAL_CAP + 1):
        # c in 1..n: positions < c are "old", >= c "new".
        old_bad, old_good = np.cumsum(bad)[:-1], np.cumsum(good)[:-1]
        new_bad, new_good = bad[::-1].cumsum()[::-1][1:], good[::-1].cumsum()[::-1][1:]
        log_post = _log_beta_marginal(old_bad, old_good, logfact) + _log_beta_marginal(new_bad, new_good, logfact)
        mass = np.exp(log_post - log_post.max())
        mass /= mass.sum()
        if mass.max() >= confidence:
            return int(np.argmax(mass)) + 1 == culprit, trials
        mean_old = (old_bad + 1) / (old_bad + old_good + 2)
        mean_new = (new_bad + 1) / (new_bad + new_good + 2)
        x = int(np.argmax(information_gain(mass, mean_old, mean_new)))
        if rng.random() < (p if x >= culprit else q):
            bad[x] += 1
        else:
            good[x] += 1
    return False, BAYESECT_TRIAL_CAP


Job = tuple[str, int, float, float, int, int, int, float]


def run_cell(args: Job) -> Cell:
    method, n, p, q, runs, seed, earlier, confidence = args
    rng = np.random.default_rng([seed, n, int(p * 100), int(q * 100)])
    culprits = rng.integers(1, n + 1, size=runs)
    start = time.perf_counter()
    results = []
    for culprit in culprits:
        if method == "tool":
            results.append(run_tool(n, int(culprit), p, q, rng, earlier=earlier, confidence=confidence))
        elif method == "exact":
            results.append(run_tool(n, int(culprit), p, q, rng, mode="exact"))
        elif method == "plain":
            results.append(run_vote(n, int(culprit), p, q, rng, 1))
        elif method == "fixed20":
            results.append(run_vote(n, int(culprit), p, q, rng, 20))
        else:
            results.append(run_bayesect(n, int(culprit), p, q, rng))
    trials = np.array([t for _, t in results], dtype=float)
    return Cell(method, n, p, q, float(np.mean([ok for ok, _ in results])), float(trials.mean()),
                float(np.percentile(trials, 95)), time.perf_counter() - start, earlier, confidence)


def rounds_check() -> list[str]:
    """Worst and mean rounds of the exact search with k slots, perfect test, against log_{k+1} N."""
    lines = ["| N | k | mean rounds | worst rounds | log_{k+1} N |", "|---|---|---|---|---|"]
    for n in SIZES:
        for k in (1, 3, 7):
            rounds = []
            for culprit in range(1, n + 1, max(1, n // 97)):
                problem = SearchProblem(n=n, slots=k)
                evidence: dict[int, Evidence] = {}
                count = 0
                while isinstance(decision := decide(problem, evidence), Next):
                    count += 1
                    for query in decision.queries:
                        evidence[query.index] = Evidence().add("bad" if query.index >= culprit else "good")
                rounds.append(count)
            lines.append(f"| {n} | {k} | {np.mean(rounds):.2f} | {max(rounds)} | {math.log(n, k + 1):.2f} |")
    return lines


def noisy_rounds_check(runs: int) -> list[str]:
    """Rounds and trials of the noisy search with k slots at 0.8/0.2, N = DETAIL_N (k picks per round)."""
    lines = ["| k | accuracy | mean rounds | mean trials | rounds vs k = 1 |", "|---|---|---|---|---|"]
    base = 0.0
    for k in (1, 3, 7):
        summary = simulate(DETAIL_N, DETAIL_N // 2, bad_rate=0.8, good_rate=0.2, slots=k, mode="noisy",
                           runs=runs, seed=1, costs=Minutes(build=0.0, run=1.0))
        base = base or summary.mean_rounds
        lines.append(f"| {k} | {summary.accuracy:.1%} | {summary.mean_rounds:.1f} | {summary.mean_trials:.1f} | "
                     f"{summary.mean_rounds / base:.2f} |")
    return lines


CostJob = tuple[float, float, float, float, float, float, int]
CostCell = tuple[float, float, float, float, float]


def run_cost_cell(args: CostJob) -> CostCell:
    """Accuracy, mean trials, engine starts, builds and cost of one cell: the search is told
    ``told_load`` and ``told_build``; the cost counts the true ``load`` and ``build``."""
    p, q, load, build, told_load, told_build, runs = args
    rng = np.random.default_rng([7, int(p * 100), int(q * 100), int(load), int(build)])
    problem = SearchProblem(n=DETAIL_N, mode="noisy", load_cost=told_load, build_cost=told_build)
    outcomes = [simulate_one(problem, int(rng.integers(1, DETAIL_N + 1)), bad_rate=p, good_rate=q, build_fail=0.0,
                             rng=rng, build_key_of=str,
                             costs=Minutes(build=build, run=1.0, load=load)) for _ in range(runs)]
    trials = np.array([o.trials for o in outcomes], dtype=float)
    starts = np.array([o.loads for o in outcomes], dtype=float)
    builds = np.array([o.builds for o in outcomes], dtype=float)
    return (float(np.mean([o.correct for o in outcomes])), float(trials.mean()), float(starts.mean()),
            float(builds.mean()), float((trials + load * starts + build * builds).mean()))


def cost_check(runs: int, workers: int) -> list[str]:
    """The search told nothing (one trial per query), told the engine-start cost L, and told L and
    the build cost B, on the same seeded cases, N = DETAIL_N."""
    variants = {"one trial per query": lambda load, build: (0.0, 0.0), "told L": lambda load, build: (load, 0.0),
                "told L and B": lambda load, build: (load, build)}
    jobs = {(p, q, load, build, name): (p, q, load, build, *told(load, build), runs)
            for p, q in LOAD_RATES for load, build in COSTS for name, told in variants.items()
            if build or name != "told L and B"}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = dict(zip(jobs, pool.map(run_cost_cell, jobs.values()), strict=True))
    lines = ["| bad/good | L | B | " + " | ".join(f"{name}: accuracy / trials / starts / builds / cost"
                                                   for name in variants) + " | best cost ratio |",
             "|---|---|---|---|---|---|---|"]
    for p, q in LOAD_RATES:
        for load, build in COSTS:
            shown = [results.get((p, q, load, build, name)) for name in variants]
            cells = [_cost_cell(r) for r in shown]
            baseline = results[(p, q, load, build, "one trial per query")][4]
            best = min(r[4] for r in shown if r) / baseline
            lines.append(f"| {p}/{q} | {load:g} | {build:g} | " + " | ".join(cells) + f" | {best:.2f} |")
    return lines


def _cost_cell(cell: CostCell | None) -> str:
    if cell is None:
        return "-"
    accuracy, trials, starts, builds, cost = cell
    return f"{accuracy:.1%} / {trials:.1f} / {starts:.1f} / {builds:.1f} / {cost:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="simulated bisections per cell")
    parser.add_argument("--quick", action="store_true", help="40 runs per cell (smoke test)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    runs = 40 if args.quick else args.runs
    methods = args.methods.split(",")
    jobs: list[Job] = [(m, n, p, q, runs, args.seed, 0, 0.99) for n in SIZES for p, q in RATES for m in methods]
    if "tool" in methods:
        jobs += [("exact", n, *PERFECT, runs, args.seed, 0, 0.99) for n in SIZES]
        jobs += [("tool", DETAIL_N, p, q, runs, args.seed, e, 0.99) for p, q in RATES for e in EARLIER]
        jobs += [("tool", DETAIL_N, 0.8, 0.2, runs, args.seed, 0, c) for c in CALIBRATION if c != 0.99]
    jobs.sort(key=lambda job: -job[1])  # big cells first so the workers finish together
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        cells = {(c.method, c.n, c.bad_rate, c.good_rate, c.earlier, c.confidence): c
                 for c in pool.map(run_cell, jobs)}
    main_cells = {key[:4]: c for key, c in cells.items() if key[4:] == (0, 0.99)}
    print(f"{runs} runs per cell, confidence 0.99 for tool and bayesect; accuracy / mean trials / p95 trials")
    print()
    print("| N | bad/good | " + " | ".join(methods) + " | goal (tool) |")
    print("|---|---|" + "---|" * len(methods) + "---|")
    for n in SIZES:
        for p, q in RATES:
            row = []
            for m in methods:
                c = main_cells[(m, n, p, q)]
                row.append(f"{c.accuracy:.1%} / {c.mean_trials:.1f} / {c.p95_trials:.0f}")
            goal = ">=99%"
            if (p, q) == (1.0, 0.0):
                goal += f", <= {math.ceil(math.log2(n)) + 2} trials"
            if (n, p, q) == (128, 0.8, 0.2):
                goal += ", <= 41 trials"
            print(f"| {n} | {p}/{q} | " + " | ".join(row) + f" | {goal} |")
    tool = [c for key, c in main_cells.items() if key[0] == "tool"]
    if tool and "bayesect" in methods:
        ratios = [c.mean_trials / main_cells[("bayesect", c.n, c.bad_rate, c.good_rate)].mean_trials for c in tool]
        print()
        print(f"tool trials / bayesect trials: min {min(ratios):.2f}, median {np.median(ratios):.2f}, "
              f"max {max(ratios):.2f}")
    if "tool" in methods:
        print()
        print("Perfect test (1.0/0.0): the tool in each mode, accuracy / mean trials / p95 trials:")
        print()
        print("| N | this tool, exact mode (deterministic oracle) | this tool, noisy mode | goal |")
        print("|---|---|---|---|")
        for n in SIZES:
            shown = [main_cells[(m, n, *PERFECT)] for m in ("exact", "tool")]
            print(f"| {n} | " + " | ".join(f"{c.accuracy:.1%} / {c.mean_trials:.1f} / {c.p95_trials:.0f}"
                                            for c in shown) + f" | <= {math.ceil(math.log2(n)) + 2} trials |")
        print()
        print("Noisy mode cannot meet ceil(log2 N) + 2 on a perfect test and stay >= 99% right at 0.95/0.05:")
        print("one run per commit without a contradiction looks the same under both, so a deterministic")
        print("oracle is bisected in exact mode (`trials.mode: exact`).")
        print()
        print(f"Earlier runs of the ends (N = {DETAIL_N}; the tool counts them, they are not in the trials):")
        print()
        print("| bad/good | none | " + " | ".join(f"{e} per end" for e in EARLIER) + " |")
        print("|---|---|" + "---|" * len(EARLIER))
        for p, q in RATES:
            shown = [cells[("tool", DETAIL_N, p, q, e, 0.99)] for e in (0, *EARLIER)]
            print(f"| {p}/{q} | " + " | ".join(f"{c.accuracy:.1%} / {c.mean_trials:.1f} / {c.p95_trials:.0f}"
                                              for c in shown) + " |")
        print()
        print(f"Calibration at 0.8/0.2, N = {DETAIL_N}: the confidence asked for against the accuracy reached:")
        print()
        print("| confidence | accuracy | mean trials | p95 trials |")
        print("|---|---|---|---|")
        for conf in CALIBRATION:
            c = cells[("tool", DETAIL_N, 0.8, 0.2, 0, conf)]
            print(f"| {conf} | {c.accuracy:.1%} | {c.mean_trials:.1f} | {c.p95_trials:.0f} |")
    print()
    print("k-slot rounds, exact search, perfect test (ends share the first round when k > 2):")
    print()
    for line in rounds_check():
        print(line)
    print()
    print(f"k-slot rounds, noisy search, 0.8/0.2, N = {DETAIL_N}, culprit in the middle ({max(runs // 5, 20)} runs):")
    print()
    for line in noisy_rounds_check(max(runs // 5, 20)):
        print(line)
    print()
    cost_runs = max(runs // 10, 20)
    print(f"Engine starts costing L trials and builds costing B, N = {DETAIL_N} ({cost_runs} runs per cell; "
          "cost = trials + L x starts + B x builds):")
    print()
    for line in cost_check(cost_runs, args.workers):
        print(line)
    print()
    print(f"total {time.perf_counter() - start:.0f} s on {args.workers} workers")


if __name__ == "__main__":
    main()
