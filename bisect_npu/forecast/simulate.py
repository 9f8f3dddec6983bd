"""Replaying the real search against a synthetic oracle: expected runs, builds and hours.

The same ``decide`` a session calls is driven here by a seeded random oracle: a trial at a
position at or after the culprit fails with the bad rate, before it with the good rate, and a
candidate's build fails (the position is skipped) with the build-fail rate. The ends never fail
to build: the user has run them already to know that one is good and the other bad. The first
commit tested with a build key costs a full build (``Minutes.build``), other commits with that
key an overlay (``Minutes.overlay``), a commit tested before nothing. Each query starts the
engine once (``Minutes.load``) and then runs its trials (``Minutes.run`` each).

A throughput regression (`Throughput`) is replayed as a session runs it instead, each run's
throughput drawn about the side's mean. In levels mode (a throughput recipe's default,
`oracle.throughput.search: levels`) every step is one run, an engine start and the run, where the
levels search asks it, and the search weighs every run together. Per step (`search: per_step`)
the good end runs first, every step's trials stop when its verdict is sure by the rule the
evaluator applies (oracle/sequential.py), and the likelihood search weighs each step's ratio; a
trial after the first batch of a step starts its engine.

Used by `bisect-npu simulate` (planning on a real history) and by bench/noisy_bench.py.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from bisect_npu.defaults import CONFIDENCE
from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.sequential import judge_sequential, pooled_spread, throughputs, trials_wanted
from bisect_npu.oracle.throughput import ThroughputConfig, reference_trials
from bisect_npu.search import (
    Decision,
    EarlierRuns,
    EndsWrong,
    Evidence,
    Found,
    Narrowed,
    Next,
    Outcome,
    SearchProblem,
    Weight,
    decide,
    group_ids,
)


@dataclass(frozen=True)
class Minutes:
    """What each action of a simulated bisection costs, in minutes: one value, so the search's
    told costs, the wall clock and the summary's machine hours read the same figures."""

    build: float = 30.0
    run: float = 5.0
    load: float = 0.0
    overlay: float = 0.0


@dataclass(frozen=True)
class Throughput:
    """A throughput regression to forecast: `drop` and `spread` (one run's standard deviation) as
    shares of the good side's mean, the recipe's `threshold`, a step's most trials (`trials`,
    the recipe's trials.count) and the good end's (`reference_trials`; None: the oracle's default),
    the session's search (`search`: the recipe's `oracle.throughput.search`), and the published
    baseline the levels search takes as a prior (`baseline`, a share of the good side's mean: 1.0
    when it holds; None: the recipe publishes none), and whether the failing nightly's throughput
    is given (`nightly_result`: `oracle.throughput.earlier_runs.bad`, one run of the bad side drawn
    per bisection on the baseline's host, forecast as if that host is the session's)."""

    drop: float
    spread: float = 0.02
    threshold: float = 0.97
    trials: int = 5
    reference_trials: int | None = None
    search: Literal["levels", "per_step"] = "levels"
    baseline: float | None = None
    nightly_result: bool = False


@dataclass(frozen=True)
class RunOutcome:
    """One simulated bisection."""

    answer: Decision
    trials: int
    rounds: int
    builds: int
    overlays: int
    loads: int
    wall_minutes: float
    culprit: int

    @property
    def correct(self) -> bool:
        return isinstance(self.answer, Found) and self.answer.index == self.culprit


@dataclass(frozen=True)
class SimulationSummary:
    """Figures over many simulated bisections of one range."""

    runs: int
    accuracy: float
    narrowed: float
    ends_wrong: float
    mean_trials: float
    p95_trials: float
    max_trials: int
    mean_rounds: float
    mean_builds: float
    mean_overlays: float
    mean_loads: float
    mean_machine_hours: float
    mean_wall_hours: float



