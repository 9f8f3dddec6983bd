"""Several hosts, one bisection: rounds and hours for 1, 2, 4 and 8 hosts of 8 cards.

The real search (bisect_npu.forecast.simulate, the same code a session runs) over a real range of
vllm-ascend with its real build keys, exact (a deterministic oracle, rates 1/0) and noisy (0.8/0.2).
Each host of 8 cards holds 8 // ENGINE engines; `--executor ray` gives a session one slot per
engine of the whole cluster, so hosts x engines per host slots. Culprits spread evenly over the
range; costs as `bisect-npu simulate`'s defaults, with a model load of 3 minutes.

    .venv/bin/python bench/hosts_bench.py --repo ../vllm-ascend [--good v0.9.0rc1 --bad v0.9.1] [--quick]
"""

from __future__ import annotations

import argparse
import time

from bisect_npu.forecast.plan import range_keys, unbuildable_positions
from bisect_npu.forecast.simulate import Minutes, simulate
from bisect_npu.upstream import history

CARDS_PER_HOST = 8
HOSTS = (1, 2, 4, 8)
COSTS = Minutes(build=30.0, overlay=2.0, run=5.0, load=3.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="A clone of vllm-ascend (a bare one will do).")
    parser.add_argument("--good", default="v0.9.0rc1")
    parser.add_argument("--bad", default="v0.9.1")
    parser.add_argument("--engine", type=int, default=2, help="Cards per engine (the recipe's parallel sizes).")
    parser.add_argument("--culprits", type=int, default=8, help="Culprit positions, spread over the range.")
    parser.add_argument("--quick", action="store_true", help="Fewer runs per culprit (a smoke test).")
    args = parser.parse_args()

    repo = history.open_repo(args.repo)
    brange = history.resolve_range(repo, args.good, args.bad)
    build_keys = range_keys(repo, brange, "Dockerfile")
    keys = [key.digest for key in build_keys]
    n = len(brange.candidates)
    culprits = sorted({max(1, round(n * (i + 0.5) / args.culprits)) for i in range(args.culprits)})
    per_host = CARDS_PER_HOST // args.engine
    print(f"{args.good}..{args.bad}: {n} candidates, {len(set(keys))} build keys; engine of {args.engine} "
          f"cards, {per_host} per host; culprits at {culprits}; costs (min) {COSTS}")
    print("| mode | hosts | slots | accuracy | rounds | trials | builds | wall hours | machine hours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, rates, runs in (("exact", (1.0, 0.0), 3 if args.quick else 25),
                              ("noisy", (0.8, 0.2), 1 if args.quick else 4)):
        for hosts in HOSTS:
            started = time.monotonic()
            summary = simulate(n, culprits, bad_rate=rates[0], good_rate=rates[1], slots=hosts * per_host,
                               mode=mode, runs=runs, seed=0, build_key_of=keys.__getitem__,
                               unbuildable=unbuildable_positions(build_keys), costs=COSTS)
            print(f"| {mode} {rates[0]}/{rates[1]} | {hosts} | {hosts * per_host} | {summary.accuracy:.2f} | "
                  f"{summary.mean_rounds:.1f} | {summary.mean_trials:.1f} | {summary.mean_builds:.1f} | "
                  f"{summary.mean_wall_hours:.1f} | {summary.mean_machine_hours:.1f} |"
                  f"  <!-- {summary.runs} runs, {time.monotonic() - started:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
