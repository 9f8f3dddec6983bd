"""Whether each candidate step's likelihood ratio delivers the evidence it states.

A step hands the search a log likelihood ratio L (bad side over good side). If L is the true
ratio, then on a commit of the good side P(L >= t) <= e^-t for every t, and on the bad side
P(L <= -t) <= e^-t (Markov's inequality on the ratio, whose mean under the other side is 1;
Ville's for a ratio stopped by a sequential rule). So a step's "wrong-way" reading, w = L on the
good side and -L on the bad, is checked in bands: how many steps reached w >= t against at most
e^-t of them. A group of steps that reaches t far more often than that states more evidence
than it delivers; -log(the share seen) is what it delivered at that t.

Steps are split by what could make the stated ratio outrun the delivered one: whether the ends
ran each sample once or more (and which end's spread was borrowed, `JointPrior.borrowed`),
whether they passed `stats.ends_known`, the fitted intraclass correlation's band, the rounds
the step ran, how it stopped, and how many readings of the spreads it weighed. Every wrong
culprit's two deciding steps (the named commit's and its parent's) are listed too.

    .venv/bin/python bench/step_bounds.py --runs 100 --seed 30000 --icc 0 --repeats 1
    .venv/bin/python bench/step_bounds.py --runs 100 --seed 30000 --icc 0.9 --repeats 1
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from accuracy_bench import Scenario, StepTrace, accuracy_config, make_case, run_ours
from reliability import p_label, poisson_tail

from bisect_npu.oracle.accuracy import stats
from bisect_npu.oracle.accuracy.judge import samples_of

LEVELS = (1.0, 2.0, 3.0, 4.0, 5.0)  # t: wrong-way readings at least this many nats


@dataclass(frozen=True)
class Step:
    """One candidate step: its ratio, its commit's true side and what it was judged against."""

    seed: int
    position: int
    bad: bool  # the commit's true side
    log_lr: float
    ends_runs: str  # "once" (either end ran each sample once) or "repeated"
    borrowed: str  # the end whose spread was borrowed ("none", "good", "bad")
    known: bool  # stats.ends_known at the step
    rho: float
    rounds: int
    stopped: str
    readings: int
    broken_elsewhere: bool

    @property
    def wrong_way(self) -> float:
        """The ratio read toward the side the commit is not on (positive: the wrong way)."""
        return -self.log_lr if self.bad else self.log_lr


def step_of(seed: int, culprit: int, t: StepTrace, greedy: bool, confidence: float) -> Step:
    assert t.ends is not None
    good, bad = samples_of(t.ends[0]) or [], samples_of(t.ends[1]) or []
    prior = stats.fit_joint(good, bad, greedy)
    once = min(s.runs for s in (*good, *bad)) == 1
    return Step(seed, t.position, t.position >= culprit, float(t.figures.get("log_likelihood_ratio", 0.0)),
                "once" if once else "repeated", prior.borrowed or "none", stats.ends_known(good, bad), prior.rho,
                len(t.rounds), t.stopped, len(stats.evident_readings(prior, confidence)),
                bool(t.figures.get("broken_elsewhere")))


@dataclass(frozen=True)
class Band:
    """Wrong-way readings of a group of steps at each level t: seen, and at most expected."""

    steps: int
    seen: tuple[int, ...]

    def expected(self, t: float) -> float:
        return self.steps * math.exp(-t)


def band(steps: Iterable[Step], levels: Sequence[float] = LEVELS) -> Band:
    ws = [s.wrong_way for s in steps]
    return Band(len(ws), tuple(sum(w >= t for w in ws) for t in levels))


def delivered(seen: int, steps: int) -> str:
    """-log of the share of steps seen at a level: the evidence the level delivered (nats)."""
    return "-" if seen == 0 or steps == 0 else f"{-math.log(seen / steps):.1f}"


def table(name: str, groups: dict[str, list[Step]], levels: Sequence[float] = LEVELS) -> list[str]:
    cells = " | ".join(f"w >= {t:g}: seen / at most (delivered)" for t in levels)
    lines = [f"\n{name}", f"| group | steps | {cells} | P(seen >= at w >= {levels[-1]:g}) |",
             "|---|---:|" + "---:|" * (len(levels) + 1)]
    for key, steps in groups.items():
        b = band(steps, levels)
        row = " | ".join(f"{n} / {b.expected(t):.1f} ({delivered(n, b.steps)})" for t, n in zip(levels, b.seen,
                                                                                               strict=True))
        lines.append(f"| {key} | {b.steps} | {row} | {p_label(poisson_tail(b.seen[-1], b.expected(levels[-1])))} |")
    return lines


def grouped(steps: Sequence[Step], key: Callable[[Step], str]) -> dict[str, list[Step]]:
    out: dict[str, list[Step]] = {}
    for s in steps:
        out.setdefault(key(s), []).append(s)
    return dict(sorted(out.items()))