@dataclass
class _BuildBook:
    """What a simulated session has built: the cost of readying a position (a full build, an
    overlay of a built key, nothing when asked before) and whether it builds (drawn once)."""

    build_key_of: Callable[[int], str]
    costs: Minutes
    build_fail: float
    rng: np.random.Generator
    build_ok: dict[int, bool]
    builds: set[str] = field(default_factory=set)
    overlays: int = 0

    def ready(self, i: int, asked_before: bool) -> tuple[float, bool]:
        """Position i's readying cost and whether it built."""
        key = self.build_key_of(i)
        cost = 0.0 if asked_before else self.costs.overlay if key in self.builds else self.costs.build
        self.overlays += not asked_before and key in self.builds
        self.builds.add(key)
        if i not in self.build_ok:
            self.build_ok[i] = bool(self.rng.random() >= self.build_fail)
        return cost, self.build_ok[i]


def _build_or_skip(i: int, evidence: dict[int, Evidence], book: _BuildBook,
                   unbuildable: Collection[int]) -> tuple[float, bool]:
    """Position i's build minutes and whether it built; one that did not (or cannot) is a skip in
    its evidence, as a session records it."""
    cost, built = (0.0, False) if i in unbuildable else book.ready(i, i in evidence)
    if not built:
        evidence[i] = evidence.get(i, Evidence()).add("skip")
    return cost, built


def simulate_one(
    problem: SearchProblem,
    culprit: int,
    *,
    bad_rate: float,
    good_rate: float,
    build_fail: float,
    rng: np.random.Generator,
    build_key_of: Callable[[int], str],
    costs: Minutes = Minutes(),
    max_rounds: int = 100_000,
    earlier_runs: int = 0,
    unbuildable: Collection[int] = (),
) -> RunOutcome:
    """One bisection: ask ``decide``, run what it asks with the synthetic oracle, repeat.

    ``unbuildable`` positions always fail to build, at once and at no cost (a candidate without
    the Dockerfile the images are built from), so the search steps around them.

    ``earlier_runs`` > 0: each end was run that often before the session (drawn here from the
    true rates, so the search gets honest counts, not the rates) and the problem says so.
    """
    if earlier_runs:
        bad_failed = int((rng.random(earlier_runs) < bad_rate).sum())
        good_failed = int((rng.random(earlier_runs) < good_rate).sum())
        problem = replace(problem, earlier_runs=EarlierRuns(bad_failed, earlier_runs, good_failed, earlier_runs))
    evidence: dict[int, Evidence] = {}
    known = {**{i: False for i in unbuildable}, 0: True, problem.n: True}
    book = _BuildBook(build_key_of, costs, build_fail, rng, known)
    trials = rounds = loads = 0
    wall = 0.0
    for _ in range(max_rounds):
        decision = decide(problem, evidence)
        if not isinstance(decision, Next):
            return RunOutcome(decision, trials, rounds, len(book.builds), book.overlays, loads, wall, culprit)
        rounds += 1
        slowest = 0.0
        for query in decision.queries:
            i = query.index
            cost, built = _build_or_skip(i, evidence, book, unbuildable)
            if not built:
                slowest = max(slowest, cost)
                continue
            rate = bad_rate if i >= culprit else good_rate
            failures = int((rng.random(query.trials) < rate).sum())
            ev = evidence.get(i, Evidence())
            evidence[i] = Evidence(ev.good + query.trials - failures, ev.bad + failures, ev.skipped)
            trials += query.trials
            loads += 1
            slowest = max(slowest, cost + costs.load + query.trials * costs.run)
        wall += slowest
    raise RuntimeError(f"the search did not finish within {max_rounds} rounds")


