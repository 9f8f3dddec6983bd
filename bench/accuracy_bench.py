"""Accuracy bisection benchmark: a score regression found four ways, on the same seeded histories.

Each case is a dataset of S samples and a history of N commits with one culprit (uniform over
1..N). A sample's correctness rate at the good side is drawn from a beta of mean `good` and
intraclass correlation `rho` (how repeatable a sample's result is: near 1 for greedy decoding,
lower for sampling at temperature 0.6); the culprit breaks a random subset of samples (their
rate drops to a twentieth) until the dataset's mean has dropped by `good - bad`: "long prompts answered wrongly
after the drift". A run of a sample is a Bernoulli draw of its rate at the commit's side.

  gate      vllm-ascend's tools/bisect rule (tools/bisect/verdict.py, auto_bisect.py): one run of
            the whole dataset per step, PASS when the score is within baseline +- threshold
            (baseline: the good side's mean; threshold: the nightly's 10 points, or half the drop
            when the drop is smaller, the most favourable line for this method), a FAIL re-run
            once and SKIP when the re-run passes; bisect_npu's exact search (git bisect's rule)
  full      our statistics, the whole dataset every step: the real accuracy oracle
            (bisect_npu.oracle.accuracy) and the likelihood search (bisect_npu.search)
  focused   the same with focusing: candidates run the samples the ends disagree on, most telling
            first, in batches growing from focus.batch, plus a control set when it is large enough
            to flag anything (the real round_plan)
  earlier   focused, with the ends' results handed over from the runs the user already made
            (`accuracy.earlier_results`: a free draw of the whole dataset at each end with the
            scenario's repeats, the user's own evaluation); each end re-runs only its control share
            (10%, at least 5 samples, in the real control_stages: the second only when a sample of
            the first differs) and keeps the earlier results when the real control_standing check
            passes (else it runs the whole dataset, counted), judged as the session does; the
            session's rounds may repeat less than the earlier evaluation did

Samples counted are sample runs (generations), ends included; harness runs are rounds (one
harness run, and on a real host one engine start, each). Seeds: the cases of seeds 1000-1199
(the 30-sample scenarios) and 1000-1029 (the 500-sample ones) were used to choose the
per-scenario repeats (1, 2, 4 tried), the repeats with earlier results (1, 2, 4; the 30-sample
sampled scenario) and focus.batch (1, 2, 4, 8); focus.growth (1, 1.5, 2), focus.batch (1, 2) and
repeats (2, 4) with earlier results (the 30-sample sampled scenario) on seeds 7000-7199; the
steering bound (stats.STEER_ERROR, 0.04-0.16) and its correlation floor (STEER_MIN_RHO) on seeds
7000-7399 and, for the calibration kinds, 1000-1199; the answer's extra steps (search.likelihood.
ANSWER_MAX_STEPS, 4-6) and the control's first stage (2 or 3 samples) on seeds 7000-7399 and
8000-8799; the figures are reported on seeds 1.. (--seed)
and 5000.., which tuning never saw. Everything else is the recipe defaults (confidence 0.99,
max_rounds 3, focus growth 2, control 5%, min_discordant 4).

`--calibration` prints another table: histories of every kind sampled answers come in (every
answer a fresh draw, intraclass correlation 0.2 with every sample's rate scaled down, 0.5 and
0.95 with a broken subset, greedy), 200 samples falling 82% -> 70% over 48 commits as a session
runs them (focused, 4 repeats; greedy 1), counting beside the runs how often a wrong culprit is
named: what a session reports with exit 0; beside it the wrong ones the answers' own posteriors
expect (the sum of 1 - posterior), the chance calibration alone reaches the count seen, the
answers with no single culprit and among them the best guesses below the confidence (exit 3: the
range that holds it, the commit leaned to named inside; how many were right), and the answers
binned by posterior (bench/reliability.py). Seeds 1000.. for tuning, 1.. for the figures.
`--icc` (with `--samples`, `--scores`, `--repeats`, `--shape`) runs one kind of your own in its
place: the calibration sweep's kinds the table does not hold.

    .venv/bin/python bench/accuracy_bench.py              # 200 cases per scenario (a few minutes)
    .venv/bin/python bench/accuracy_bench.py --calibration --runs 200   # the calibration table
    .venv/bin/python bench/accuracy_bench.py --where --seed 7000 --runs 100 --scenarios "aime-30 t=0.6"  # its runs
    .venv/bin/python bench/accuracy_bench.py --calibration --icc 0.3 --samples 100 --scores 0.82 0.74 --seed 1000
    .venv/bin/python bench/accuracy_bench.py --runs 20    # a smoke test
    .venv/bin/python bench/accuracy_bench.py --seed 1000 --runs 200 --scenarios aime-30  # their tuning split
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from reliability import Reliability, p_label, reliability, table_header, table_row

from bisect_npu.observations import Observation, SampleOutcome, VerdictKind
from bisect_npu.oracle.accuracy.focus import round_plan
from bisect_npu.oracle.accuracy.judge import Role, judge_accuracy
from bisect_npu.oracle.accuracy.judged import JudgedCandidates
from bisect_npu.oracle.accuracy.stats import JointPrior, fit_joint, step_bound
from bisect_npu.oracle.config import AccuracyConfig, FocusConfig
from bisect_npu.orchestration.opening.state import accuracy_weight
from bisect_npu.orchestration.running.earlier_results import control_stages, control_standing
from bisect_npu.recipe.schema import AccuracySpec, CommandHarnessSpec, SamplingSpec
from bisect_npu.records import StepRecord
from bisect_npu.search import Evidence, Found, Narrowed, Next, SearchProblem, Weight, decide


@dataclass(frozen=True)
class Scenario:
    name: str
    samples: int
    good: float
    bad: float
    rho: float
    repeats: int  # our methods: runs of every sample per round; the user's own evaluation of the ends too
    batch: int = 8  # focus.batch
    repeats_with_earlier: int = 0  # the recipe's repeats when the ends' results are handed over (0: `repeats`)
    growth_with_earlier: float = 0.0  # focus.growth when the ends' results are handed over (0: the default)
    batch_with_earlier: int = 0  # focus.batch when the ends' results are handed over (0: `batch`)
    n: int = 128
    drop: str = "subset"  # subset: the culprit breaks some samples; scaled: every sample's rate falls alike


SCENARIOS = (
    Scenario("aime-30 greedy", 30, 0.80, 0.67, 0.95, 1, batch=2),
    Scenario("aime-30 t=0.6", 30, 0.80, 0.67, 0.5, 4, batch=2, repeats_with_earlier=2, growth_with_earlier=1.0,
             batch_with_earlier=1),
    Scenario("math500 greedy", 500, 0.95, 0.92, 0.95, 1),
    Scenario("math500 t=0.6", 500, 0.95, 0.92, 0.5, 2),
)
BROKEN_RATE = 0.05  # a broken sample's rate, as a share of its good rate
NIGHTLY_THRESHOLD = 10.0
CONFIDENCE = 0.99
# How sampled answers may behave (issue: the served histories): 200 samples, 82% -> 70%, 48 commits,
# the ends and each round 4 repeats; one kind per intraclass correlation of a sample's runs.
CALIBRATION = (
    Scenario("fresh draws (ICC 0), scaled drop", 200, 0.82, 0.70, 0.0, 4, n=48, drop="scaled"),
    Scenario("ICC 0.2, scaled drop", 200, 0.82, 0.70, 0.2, 4, n=48, drop="scaled"),
    Scenario("ICC 0.5, subset broken", 200, 0.82, 0.70, 0.5, 4, n=48),
    Scenario("ICC 0.95, subset broken", 200, 0.82, 0.70, 0.95, 4, n=48),
    Scenario("greedy-like (ICC 1), 1 run", 200, 0.82, 0.70, 1.0, 1, n=48),
)
CONTROL_SHARE = 0.1  # accuracy.earlier_results.control_share's default
MAX_DISAGREEMENT = 0.25  # accuracy.earlier_results.max_disagreement's default


@dataclass
class Case:
    culprit: int
    good_rates: np.ndarray
    bad_rates: np.ndarray
    rng: np.random.Generator

    def runs(self, position: int, ids: list[int], repeats: int) -> np.ndarray:
        rates = self.bad_rates if position >= self.culprit else self.good_rates
        return self.rng.binomial(repeats, rates[ids])


def make_case(s: Scenario, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    if s.rho <= 0:  # fresh draws: every sample's rate is the score
        good = np.full(s.samples, s.good)
    elif s.rho >= 1:  # greedy: a sample is always right or always wrong
        good = (rng.random(s.samples) < s.good).astype(float)
    else:
        kappa = 1 / s.rho - 1
        good = rng.beta(s.good * kappa, (1 - s.good) * kappa, s.samples)
    if s.drop == "scaled":
        return Case(int(rng.integers(1, s.n + 1)), good, good * (s.bad / s.good), rng)
    bad = good.copy()
    target = s.samples * (s.good - s.bad)  # the drop in points, whatever this draw's own mean
    for i in rng.permutation(s.samples):
        if (good - bad).sum() >= target:
            break
        bad[i] = good[i] * BROKEN_RATE
    return Case(int(rng.integers(1, s.n + 1)), good, bad, rng)


def outcomes(ids: list[int], counts: np.ndarray, repeats: int) -> list[SampleOutcome]:
    return [SampleOutcome.model_construct(id=str(i), correct=float(k) / repeats, runs=repeats, prompt=None,
                                          output=None, target=None, finish_reason=None)
            for i, k in zip(ids, counts, strict=True)]


def observation(samples: list[SampleOutcome]) -> Observation:
    return Observation.model_construct(samples=samples, case_id="accuracy", trial=0)


@dataclass(frozen=True)
class Outcome:
    """One bisection: whether it named the culprit, its sample runs and its harness runs (rounds)."""

    right: bool
    sample_runs: int
    harness_runs: int
    wrong: bool = False  # another commit named as the culprit: what a session ends with exit 0
    posterior: float | None = None  # the posterior a culprit was named at (exit 0); None when none was
    named: int | None = None  # the commit named
    guess: bool | None = None  # below the confidence asked (exit 3): whether the best guess named inside was right


def run_gate(s: Scenario, case: Case) -> Outcome:
    """vllm-ascend's rule with git bisect's search: full evaluation, baseline +- threshold, re-run a FAIL."""
    drop = 100 * (s.good - s.bad)
    threshold = NIGHTLY_THRESHOLD if drop > NIGHTLY_THRESHOLD else drop / 2
    everything = list(range(s.samples))
    spent = runs = 0

    def verdict(position: int) -> str:
        nonlocal spent, runs
        for attempt in range(2):
            spent += s.samples
            runs += 1
            score = 100 * case.runs(position, everything, 1).mean()
            if abs(score - 100 * s.good) <= threshold:
                return "good" if attempt == 0 else "skip"
        return "bad"

    right = _bisect(s.n, SearchProblem(n=s.n, mode="exact"), verdict, case.culprit)
    return Outcome(right, spent, runs)


def _bisect(n: int, problem: SearchProblem, verdict: Callable[[int], str], culprit: int) -> bool:
    evidence: dict[int, Evidence] = {}
    for _ in range(4 * n):
        decision = decide(problem, evidence)
        if not isinstance(decision, Next):
            return isinstance(decision, Found) and decision.index == culprit
        for query in decision.queries:
            evidence[query.index] = evidence.get(query.index, Evidence()).add(verdict(query.index))  # type: ignore[arg-type]
    return False


@dataclass(frozen=True)
class StepTrace:
    """One step of a bisection: its role, the samples of each round it ran, and why it stopped."""

    role: str
    rounds: tuple[int, ...]
    stopped: str  # "clear", "plan ended" (forced to the likelier side), or "earlier results" (an end)
    position: int = -1  # the commit it judged (-1: not recorded)
    log_lr: float = 0.0  # the ratio the step handed the search (bad side over good side)
    prior: JointPrior | None = None  # the ends' fit the step was judged against (candidates)
    figures: dict[str, Any] = field(default_factory=dict)  # its last verdict's figures
    ends: tuple[list[Observation], list[Observation]] | None = None  # the ends' rounds it was judged against


def run_ours(s: Scenario, case: Case, focused: bool, cfg: AccuracyConfig, earlier: bool = False,
             trace: list[StepTrace] | None = None) -> Outcome:
    """Our oracle and the likelihood search; each step runs rounds until its verdict is clear, the
    bad end's running the good end's next round first where its verdict asks (as `AccuracySteps.step`).
    `earlier`: the ends' whole-dataset results come from runs made before (not counted), and each
    end runs its control share (`cfg.repeats` runs a round; the earlier results hold the
    scenario's `repeats`). `trace` collects every step's rounds."""
    everything = list(range(s.samples))
    ends: dict[str, list[Observation]] = {}
    ran: dict[int, set[str]] = {}  # the samples each candidate's steps ran (a step asked again runs others)
    judged = JudgedCandidates()  # as AccuracySteps: each candidate's runs and side, conditioning the others'
    repeats = cfg.repeats
    spent = harness_runs = 0

    weigh = accuracy_weight(CONFIDENCE, s.n, find_fix=False)

    def step(position: int) -> tuple[VerdictKind, Weight]:
        nonlocal spent, harness_runs
        role: Role = "good_end" if position == 0 else "bad_end" if position == s.n else "candidate"
        plan: list[list[str] | None] = [None] * cfg.max_rounds
        if role == "candidate" and focused:
            plan = round_plan(cfg, _pooled(ends["good"]), _pooled(ends["bad"]), str(position),
                              ran.get(position, set()))
        seen = ran.setdefault(position, set())
        conditioned = judged.runs_for(position) if role == "candidate" else None
        rounds: list[Observation] = []
        sizes: list[int] = []
        stopped = "earlier results"
        if earlier and role != "candidate":
            given = observation(outcomes(everything, case.runs(position, everything, s.repeats), s.repeats))
            control: list[SampleOutcome] = []
            stands: bool | None = None
            stages = control_stages([str(i) for i in everything], CONTROL_SHARE, str(position))
            for number, stage in enumerate(stages):
                ids = [int(i) for i in stage]
                spent += len(ids) * repeats
                harness_runs += 1
                sizes.append(len(ids))
                control += outcomes(ids, case.runs(position, ids, repeats), repeats)
                stands = control_standing(given.samples or [], control, MAX_DISAGREEMENT,
                                          complete=number == len(stages) - 1)
                if stands is not None:
                    break
            if stands:  # else set aside: the end runs the whole dataset
                rounds = [given, observation(control)]
                v = judge_accuracy(cfg, rounds, ends.get("good"), ends.get("bad"), role=role, final=True)
                plan = []
        for number, chosen in enumerate(plan):
            ids = everything if chosen is None else [int(i) for i in chosen]
            spent += len(ids) * repeats
            harness_runs += 1
            rounds.append(observation(outcomes(ids, case.runs(position, ids, repeats), repeats)))
            sizes.append(len(ids))
            seen.update(str(i) for i in ids)
            v = judge_accuracy(cfg, rounds, ends.get("good"), ends.get("bad"), role=role,
                               final=number == len(plan) - 1, judged=conditioned)
            while role == "bad_end" and v.figures.get("good_end_again"):
                # as AccuracySteps.step: the good end's next round (the whole dataset, pooled onto
                # its rounds), then the bad end's rounds so far judged again
                spent += s.samples * repeats
                harness_runs += 1
                ends["good"] = [*ends["good"], observation(outcomes(everything, case.runs(0, everything, repeats),
                                                                   repeats))]
                if trace is not None:
                    trace.append(StepTrace("good_end", (s.samples,), "asked by the bad end"))
                v = judge_accuracy(cfg, rounds, ends.get("good"), ends.get("bad"), role=role,
                                   final=number == len(plan) - 1)
            stopped = v.figures.get("stopped", "clear")
            if not v.figures.get("more_rounds"):
                break
        if trace is not None:
            prior = (fit_joint(_pooled(ends["good"]), _pooled(ends["bad"]), cfg.greedy)
                     if role == "candidate" else None)
            trace.append(StepTrace(role, tuple(sizes), stopped, position,
                                   float(v.figures.get("log_likelihood_ratio", 0.0)), prior, dict(v.figures),
                                   (ends["good"], ends["bad"]) if role == "candidate" else None))
        if role == "good_end":  # its rounds kept apart: the bad end's step counts them
            ends["good"] = rounds
        if role == "bad_end":
            ends["bad"] = [observation(_pooled(rounds))]
        if role == "candidate" and rounds:
            judged.record(position, v, _pooled(rounds))
        return v.kind, weigh(StepRecord.model_construct(index=position, commit=str(position), verdict=v))

    problem = SearchProblem(n=s.n, mode="likelihood", confidence=CONFIDENCE, answer_log_lr=step_bound(cfg.confidence))
    evidence: dict[int, Evidence] = {}
    for _ in range(4 * s.n):
        decision = decide(problem, evidence)
        if not isinstance(decision, Next):
            found = decision if isinstance(decision, Found) else None
            right = found is not None and found.index == case.culprit
            guess = decision.figures.get("best_guess") if isinstance(decision, Narrowed) else None
            return Outcome(right, spent, harness_runs, found is not None and not right,
                           found.confidence if found is not None else None, found.index if found is not None else None,
                           None if guess is None else guess == case.culprit)
        for query in decision.queries:
            kind, weight = step(query.index)
            evidence[query.index] = evidence.get(query.index, Evidence()).add(kind.value).weigh(weight)  # type: ignore[arg-type]
    return Outcome(False, spent, harness_runs)


def _pooled(rounds: list[Observation]) -> list[SampleOutcome]:
    from bisect_npu.oracle.accuracy.stats import pool

    return pool(*(r.samples or [] for r in rounds))


def accuracy_config(s: Scenario, earlier: bool = False) -> AccuracyConfig:
    """The recipe defaults, but for the scenario's repeats, focus.batch and (with the ends'
    results handed over) their own repeats, focus.batch and focus.growth."""
    repeats = s.repeats_with_earlier or s.repeats if earlier else s.repeats
    batch = s.batch_with_earlier or s.batch if earlier else s.batch
    focus = FocusConfig(batch=batch)
    if earlier and s.growth_with_earlier:
        focus = FocusConfig(batch=batch, growth=s.growth_with_earlier)
    if s.rho >= 1:  # greedy-like: answered at temperature 0, as the recipe's sampling tells the oracle
        return AccuracySpec(harness="command", dataset="bench", command=CommandHarnessSpec(argv=["bench"]),
                            sampling=SamplingSpec(temperature=0.0), repeats=repeats, confidence=CONFIDENCE, focus=focus)
    return AccuracyConfig(repeats=repeats, confidence=CONFIDENCE, focus=focus)


def calibration(runs: int, first_seed: int, only: str, kinds: tuple[Scenario, ...] = CALIBRATION) -> None:
    """Each kind of sampled history, the way a session runs it (focused): right, wrong culprits
    named (a session's exit 0: a culprit as sure as the confidence asked), the wrong ones the
    answers' own posteriors expect, no culprit (a range: among them the best guesses below the
    confidence, exit 3, and how many of those were right), and the cost; then the answers binned by
    posterior."""
    print(f"{runs} histories per kind, seeds {first_seed}..{first_seed + runs - 1}, confidence {CONFIDENCE}")
    print("| kind | right | wrong culprit named (exit 0) | expected wrong (sum of 1 - posterior) | "
          "P(wrong >= seen) | no single culprit | of which best guesses (right) | sample runs (mean) | "
          "harness runs (mean) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    seeds: list[str] = []
    rows: list[tuple[str, Reliability]] = []
    for s in kinds:
        if only not in s.name:
            continue
        cfg = accuracy_config(s)
        got = [run_ours(s, make_case(s, first_seed + k), True, cfg) for k in range(runs)]
        right, wrong = sum(g.right for g in got), sum(g.wrong for g in got)
        named = reliability((g.posterior, g.wrong) for g in got if g.posterior is not None)
        rows.append((s.name, named))
        print(f"| {s.name}, {s.samples} samples, {100 * s.good:.0f}% -> {100 * s.bad:.0f}%, repeats {s.repeats} | "
              f"{right / runs:.1%} | {wrong} ({wrong / runs:.1%}) | {named.expected:.2f} | {p_label(named.p_value)} | "
              f"{runs - right - wrong} | "
              f"{sum(g.guess is not None for g in got)} ({sum(g.guess is True for g in got)}) | "
              f"{np.mean([g.sample_runs for g in got]):,.0f} | {np.mean([g.harness_runs for g in got]):.1f} |")
        if wrong:
            seeds.append(f"{s.name}: wrong culprits at seeds "
                         f"{', '.join(f'{first_seed + k} ({g.posterior:.4f})' for k, g in enumerate(got) if g.wrong)}")
    for line in seeds:
        print(line)
    if not rows:
        return
    print("\nculprits named (exit 0) by the posterior they were named at: answers / wrong / wrong expected")
    for line in table_header(rows[0][1]):
        print(line)
    for name, named in rows:
        print(table_row(name, named))
    if len(rows) > 1:
        pooled = rows[0][1]
        for _, named in rows[1:]:
            pooled = pooled + named
        print(table_row("pooled", pooled))


def where(runs: int, first_seed: int, only: str) -> None:
    """Where the earlier-ends method's sample runs go: the ends, candidates' first rounds and
    their later ones; how many rounds a candidate step took and why it stopped."""
    print(f"earlier ends, {runs} cases per scenario, seeds {first_seed}..{first_seed + runs - 1}")
    print("| scenario | sample runs: mean (median, p90) | ends | candidates' first rounds | their later rounds | "
          "candidate steps | stopped after round 1 / 2 / 3 / 4+ | forced (plan ended) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in SCENARIOS:
        if only not in s.name:
            continue
        cfg = accuracy_config(s, earlier=True)
        totals, steps = [], []
        for k in range(runs):
            trace: list[StepTrace] = []
            totals.append(run_ours(s, make_case(s, first_seed + k), True, cfg, earlier=True, trace=trace).sample_runs)
            steps += trace
        candidates = [t for t in steps if t.role == "candidate"]
        ends = sum(sum(t.rounds) for t in steps if t.role != "candidate") * cfg.repeats / runs
        first = sum(t.rounds[0] for t in candidates) * cfg.repeats / runs
        later = sum(sum(t.rounds[1:]) for t in candidates) * cfg.repeats / runs
        after = [sum(len(t.rounds) == r for t in candidates) for r in (1, 2, 3)]
        after.append(len(candidates) - sum(after))
        forced = sum(t.stopped == "plan ended" for t in candidates)
        print(f"| {s.name}, repeats {cfg.repeats}, batch {cfg.focus.batch}, growth {cfg.focus.growth:g} | "
              f"{np.mean(totals):,.0f} ({np.median(totals):,.0f}, {np.percentile(totals, 90):,.0f}) | "
              f"{ends:,.0f} | {first:,.0f} | {later:,.0f} | "
              f"{len(candidates) / runs:.1f} | {' / '.join(f'{n / len(candidates):.0%}' for n in after)} | "
              f"{forced / len(candidates):.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", action="store_true",
                        help="the calibration table: wrong culprits named over every kind of sampled history")
    parser.add_argument("--where", action="store_true",
                        help="where the earlier-ends method's sample runs go: ends, first rounds, later rounds")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1, help="first seed of the reporting split")
    parser.add_argument("--scenarios", default="", help="only the scenarios whose name contains this (e.g. aime-30)")
    own = parser.add_argument_group("--calibration with a kind of your own (the sweep's kinds)")
    own.add_argument("--icc", type=float, default=None,
                     help="run one kind in the table's place: a sample's intraclass correlation (0: every answer "
                          "a fresh draw, 1: greedy-like)")
    own.add_argument("--samples", type=int, default=200, help="the dataset's samples [200]")
    own.add_argument("--scores", type=float, nargs=2, default=(0.82, 0.70), metavar=("GOOD", "BAD"),
                     help="the dataset's score at the good and the bad side [0.82 0.70]")
    own.add_argument("--repeats", type=int, default=4, help="runs of every sample a round [4]")
    own.add_argument("--shape", choices=("subset", "scaled"), default="subset",
                     help="the drop: a subset of samples broken, or every sample's rate scaled down [subset]")
    own.add_argument("--commits", type=int, default=48, help="the history's commits [48]")
    args = parser.parse_args()
    started = time.monotonic()
    if args.calibration:
        kinds = CALIBRATION if args.icc is None else (
            Scenario(f"ICC {args.icc:g}, {args.shape}", args.samples, args.scores[0], args.scores[1], args.icc,
                     args.repeats, n=args.commits, drop=args.shape),)
        calibration(args.runs, args.seed, args.scenarios, kinds)
        print(f"{time.monotonic() - started:.0f} s")
        return
    if args.where:
        where(args.runs, args.seed, args.scenarios)
        print(f"{time.monotonic() - started:.0f} s")
        return
    print(f"{args.runs} cases per scenario, seeds {args.seed}..{args.seed + args.runs - 1}, N = {SCENARIOS[0].n}, "
          f"confidence {CONFIDENCE}")
    print("| scenario | method | right | sample runs per bisection (mean) | vs gate | harness runs (mean) |")
    print("|---|---|---:|---:|---:|---:|")
    for s in SCENARIOS:
        if args.scenarios not in s.name:
            continue
        results: dict[str, tuple[float, float, float, int]] = {}
        for method in ("gate", "full", "focused", "earlier"):
            cfg = accuracy_config(s, earlier=method == "earlier")
            right = spent = rounds = 0
            for k in range(args.runs):
                case = make_case(s, args.seed + k)
                got = (run_gate(s, case) if method == "gate" else
                       run_ours(s, case, method != "full", cfg, earlier=method == "earlier"))
                right += got.right
                spent += got.sample_runs
                rounds += got.harness_runs
            results[method] = (right / args.runs, spent / args.runs, rounds / args.runs,
                               1 if method == "gate" else cfg.repeats)
        for method, (rate, mean, rounds_mean, repeats) in results.items():
            share = mean / results["gate"][1]
            print(f"| {s.name} ({s.samples} samples, {100 * s.good:.0f}% -> {100 * s.bad:.0f}%, "
                  f"repeats {repeats}) | {method} | {100 * rate:.1f}% | {mean:,.0f} | {share:.2f} | "
                  f"{rounds_mean:.1f} |")
    print(f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