def rho_band(rho: float) -> str:
    for edge in (0.1, 0.3, 0.5, 0.7, 0.9):
        if rho < edge:
            return f"rho < {edge:g}"
    return "rho >= 0.9"


SPLITS: tuple[tuple[str, Callable[[Step], str]], ...] = (
    ("all", lambda s: "all"),
    ("true side", lambda s: "bad side" if s.bad else "good side"),
    ("ends ran each sample", lambda s: f"{s.ends_runs}, borrowed {s.borrowed}"),
    ("ends known (stats.ends_known)", lambda s: f"known {s.known}"),
    ("fitted correlation", lambda s: rho_band(s.rho)),
    ("rounds the step ran", lambda s: f"{min(s.rounds, 4)}{'+' if s.rounds >= 4 else ''} round(s)"),
    ("how it stopped", lambda s: f"{s.stopped}{', broken elsewhere' if s.broken_elsewhere else ''}"),
    ("readings of the spreads weighed", lambda s: f"{s.readings} reading(s)"),
)


def by_position(steps: Sequence[Step]) -> list[tuple[int, Step]]:
    """(how many steps, the steps at one commit of one history with their ratios summed): what
    the search weighs at a position. Steps asked again at a commit add as one sequential ratio
    only if each is a true ratio given the side; a shared error of the model shows here as
    wrong-way sums that single steps do not reach."""
    at: dict[tuple[int, int], list[Step]] = {}
    for s in steps:
        at.setdefault((s.seed, s.position), []).append(s)
    return [(len(group), replace(group[-1], log_lr=sum(s.log_lr for s in group),
                                 rounds=sum(s.rounds for s in group))) for group in at.values()]


def run(s: Scenario, seeds: Iterable[int]) -> tuple[list[Step], list[str]]:
    cfg = accuracy_config(s)
    steps: list[Step] = []
    wrong: list[str] = []
    for seed in seeds:
        case = make_case(s, seed)
        trace: list[StepTrace] = []
        got = run_ours(s, case, True, cfg, trace=trace)
        mine = [step_of(seed, case.culprit, t, cfg.greedy, cfg.confidence) for t in trace if t.role == "candidate"]
        steps += mine
        if got.wrong:
            named = got.named if got.named is not None else -1
            deciding = [m for m in mine if m.wrong_way > 0 or m.position in (named - 1, named)]
            wrong.append(f"seed {seed}: culprit {case.culprit}, named {named} at {got.posterior:.4f}; steps: "
                         + "; ".join(f"{m.position} ({'bad' if m.bad else 'good'}) L {m.log_lr:+.2f} rho {m.rho:.2f} "
                                     f"{m.ends_runs}/{m.borrowed} known {m.known} rounds {m.rounds} {m.stopped}"
                                     f"{' broken elsewhere' if m.broken_elsewhere else ''}"
                                     for m in deciding))
    return steps, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=30000)
    parser.add_argument("--seeds", type=int, nargs="*", default=None, help="these seeds instead (wrong ones traced)")
    parser.add_argument("--icc", type=float, default=0.0)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--scores", type=float, nargs=2, default=(0.82, 0.70), metavar=("GOOD", "BAD"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--shape", choices=("subset", "scaled"), default="scaled")
    args = parser.parse_args()
    started = time.monotonic()
    s = Scenario(f"ICC {args.icc:g}, {args.shape}", args.samples, args.scores[0], args.scores[1], args.icc,
                 args.repeats, n=48, drop=args.shape)
    seeds = args.seeds if args.seeds is not None else range(args.seed, args.seed + args.runs)
    steps, wrong = run(s, seeds)
    named = f"seeds {', '.join(map(str, seeds))}" if args.seeds is not None else \
        f"seeds {args.seed}..{args.seed + args.runs - 1}"
    print(f"{s.name}, {s.samples} samples, {100 * s.good:.0f}% -> {100 * s.bad:.0f}%, repeats {s.repeats}; "
          f"{named}: {len(steps)} candidate steps, {len(wrong)} wrong culprits")
    print("w: a step's log likelihood ratio read the wrong way (its commit's true side); "
          "'at most': e^-t of the group's steps, what true ratios allow")
    for name, key in SPLITS:
        for line in table(name, grouped(steps, key)):
            print(line)
    positions = by_position(steps)
    for line in table("commits: their steps' ratios summed (what the search weighs), by steps at the commit",
                      grouped([p for _, p in positions], lambda p: "all")
                      | grouped([replace(p, stopped=f"{n}") for n, p in positions],
                                lambda p: f"{min(int(p.stopped), 3)}{'+' if int(p.stopped) >= 3 else ''} step(s)")):
        print(line)
    for line in wrong:
        print(line)
    print(f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
