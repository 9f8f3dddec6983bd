"""Whether each candidate step's likelihood ratio delivers the evidence it states.

A bisection's answer is as sure as the steps it rests on: a culprit named at 0.99 is wrong more
often than 1% when some step's ratio says more than its samples do. This runs one kind of sampled
history the way a session does (`accuracy_bench.run_ours`, focused) over many seeds and keeps every
candidate step: the ratio it handed the search (bad side over good side), the truth of its side
(at or past the culprit: bad), and what the ratio rested on: the ends' fit (the correlation of a
sample's two rates, cov / sqrt(good spread x bad spread); the spreads' relative error), the samples
and rounds it ran.

Every candidate on one side of the culprit runs the same rates in these histories, so a step's
difficulty does not depend on where it sits: a ratio L that is a true likelihood ratio puts the
step on the wrong side with chance 1 / (1 + e^|L|) under even odds between the sides (the
search queries candidates near its posterior's median, so the odds are about even). Each band of
|L| counts the steps, those whose sign is wrong and the wrong ones that chance predicts; the table
is split by each of the ratio's inputs, so a split whose wrong count outruns its expected one
names where the stated evidence outruns the delivered.

    .venv/bin/python bench/step_reliability.py --icc 0.7 --scores 0.95 0.90 --shape scaled --runs 100 --seed 30000
    .venv/bin/python bench/step_reliability.py --icc 0.5 --samples 50 --repeats 2 --shape scaled --runs 100 --seed 30000
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from accuracy_bench import Scenario, StepTrace, accuracy_config, make_case, run_ours
from reliability import poisson_tail

BANDS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)  # lower edges of |log likelihood ratio|


@dataclass(frozen=True)
class Step:
    """One candidate step of one history: its ratio, its side's truth, and what it rested on."""

    log_lr: float
    bad: bool  # the truth: at or past the culprit
    correlation: float  # the fitted correlation of a sample's two rates
    spread_error: float  # the larger of the two spreads' relative standard errors
    sample_runs: int  # the samples the step ran, all rounds (times the repeats: not counted here)
    rounds: int

    @property
    def wrong(self) -> bool:
        """Whether the ratio's sign names the other side (a ratio of 0 says nothing)."""
        return (self.log_lr > 0 and not self.bad) or (self.log_lr < 0 and self.bad)

    @property
    def chance_wrong(self) -> float:
        """The chance a true likelihood ratio of this size names the wrong side, even odds."""
        return 0.0 if self.log_lr == 0 else 1.0 / (1.0 + math.exp(abs(self.log_lr)))


def steps_of(trace: Iterable[StepTrace], culprit: int) -> list[Step]:
    """The candidate steps of one history's trace."""
    steps = []
    for t in trace:
        if t.role != "candidate" or t.prior is None:
            continue
        p = t.prior
        correlation = p.cov / math.sqrt(p.good_var * p.bad_var)
        spread_error = max(p.good_var_error / p.good_var, p.bad_var_error / p.bad_var)
        steps.append(Step(t.log_lr, t.position >= culprit, correlation, spread_error, sum(t.rounds), len(t.rounds)))
    return steps


@dataclass(frozen=True)
class Band:
    steps: int
    wrong: int
    expected: float


def banded(steps: Sequence[Step], edges: Sequence[float] = BANDS) -> list[Band]:
    """The steps binned by |ratio| at `edges` (lower edges): steps, wrong-signed, chance's count."""
    bands = [[0, 0, 0.0] for _ in edges]
    for s in steps:
        at = max(i for i, lo in enumerate(edges) if abs(s.log_lr) >= lo)
        bands[at][0] += 1
        bands[at][1] += s.wrong
        bands[at][2] += s.chance_wrong
    return [Band(int(n), int(w), float(e)) for n, w, e in bands]


SPLITS: tuple[tuple[str, Callable[[Step], str]], ...] = (
    ("all", lambda s: "all"),
    ("fitted correlation of the two rates",
     lambda s: ("< 0.5" if s.correlation < 0.5 else "0.5-0.8" if s.correlation < 0.8 else
                "0.8-0.95" if s.correlation < 0.95 else "0.95-0.99" if s.correlation < 0.99 else ">= 0.99 (tied)")),
    ("spreads' relative error",
     lambda s: "< 0.1" if s.spread_error < 0.1 else "0.1-0.2" if s.spread_error < 0.2 else
     "0.2-0.4" if s.spread_error < 0.4 else ">= 0.4"),
    ("samples run", lambda s: "1-8" if s.sample_runs <= 8 else "9-24" if s.sample_runs <= 24 else
     "25-64" if s.sample_runs <= 64 else "> 64"),
    ("rounds", lambda s: str(min(s.rounds, 3)) if s.rounds < 3 else "3+"),
)


def table(steps: Sequence[Step]) -> list[str]:
    """The step reliability table: per split and group, per band of |ratio|, steps / wrong /
    chance's wrong, then the group's totals and P(wrong >= seen) (`poisson_tail`)."""
    head = " | ".join(f"[{lo:g}, {hi:g})" for lo, hi in zip(BANDS, (*BANDS[1:], math.inf), strict=True))
    lines = [f"| split | group | {head} | all | P(wrong >= seen) |", "|---|---|" + "---:|" * (len(BANDS) + 2)]
    for name, key in SPLITS:
        groups: dict[str, list[Step]] = {}
        for s in steps:
            groups.setdefault(key(s), []).append(s)
        for group in sorted(groups):
            bands = banded(groups[group])
            wrong, expected = sum(b.wrong for b in bands), sum(b.expected for b in bands)
            cells = " | ".join(f"{b.steps} / {b.wrong} / {b.expected:.2f}" for b in bands)
            lines.append(f"| {name} | {group} | {cells} | {len(groups[group])} / {wrong} / {expected:.2f} | "
                         f"{poisson_tail(wrong, expected):.2g} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=30000)
    parser.add_argument("--icc", type=float, default=0.7)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--scores", type=float, nargs=2, default=(0.82, 0.70), metavar=("GOOD", "BAD"))
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--shape", choices=("subset", "scaled"), default="scaled")
    parser.add_argument("--commits", type=int, default=48)
    args = parser.parse_args()
    started = time.monotonic()
    s = Scenario(f"ICC {args.icc:g}, {args.shape}", args.samples, args.scores[0], args.scores[1], args.icc,
                 args.repeats, n=args.commits, drop=args.shape)
    cfg = accuracy_config(s)
    steps: list[Step] = []
    wrong = []
    for k in range(args.runs):
        case = make_case(s, args.seed + k)
        trace: list[StepTrace] = []
        got = run_ours(s, case, True, cfg, trace=trace)
        steps += steps_of(trace, case.culprit)
        if got.wrong:
            wrong.append(args.seed + k)
    print(f"{s.name}, {s.samples} samples, {100 * s.good:.0f}% -> {100 * s.bad:.0f}%, repeats {s.repeats}; "
          f"seeds {args.seed}..{args.seed + args.runs - 1}: {len(steps)} candidate steps; wrong culprits at {wrong}")
    print("candidate steps by |log likelihood ratio|: steps / wrong side / wrong expected (even odds)")
    for line in table(steps):
        print(line)
    print(f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