def simulate_throughput_one(
    problem: SearchProblem,
    culprit: int,
    regression: Throughput,
    *,
    build_fail: float,
    rng: np.random.Generator,
    build_key_of: Callable[[int], str],
    costs: Minutes = Minutes(),
    max_rounds: int = 100_000,
    unbuildable: Collection[int] = (),
) -> RunOutcome:
    """One session against a throughput regression (see the module's docstring): `trials` counts
    every run, the good end's included."""
    cfg = ThroughputConfig(threshold=regression.threshold, reference="good_end",
                           reference_trials=regression.reference_trials)
    evidence: dict[int, Evidence] = {}
    known = {**{i: False for i in unbuildable}, 0: True, problem.n: True}
    book = _BuildBook(build_key_of, costs, build_fail, rng, known)
    trials = rounds = loads = 0
    wall = 0.0
    reference: list[Observation] = []
    bad_end: list[Observation] = []  # the bad end's runs: where the bad side sits
    runs_at: dict[int, list[float]] = {}  # every position's runs so far: the session's pooled spread

    def step(i: int) -> tuple[list[Observation], Outcome, Weight, int]:
        """Position i's runs until its step stops: (its runs, its verdict, its weight as a session
        weighs it (its ratio and node terms over the ends' error; 0 at the good end), its engine starts)."""
        mean = 1.0 - regression.drop if i >= culprit else 1.0
        cap = reference_trials(cfg, regression.trials) if i == 0 else regression.trials
        runs: list[Observation] = []
        starts = 0
        against = bad_end if i != problem.n else []  # the bad end is judged by the line alone
        others = pooled_spread(runs_at.values())
        while wanted := trials_wanted(cfg, runs, None if i == 0 else reference, len(runs), cap, i == 0, against,
                                      others):
            starts += 1
            runs += [Observation(case_id="perf", extra={"output_token_throughput": float(v)})
                     for v in rng.normal(mean, regression.spread, wanted)]
        runs_at.setdefault(i, []).extend(throughputs(runs))
        if i == 0:
            return runs, "good", Weight(0.0), starts
        verdict = judge_sequential(cfg, runs, reference, len(runs), cap, against, others)[0]
        if i == problem.n:
            bad_end[:] = runs
        kind: Outcome = "skip" if verdict.kind == VerdictKind.SKIP else verdict.kind.value  # type: ignore[assignment]
        nodes = verdict.figures.get("ends_error_nodes") or {"good": [], "bad": []}
        ratio = float(verdict.figures.get("log_likelihood_ratio", 0.0))
        weight = Weight(ratio, tuple(nodes["good"]), tuple(nodes["bad"]))
        return runs, kind, weight, starts

    queue: list[int] = [0]  # the good end first: its mean is every step's line
    for _ in range(max_rounds):
        if not queue:
            decision = decide(problem, evidence)
            if not isinstance(decision, Next):
                return RunOutcome(decision, trials, rounds, len(book.builds), book.overlays, loads, wall, culprit)
            queue = [q.index for q in decision.queries]
        rounds += 1
        slowest = 0.0
        for i in queue:
            cost, built = _build_or_skip(i, evidence, book, unbuildable)
            if not built:
                slowest = max(slowest, cost)
                continue
            runs, kind, weight, starts = step(i)
            if i == 0:
                reference = runs
            evidence[i] = evidence.get(i, Evidence()).add(kind).weigh(weight)
            trials += len(runs)
            loads += starts
            slowest = max(slowest, cost + starts * costs.load + len(runs) * costs.run)
        queue = []
        wall += slowest
    raise RuntimeError(f"the search did not finish within {max_rounds} rounds")


