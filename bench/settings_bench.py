"""Settings search benchmark: ddmin (bisect_npu.search.ddmin) against trying each subset.

For 4, 8 and 16 differing keys with 1 and 2 triggering keys (placed at random, seeded), exact and
noisy, the search runs against a synthetic oracle: a configuration fails when it holds every
triggering key (exact: always; noisy: with the bad rate, else with the good rate). Trying each
subset runs all 2^n configurations (noisy: each with as many trials as the search's batch, the
least that reads one configuration). Printed per cell: the configurations and trials the search
ran (mean and max, and ddmin's worst-case bound), how often it named the true trigger, and the
ratios of configurations and of trials against trying each subset.

    .venv/bin/python bench/settings_bench.py             # 200 runs per cell
    .venv/bin/python bench/settings_bench.py --runs 20   # a smoke test
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bisect_npu.search import EndsWrong, Evidence
from bisect_npu.search.ddmin import Ask, Configuration, SettingsProblem, Trigger, decide_ddmin, worst_case_tests

KEYS = (4, 8, 16)
TRIGGERS = (1, 2)
# Noisy cells: a loop in about 2 runs of 5 on the bad side, none on the good (the demo's
# presence-penalty case), and a flaky test that also fails on the good side.
NOISY_RATES = ((0.4, 0.0), (0.9, 0.1))
BATCH = 10


def run_one(keys: int, trigger: Configuration, mode: str, bad_rate: float, good_rate: float,
            rng: np.random.Generator) -> tuple[int, int, bool]:
    """(configurations, trials, named the trigger) of one search."""
    problem = SettingsProblem(keys, mode=mode, confidence=0.95, batch=BATCH if mode == "noisy" else 1,  # type: ignore[arg-type]
                              max_trials=40 if mode == "noisy" else 1)
    evidence: dict[Configuration, Evidence] = {}
    trials = 0
    while True:
        decision = decide_ddmin(problem, evidence)
        if not isinstance(decision, Ask):
            break
        seen = evidence.get(decision.configuration, Evidence())
        rate = bad_rate if trigger <= decision.configuration else good_rate
        for _ in range(decision.trials):
            seen = seen.add("bad" if rng.random() < rate else "good")
        trials += decision.trials
        evidence[decision.configuration] = seen
    named = isinstance(decision, Trigger) and decision.keys == trigger
    assert not isinstance(decision, EndsWrong) or mode == "noisy"
    return len(evidence), trials, named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="searches per cell")
    args = parser.parse_args()
    started = time.time()
    print(f"{'mode':<14}{'keys':>5}{'trigger':>8}{'configs':>9}{'max':>5}{'bound':>7}{'trials':>8}"
          f"{'right':>7}{'each subset':>13}{'ratio':>9}{'trial ratio':>13}")
    cells = [("exact", 1.0, 0.0)] + [("noisy", bad, good) for bad, good in NOISY_RATES]
    for mode, bad_rate, good_rate in cells:
        for keys in KEYS:
            for size in TRIGGERS:
                rng = np.random.default_rng(keys * 100 + size)
                results = [run_one(keys, frozenset(int(k) for k in rng.choice(keys, size, replace=False)), mode,
                                   bad_rate, good_rate, rng) for _ in range(args.runs)]
                configs = np.array([r[0] for r in results])
                trials = np.array([r[1] for r in results])
                right = np.mean([r[2] for r in results])
                each = 2 ** keys
                label = mode if mode == "exact" else f"noisy {bad_rate}/{good_rate}"
                print(f"{label:<14}{keys:>5}{size:>8}{configs.mean():>9.1f}{configs.max():>5}"
                      f"{worst_case_tests(keys):>7}{trials.mean():>8.1f}{right:>7.1%}{each:>13}"
                      f"{each / configs.mean():>8.0f}x"
                      f"{each * (BATCH if mode == 'noisy' else 1) / trials.mean():>12.0f}x")
    print(f"({args.runs} runs per cell, {time.time() - started:.0f} s; noisy: {BATCH} trials a query, "
          "confidence 0.95, at most 40 trials a configuration; each subset: 2^n configurations, "
          f"noisy x {BATCH} trials)")


if __name__ == "__main__":
    main()