def simulate_levels_one(
    problem: SearchProblem,
    culprit: int,
    regression: Throughput,
    *,
    build_fail: float,
    rng: np.random.Generator,
    build_key_of: Callable[[int], str],
    costs: Minutes = Minutes(),
    max_rounds: int = 100_000,
    unbuildable: Collection[int] = (),
) -> RunOutcome:
    """One levels-mode session against a throughput regression: each query one run (an engine start
    and the run) at the position the search asks, its value the search's evidence; the failing
    nightly's throughput, where given, one draw of the bad side."""
    if regression.nightly_result:
        problem = replace(problem, earlier_levels=((), (float(rng.normal(1 - regression.drop, regression.spread)),)))
    evidence: dict[int, Evidence] = {}
    known = {**{i: False for i in unbuildable}, 0: True, problem.n: True}
    book = _BuildBook(build_key_of, costs, build_fail, rng, known)
    trials = rounds = 0
    wall = 0.0
    for _ in range(max_rounds):
        decision = decide(problem, evidence)
        if not isinstance(decision, Next):
            return RunOutcome(decision, trials, rounds, len(book.builds), book.overlays, trials, wall, culprit)
        rounds += 1
        slowest = 0.0
        for query in decision.queries:
            i = query.index
            cost, built = _build_or_skip(i, evidence, book, unbuildable)
            if not built:
                slowest = max(slowest, cost)
                continue
            value = float(rng.normal(1.0 - regression.drop if i >= culprit else 1.0, regression.spread))
            side: Outcome = "bad" if value < regression.threshold else "good"
            evidence[i] = evidence.get(i, Evidence()).add(side).measure((value,))
            trials += 1
            slowest = max(slowest, cost + costs.load + costs.run)
        wall += slowest
    raise RuntimeError(f"the search did not finish within {max_rounds} rounds")


def simulate(
    n: int,
    culprit: int | Sequence[int],
    *,
    bad_rate: float,
    good_rate: float,
    build_fail: float = 0.0,
    slots: int = 1,
    mode: Literal["exact", "noisy"] = "noisy",
    runs: int = 200,
    seed: int = 0,
    build_key_of: Callable[[int], str] | None = None,
    costs: Minutes = Minutes(),
    confidence: float = CONFIDENCE,
    earlier_runs: int = 0,
    tell_build_groups: bool = True,
    on_run: Callable[[int, int], None] | None = None,
    unbuildable: Collection[int] = (),
    throughput: Throughput | None = None,
) -> SimulationSummary:
    """Summary of ``runs`` seeded bisections of positions 0..n with the culprit at ``culprit``
    (``runs`` per culprit when several are given: a planning figure over where it might be).

    ``build_key_of`` maps a position to its build key (positions sharing a key share one
    build); by default every position is its own build. The search is told what an engine
    start, a full build and an overlay cost against its unit (a trial in noisy mode, a step of
    one trial in exact mode), as a session measures them, and, with ``build_key_of`` and
    ``tell_build_groups``, which positions share a build (as a session with a keyed builder).
    ``on_run(done, total)`` is called after each bisection (progress for long simulations).
    ``unbuildable`` candidates (1..n-1) fail to build, as a candidate without the Dockerfile does.
    ``throughput``: a throughput regression instead of the rates, in the search its session runs
    (levels mode, or per step in the likelihood search).
    """
    culprits = [culprit] if isinstance(culprit, int) else list(culprit)
    wrong = [c for c in culprits if not 1 <= c <= n]
    if wrong or not culprits:
        raise ValueError(f"a culprit must be one of the candidates 1..{n}, got {wrong or 'none'}")
    if any(not 0 < i < n for i in unbuildable):
        raise ValueError(f"only candidates strictly between the ends can be unbuildable, got {sorted(unbuildable)}")
    unit = costs.run + (costs.load if mode == "exact" else 0.0)
    per_unit = unit if unit > 0 else float("inf")
    key_of = build_key_of or str
    groups = group_ids([key_of(i) for i in range(n + 1)]) if build_key_of and tell_build_groups else None
    problem = SearchProblem(n=n, mode=mode, slots=slots, confidence=confidence,
                            load_cost=costs.load / per_unit if mode == "noisy" else 0.0,
                            build_cost=costs.build / per_unit, build_groups=groups,
                            overlay_cost=costs.overlay / per_unit if groups else 0.0)
    rng = np.random.default_rng(seed)
    total = len(culprits) * runs
    outcomes: list[RunOutcome] = []
    levels = throughput is not None and throughput.search == "levels"
    if throughput is not None:
        # A step's unit is one step (a session measures step seconds): its engine start and at most
        # its trials' runs (one in levels mode). Costs are told as a session tells them: a full build
        # in levels mode (it may run a built commit again instead) or with the groups, an overlay with them.
        per_step = costs.load + (1 if levels else throughput.trials) * costs.run or float("inf")
        problem = SearchProblem(n=n, mode="levels" if levels else "likelihood", slots=slots, confidence=confidence,
                                build_cost=costs.build / per_step if groups or levels else 0.0, build_groups=groups,
                                overlay_cost=costs.overlay / per_step if groups else 0.0,
                                threshold=throughput.threshold, baseline=throughput.baseline if levels else None)
    for position in (p for p in culprits for _ in range(runs)):
        if throughput is not None:
            one = simulate_levels_one if levels else simulate_throughput_one
            outcomes.append(one(problem, position, throughput, build_fail=build_fail, rng=rng, build_key_of=key_of,
                                costs=costs, unbuildable=frozenset(unbuildable)))
            if on_run is not None:
                on_run(len(outcomes), total)
            continue
        outcomes.append(simulate_one(
            problem,
            position,
            bad_rate=bad_rate,
            good_rate=good_rate,
            build_fail=build_fail,
            rng=rng,
            build_key_of=key_of,
            costs=costs,
            earlier_runs=earlier_runs,
            unbuildable=frozenset(unbuildable),
        ))
        if on_run is not None:
            on_run(len(outcomes), total)
    return summarise(outcomes, costs)


def summarise(outcomes: list[RunOutcome], costs: Minutes) -> SimulationSummary:
    trials = np.array([o.trials for o in outcomes], dtype=float)
    builds = np.array([o.builds for o in outcomes], dtype=float)
    loads = np.array([o.loads for o in outcomes], dtype=float)
    overlays = np.array([o.overlays for o in outcomes], dtype=float)
    return SimulationSummary(
        runs=len(outcomes),
        accuracy=float(np.mean([o.correct for o in outcomes])),
        narrowed=float(np.mean([isinstance(o.answer, Narrowed) for o in outcomes])),
        ends_wrong=float(np.mean([isinstance(o.answer, EndsWrong) for o in outcomes])),
        mean_trials=float(trials.mean()),
        p95_trials=float(np.percentile(trials, 95)),
        max_trials=int(trials.max()),
        mean_rounds=float(np.mean([o.rounds for o in outcomes])),
        mean_builds=float(builds.mean()),
        mean_overlays=float(overlays.mean()),
        mean_loads=float(loads.mean()),
        mean_machine_hours=float((builds * costs.build + overlays * costs.overlay + loads * costs.load
                                  + trials * costs.run).mean() / 60.0),
        mean_wall_hours=float(np.mean([o.wall_minutes for o in outcomes]) / 60.0),
    )


def describe(summary: SimulationSummary) -> Mapping[str, str]:
    """The summary as labelled, formatted figures (for the CLI table and plain output)."""
    return {
        "runs": str(summary.runs),
        "accuracy": f"{summary.accuracy:.1%}",
        "narrowed (skips)": f"{summary.narrowed:.1%}",
        "ends judged wrong": f"{summary.ends_wrong:.1%}",
        "trials (runs), mean": f"{summary.mean_trials:.1f}",
        "trials (runs), p95": f"{summary.p95_trials:.0f}",
        "rounds, mean": f"{summary.mean_rounds:.1f}",
        "full builds, mean": f"{summary.mean_builds:.1f}",
        "overlays, mean": f"{summary.mean_overlays:.1f}",
        "engine starts, mean": f"{summary.mean_loads:.1f}",
        "machine hours, mean": f"{summary.mean_machine_hours:.1f}",
        "wall-clock hours, mean": f"{summary.mean_wall_hours:.1f}",
    }
