"""vllm-ascend's `tools/bisect` against bisect-npu on the demo-shaped nightly case, simulated.

    .venv/bin/python bench/nightly_bench.py [--seeds 400] [--first-seed 0] [--candidates 39]
        [--rows accuracy throughput] [--drop 0.07] [--spread 0.02] [--scores 0.96 0.88] [--icc 0.5]
        [--samples 100] [--search session|per-step|levels]
        [--work DIR] [--baseline-error 0.05] [--no-baseline] [--nightly-result]

The case is a nightly case file shaped as the demo's: one server, an accuracy benchmark
(`threshold` 4, 100 samples at the nightly's default temperature 0.6) and a performance benchmark
(`threshold` 0.97). Over many seeded culprits it counts how often each tool names the right
commit, and how many benchmark runs it spent. Two regressions: the accuracy falls 8 points
(about 96% -> 88%: the culprit breaks some samples, whose rate drops to a twentieth), or the
throughput does (-7%, run-to-run spread 2%). A sample's rate at the good side is drawn from a
beta of mean 0.96 and intraclass correlation 0.5 (sampled decoding: a sample's runs agree more
often than chance, not always); the accuracy's `baseline` is the good side's score on the drawn
dataset (what the nightly publishes), so the good end sits 4 points over the line. Every run
can crash for an infrastructure reason (3%); a candidate's build fails at 5%; in the `pin move`
rows the vLLM pin moves inside the range (as the demo's VLLM_TAG does).

`tools/bisect`'s rules, as its files state them (vllm-ascend `tools/bisect/`, read, not copied):
- `verdict.py` `evaluate`: a trial is the whole case file; pytest's exit code non-zero is FAIL,
  an accuracy or performance miss recorded as `pass_fail: fail` in the benchmark JSON is FAIL
  (accuracy within `threshold` points of `baseline`, throughput at `threshold` x `baseline`:
  `tests/e2e/nightly/single_node/models/scripts/test_single_node.py`, `_task_passed`);
- `auto_bisect.py` `_judge`: a FAIL is run once more (`--fail-confirm-retries 1`); a FAIL whose
  re-run passes is SKIP; a build failure is SKIP;
- `vllm_compat.py` / `runner.py`: a commit whose `.github/vllm-release-tag.commit` pins another
  vLLM than the installed one (the bad end's) is SKIP;
- `auto_bisect.py` `_verify_endpoints`: the bad end must FAIL and the good end PASS, else no
  answer; `_bisect` / `_pick_mid`: binary search over (good, bad], a SKIP stepped around nearest
  the midpoint, the answer `candidates[lo]` (a skipped window leaves only a suspect).

bisect-npu's, with its own code throughout: each benchmark becomes its recipe by
`bisect_npu.nightly.cases.import_case` (what `run --nightly-case` does), so every setting is the
product's default for a nightly case; only the failing benchmark runs; the vLLM pin is installed
at each commit (no skip); a crashed run is an infrastructure failure and is run again, up to the
evaluator's default retry budget (`bisect_npu.defaults.TRIAL_RETRIES`), each attempt counted as a
run. Accuracy: each step is `bisect_npu.orchestration.running.accuracy.AccuracySteps.step` (the rounds,
the focused samples and the verdict of the real accuracy oracle against the ends), and the
search is the likelihood mode a session runs for an accuracy recipe, weighing each step's
likelihood ratio as the session does (`orchestration.opening.state.accuracy_weight`). Throughput per
step (`--search per-step`, `oracle.throughput.search: per_step`): each
step runs the recipe's trials one at a time until `bisect_npu.oracle.sequential` stops them (the
rule the evaluator applies: the step's likelihood ratio against the good end past its bound, or
the recipe's 5 trials), the good end first until its mean is known (`reference_known`, at most
`oracle.throughput.reference_trials`), each later step weighed also against the bad end's runs
(as the evaluator keeps them), in the search mode the session runs for such a recipe
(`orchestration.session.search_mode_for`: likelihood), each step weighed by its ratio.
The rule's constants were chosen on seeds 1000-1599; docs/benchmarks.md reports seeds 0-399.
`--drop` and `--spread` change the throughput regression (held-out checks), `--scores`, `--icc` and
`--samples` the accuracy one's scores, correlation and dataset, `--rows` runs one.
The throughput rows (`--search`):
- `session` (the default): through bisect-npu's sessions (`orchestration.session.Session`, the
  engine, the journal, the evaluator and its retries, the search the session picks for the
  recipe: levels mode, search/two_levels.py, one run a step) over a real git history of the
  case's length made under `--work`; each seeded history's builds fail at its unbuildable commits
  (the build command reads the commit's `counter`, its index) and its benchmark runs are stood in
  for at the executor (tests/helpers/npu_throughput.py: the NPU host's run cannot happen here),
  each run's throughput drawn about its side's level, a run crashing (the engine never starts) at
  3%, run again by the evaluator's retries. The recipe is the imported one, but for
  `trials.retry_backoff_s: 0` (a wait between attempts changes no run). The notes count the wrong
  culprits named with exit 0 at the confidence 0.99.
- `per-step`: what sessions ran before levels mode (`oracle.throughput.search: per_step`), as above.
- `levels`: the levels search alone (`decide` in a loop, each query one run): no session.
In levels mode the good side's level has the case's published `baseline` as a prior (in tokens/s,
the runs' unit); `--baseline-error` puts that baseline off the good side's mean by a share (a
baseline of another host), `--no-baseline` leaves it unread. `--nightly-result` gives the search
the failing nightly's throughput as an earlier run at the bad end (`oracle.throughput.earlier_runs`,
what `run --nightly-result bad=...` writes): one run of the bad side drawn on the baseline's host
(apart from the world's runs, so the worlds stay the same), which `--baseline-error` moves with
the baseline.

A commit whose parent cannot be built (its own code fails to build) cannot be named by any tool:
the best answer that history allows is the range from the last buildable commit before it to it.
The table counts both: "culprit named" and "best answer" (the culprit, or exactly that range).
A search that stops below the confidence asked answers with the range that holds it (exit 3) and
its best guess inside: "culprit named" counts culprits found (exit 0) only, "best answer" a right
best guess too.
A throughput drop of at most the line's gap (`--drop 0.03` or less) leaves the bad side not under
the line: the ends judged wrong (exit 4, "the ends do not differ past the line") is a best answer
there too, beside the culprit; any other culprit named is wrong. The notes count the ends judged
wrong.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from reliability import bin_label, p_label, reliability

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers: the NPU run's stand-in

from bisect_npu.defaults import TRIAL_RETRIES
from bisect_npu.nightly.cases import import_case
from bisect_npu.observations import Observation, SampleOutcome, Timings, Verdict, VerdictKind
from bisect_npu.oracle.sequential import judge_sequential, pooled_spread, throughputs, trials_wanted
from bisect_npu.oracle.throughput import judge_throughput, reference_trials
from bisect_npu.orchestration.opening.state import accuracy_weight, answer_log_lr
from bisect_npu.orchestration.running.accuracy import AccuracySteps, role_of
from bisect_npu.orchestration.session import search_mode_for
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import StepRecord, TrialRun
from bisect_npu.search import EndsWrong, Evidence, Found, Narrowed, Next, SearchProblem, decide

SAMPLES = 100
GOOD_ACC, BAD_ACC, RHO, BROKEN_RATE, THRESHOLD = 0.96, 0.88, 0.5, 0.05, 4.0
GOOD_TPUT, TPUT_DROP, TPUT_SD, TPUT_THRESHOLD = 1.00, 0.07, 0.02, 0.97
CRASH, BUILD_FAIL = 0.03, 0.05
# A throughput run of 1.0 is its probe's 1000 tokens in a millisecond: the runs and the case's
# published `baseline` are both in tokens/s.
TOKENS_PER_S = 1000.0



@functools.cache
def recipe_of(benchmark: str, baseline: float = 96.0, search: str = "levels",
              throughput_baseline: float | None = GOOD_TPUT * TOKENS_PER_S) -> Recipe:
    """The recipe `run --nightly-case` makes of the case's benchmark (`baseline`: the accuracy's,
    points; `search`: the performance benchmark's `oracle.throughput.search`; `throughput_baseline`:
    the performance's, tokens/s, None: the case publishes none)."""
    perf = {"case_type": "performance", "threshold": TPUT_THRESHOLD,
            "baseline": GOOD_TPUT * TOKENS_PER_S if throughput_baseline is None else throughput_baseline}
    case = {"name": "nightly-bench", "model": "seed:0", "launcher": ["serve"],
            "benchmarks": {"acc": {"case_type": "accuracy", "dataset_path": "qa.jsonl", "dataset_conf": "qa_conf",
                                   "baseline": baseline, "threshold": THRESHOLD, "max_out_len": 1024},
                           "perf": perf}}
    recipe = import_case({"test_cases": [case]}, "nightly-bench.yaml", benchmark=benchmark)
    if recipe.oracle.throughput is None:
        return recipe
    published = {} if throughput_baseline is not None else {"baseline": None}
    throughput = recipe.oracle.throughput.model_copy(update={"search": search, **published})
    return recipe.model_copy(update={"oracle": recipe.oracle.model_copy(update={"throughput": throughput})})


@dataclass(frozen=True)
class World:
    """One seeded history: the culprit, which benchmark it breaks, the pin move, the build breaks."""

    n: int  # candidates 1..n; 0 is the good end, n the bad end
    culprit: int
    breaks: str  # "accuracy" or "throughput"
    pin_move: int | None  # commits before it pin the older vLLM
    unbuildable: frozenset[int]
    good_rates: np.ndarray
    bad_rates: np.ndarray
    rng: np.random.Generator
    drop: float = TPUT_DROP  # the throughput regression's share of the good side's
    spread: float = TPUT_SD  # a throughput run's spread, as a share of the good side's

    @property
    def baseline(self) -> float:
        """The accuracy's published baseline: the good side's score on this dataset, in points."""
        return round(100 * float(self.good_rates.mean()), 1)

    @property
    def samples(self) -> int:
        return len(self.good_rates)

    def bad_at(self, i: int) -> bool:
        return i >= self.culprit

    def accuracy_run(self, i: int, ids: Sequence[int]) -> np.ndarray | None:
        """One accuracy run's per-sample outcomes (1 correct) for `ids`, or None when the run crashed."""
        if self.rng.random() < CRASH:
            return None
        rates = self.bad_rates if self.breaks == "accuracy" and self.bad_at(i) else self.good_rates
        return self.rng.binomial(1, rates[list(ids)])

    def throughput_run(self, i: int) -> float | None:
        if self.rng.random() < CRASH:
            return None
        mean = GOOD_TPUT * (1 - self.drop) if self.breaks == "throughput" and self.bad_at(i) else GOOD_TPUT
        return float(self.rng.normal(mean, self.spread * GOOD_TPUT))

    @property
    def over_line(self) -> bool:
        """Whether the throughput's bad side is not under the recipe's line (a drop of at most its
        gap): "the ends do not differ past the line" (exit 4) is then as right as the culprit."""
        return self.breaks == "throughput" and self.drop <= 1 - TPUT_THRESHOLD + 1e-9

    def best_range(self) -> tuple[int, int]:
        """The narrowest answer the builds allow: (last buildable commit before the culprit, culprit]."""
        lo = self.culprit - 1
        while lo in self.unbuildable:
            lo -= 1
        return lo, self.culprit


@dataclass
class Outcome:
    named: bool  # the culprit itself
    best: bool  # the culprit, or exactly the range its unbuildable parent(s) leave
    runs: int
    samples: int = 0
    wrong: bool = False  # another commit named as the culprit (exit 0)
    ends_wrong: bool = False  # the ends judged wrong (exit 4)
    posterior: float | None = None  # the posterior the culprit was named at, where the search's decision tells it


def scored(world: World, runs: int, samples: int = 0, *, found: int | None = None,
           narrowed: tuple[int, int] | None = None, guess: int | None = None, ends_wrong: bool = False,
           posterior: float | None = None) -> Outcome:
    """An answer (the culprit `found`, the range `narrowed` with the best `guess` named inside it
    below the confidence asked, or the ends judged wrong) scored against the world, whichever shape
    gave it (the search's decision, a session's result), so every row counts "best answer" alike:
    the culprit (found, or the best guess), exactly the range its unbuildable parent(s) leave, or
    exit 4 where the drop is within the line's gap (`World.over_line`)."""
    named = found == world.culprit
    best = named or guess == world.culprit or narrowed == world.best_range() or (ends_wrong and world.over_line)
    return Outcome(named, best, runs, samples, wrong=found is not None and not named, ends_wrong=ends_wrong,
                   posterior=posterior if found is not None else None)


def blocked(world: World) -> bool:
    """Whether the commit before the culprit cannot be built: no tool can name the culprit then."""
    return world.culprit - 1 in world.unbuildable


# -- tools/bisect -------------------------------------------------------------------------------

def theirs(world: World) -> Outcome:
    runs = 0
    everything = list(range(world.samples))

    def trial(i: int) -> str:
        nonlocal runs
        if i in world.unbuildable:
            return "SKIP"
        if world.pin_move is not None and i < world.pin_move:
            return "SKIP"  # pins another vLLM than the container's (the bad end's)
        runs += 1
        outcomes, tput = world.accuracy_run(i, everything), world.throughput_run(i)
        if outcomes is None or tput is None:
            return "FAIL"  # a crash mid-test: pytest exits non-zero
        acc = 100.0 * float(outcomes.mean())
        passed = abs(acc - world.baseline) <= THRESHOLD and tput >= TPUT_THRESHOLD * GOOD_TPUT
        return "PASS" if passed else "FAIL"

    def judge(i: int) -> str:
        verdict = trial(i)
        if verdict == "FAIL" and trial(i) != "FAIL":
            return "SKIP"  # flaky: a FAIL whose re-run passed
        return verdict

    if judge(world.n) != "FAIL" or judge(0) != "PASS":
        return Outcome(False, False, runs, runs * world.samples)
    lo, hi, skipped = 0, world.n - 1, set()  # indices into the candidates 1..n
    while lo < hi:
        mid = (lo + hi) // 2
        pick = next((c for off in range(hi - lo) for c in (mid + off, mid - off)
                     if lo <= c < hi and c not in skipped), None)
        if pick is None:
            break
        verdict = judge(pick + 1)
        if verdict == "FAIL":
            hi = pick
        elif verdict == "PASS":
            lo = pick + 1
        else:
            skipped.add(pick)
    right = lo + 1 == world.culprit
    return Outcome(right, right, runs, runs * world.samples)


# -- bisect-npu ---------------------------------------------------------------------------------

@dataclass
class Ours:
    """One bisection with bisect-npu's code; `runs` counts every attempt (retries included)."""

    world: World
    recipe: Recipe
    runs: int = 0
    samples: int = 0
    reference: list[Observation] = field(default_factory=list)
    bad_end: list[Observation] = field(default_factory=list)
    stored: dict[str, Observation] = field(default_factory=dict)
    runs_at: dict[int, list[float]] = field(default_factory=dict)  # every commit's throughput runs
    levels: bool = False  # throughput: the levels search, one run a query (`--search levels`)
    weigh_baseline: bool = True  # levels: the case's published baseline a prior on the good side
    nightly: tuple[float, ...] = ()  # levels: the failing nightly's throughput (tokens/s), a run at the bad end

    def attempt(self, run: Callable[[], object | None]) -> object | None:
        """A run that crashed is run again (the evaluator's retries); every attempt is a run."""
        for _ in range(1 + TRIAL_RETRIES):
            self.runs += 1
            value = run()
            if value is not None:
                return value
        return None

    def accuracy_step(self, steps: AccuracySteps, i: int) -> Verdict:
        role = role_of(as_reference=i == 0, as_bad_end=i == self.world.n)

        def run_round(trial: int, sample_ids: Sequence[str] | None) -> TrialRun:
            ids = list(range(self.world.samples)) if sample_ids is None else [int(s) for s in sample_ids]
            per_attempt = len(ids)

            def one() -> np.ndarray | None:
                self.samples += per_attempt
                return self.world.accuracy_run(i, ids)

            got = self.attempt(one)
            if got is None:
                return TrialRun(case_id="acc", trial=trial, reason="the harness run crashed after its retries")
            assert isinstance(got, np.ndarray)
            key = f"{i}/{trial}"
            samples = [SampleOutcome.model_construct(id=str(s), correct=float(k), runs=1, prompt=None, output=None,
                                                     target=None, finish_reason=None)
                       for s, k in zip(ids, got, strict=True)]
            self.stored[key] = Observation.model_construct(case_id="acc", trial=trial, samples=samples)
            return TrialRun(case_id="acc", trial=trial, observation=key)

        again = functools.partial(self.accuracy_step, steps, 0) if role == "bad_end" else None
        _, verdict = steps.step(str(i), role, [], run_round, 0, self.stored.__getitem__, again)
        return verdict

    def throughput_step(self, i: int) -> Verdict:
        """The step as the evaluator runs it: trials one at a time until `oracle.sequential` stops them."""
        spec = self.recipe.oracle.throughput
        assert spec is not None
        observations: list[Observation] = []
        cap = reference_trials(spec, self.recipe.trials.count) if i == 0 else self.recipe.trials.count
        tried = 0
        bad_end = self.bad_end if i != self.world.n else []  # the bad end is judged by the line alone
        # as the evaluator: the spread pooled over every commit's runs in the steps before this one
        others = pooled_spread(self.runs_at.values())
        while wanted := trials_wanted(spec, observations, self.reference, tried, cap, i == 0, bad_end, others):
            for _ in range(wanted):
                value = self.attempt(lambda: self.world.throughput_run(i))
                tried += 1
                if isinstance(value, float):  # as the evaluator: the usable trials are judged
                    observations.append(Observation(case_id="perf", trial=tried, output_token_ids=list(range(1000)),
                                                    timings=Timings(generate_s=1000 / (value * TOKENS_PER_S))))
        self.runs_at.setdefault(i, []).extend(throughputs(observations))
        if i == 0:
            self.reference = observations
            return judge_throughput(spec, observations, observations)
        verdict = judge_sequential(spec, observations, self.reference, tried, cap, bad_end, others)[0]
        if i == self.world.n:  # the bad end's runs tell where the bad side sits
            self.bad_end = observations
        return verdict

    def bisect_levels(self) -> Outcome:
        """The throughput rows under the levels search (search/two_levels.py): every query is one
        run (a crashed one run again, each attempt counted), every run of every commit weighed
        together; not yet what a session runs (docs/benchmarks.md)."""
        world, spec = self.world, self.recipe.oracle.throughput
        assert spec is not None
        problem = SearchProblem(n=world.n, mode="levels", confidence=self.recipe.trials.confidence,
                                threshold=spec.threshold, baseline=spec.baseline if self.weigh_baseline else None,
                                earlier_levels=((), self.nightly))
        evidence: dict[int, Evidence] = {}
        for _ in range(20 * world.n):
            decision = decide(problem, evidence)
            if not isinstance(decision, Next):
                return self.outcome(decision)
            for query in decision.queries:
                i, before = query.index, evidence.get(query.index, Evidence())
                value = None if i in world.unbuildable else self.attempt(functools.partial(world.throughput_run, i))
                measured = (value * TOKENS_PER_S,) if isinstance(value, float) else ()  # tokens/s, as the baseline
                evidence[i] = before.measure(measured) if measured else before.add("skip")
        return Outcome(False, False, self.runs, self.samples)

    def outcome(self, decision: object) -> Outcome:
        return scored(self.world, self.runs, self.samples,
                      found=decision.index if isinstance(decision, Found) else None,
                      narrowed=(decision.lo, decision.hi) if isinstance(decision, Narrowed) else None,
                      guess=int(decision.figures["best_guess"]) if isinstance(decision, Narrowed)
                      and "best_guess" in decision.figures else None,
                      ends_wrong=isinstance(decision, EndsWrong),
                      posterior=decision.confidence if isinstance(decision, Found) else None)

    def bisect(self) -> Outcome:
        if self.levels and self.recipe.oracle.throughput is not None:
            return self.bisect_levels()
        world, recipe = self.world, self.recipe
        steps = AccuracySteps(recipe) if recipe.accuracy is not None else None
        weigh = accuracy_weight(recipe.accuracy.confidence if recipe.accuracy else None, world.n, find_fix=False)
        problem = SearchProblem(n=world.n, mode=search_mode_for(recipe), confidence=recipe.trials.confidence,
                                answer_log_lr=answer_log_lr(recipe))
        evidence: dict[int, Evidence] = {}

        def judge(i: int) -> None:
            if i in world.unbuildable:
                evidence[i] = evidence.get(i, Evidence()).add("skip")
                return
            verdict = self.accuracy_step(steps, i) if steps is not None else self.throughput_step(i)
            step = StepRecord.model_construct(index=i, commit=str(i), verdict=verdict)
            kind = verdict.kind.value if verdict.kind != VerdictKind.SKIP else "skip"
            evidence[i] = evidence.get(i, Evidence()).add(kind).weigh(  # type: ignore[arg-type]
                weigh(step) if problem.mode == "likelihood" else 0.0)

        if steps is None:  # the throughput line is the good end's: it goes first
            judge(0)
        for _ in range(10 * world.n):
            decision = decide(problem, evidence)
            if not isinstance(decision, Next):
                return self.outcome(decision)
            for query in decision.queries:
                judge(query.index)
        return Outcome(False, False, self.runs, self.samples)


def nightly_result(world: World, seed: int, baseline_error: float = 0.0) -> float:
    """The failing nightly's throughput (tokens/s): one run of the bad side on the baseline's host
    (`baseline_error` moves that host's level by a share, as it moves the baseline), drawn apart
    from the world's runs so the worlds stay the same with and without it."""
    rng = np.random.default_rng([seed, 2])
    bad = GOOD_TPUT * (1 - world.drop) if world.breaks == "throughput" else GOOD_TPUT
    return float(rng.normal(bad, world.spread * GOOD_TPUT)) * (1 + baseline_error) * TOKENS_PER_S


def ours(world: World, levels: bool = False, baseline_error: float = 0.0, weigh_baseline: bool = True,
         nightly: tuple[float, ...] = ()) -> Outcome:
    """bisect-npu on one world; `baseline_error`: the published throughput baseline's error (a share of
    the good side's mean: a baseline measured on another host); `nightly`: the failing nightly's
    throughput, given to the levels search as an earlier run at the bad end."""
    if world.breaks == "accuracy":
        recipe = recipe_of("acc", world.baseline)
    else:
        recipe = recipe_of("perf", search="levels" if levels else "per_step",
                           throughput_baseline=GOOD_TPUT * TOKENS_PER_S * (1 + baseline_error))
    return Ours(world, recipe, levels=levels, weigh_baseline=weigh_baseline, nightly=nightly).bisect()


# -- bisect-npu through its sessions ------------------------------------------------------------

@dataclass(frozen=True)
class SessionHistory:
    """A real git history of the case's length (tests/helpers/gitrepo.py: commit i's `counter` file
    holds i), the performance benchmark's recipe as a file, and where the sessions go."""

    work: Path
    repo: Path
    shas: list[str]
    recipe: Path


def session_history(work: Path, n: int, baseline_error: float | None = 0.0) -> SessionHistory:
    """`baseline_error`: the published throughput baseline's error (a share of the good side's mean);
    None: the case publishes none."""
    from bisect_npu.nightly.at_commit import recipe_dump
    from tests.helpers.gitrepo import make_linear_repo

    shas = make_linear_repo(work / "repo", n + 1)
    recipe = recipe_of("perf", throughput_baseline=None if baseline_error is None
                       else GOOD_TPUT * TOKENS_PER_S * (1 + baseline_error))
    recipe = recipe.model_copy(update={"trials": recipe.trials.model_copy(update={"retry_backoff_s": 0.0})})
    path = work / "perf.yaml"
    path.write_text(recipe_dump(recipe))
    return SessionHistory(work, work / "repo", shas, path)


def ours_in_session(world: World, history: SessionHistory, seed: int, nightly: tuple[float, ...] = ()) -> Outcome:
    """One seeded history bisected by a session (see the module's docstring); `runs` counts every
    benchmark run, crashed attempts included; `nightly`: the failing nightly's throughput, in the
    recipe's `oracle.throughput.earlier_runs` (what `--nightly-result bad=...` writes)."""
    import git

    from bisect_npu.api.bisection import progress_for
    from bisect_npu.builders.local import LocalBuilder
    from bisect_npu.orchestration.opening.session_spec import SessionSpec
    from bisect_npu.orchestration.session import Session
    from bisect_npu.request import RunRequest
    from tests.helpers.npu_throughput import NpuThroughputStandIn, crashing_at

    shas = history.shas
    position = {sha: i for i, sha in enumerate(shas)}
    stand_in = NpuThroughputStandIn(world.drop, world.spread, seed, crashes=crashing_at(CRASH, seed),
                                    level_of=lambda env: world.breaks == "throughput"
                                    and position[env.commit] >= world.culprit)
    where = Path(tempfile.mkdtemp(prefix=f"seed-{seed}-", dir=history.work))
    unbuildable = where / "unbuildable.txt"
    unbuildable.write_text("".join(f"{i}\n" for i in sorted(world.unbuildable)))
    recipe_path = history.recipe
    if nightly:
        from bisect_npu.nightly.at_commit import recipe_dump, with_earlier_runs
        from bisect_npu.nightly.cases import CaseRef
        from bisect_npu.oracle.throughput import EarlierThroughput
        from bisect_npu.recipe.loader import load_recipe

        recipe_path = where / "perf.yaml"
        recipe_path.write_text(recipe_dump(with_earlier_runs(load_recipe(str(history.recipe)),
                                                             EarlierThroughput(bad=list(nightly)),
                                                             CaseRef.parse("nightly-bench.yaml"))))
    builder = LocalBuilder(git.Repo(history.repo), where / "work",
                           ["sh", "-c", '! grep -qxF "$(cat counter)" "$0"', str(unbuildable)])
    spec = SessionSpec.of(RunRequest.of(repo=str(history.repo), good=shas[0], bad=shas[world.n],
                                        recipe=str(recipe_path), propose_fix=False, confidence=0.99))
    try:
        result = Session.start(spec, session_dir=where / "session", builder=builder, executor=stand_in,
                               progress=progress_for(quiet=True, live=False)).run()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    narrowed = result.range if result.status == "narrowed" else None
    return scored(world, stand_in.runs,
                  found=position[result.culprit] if result.status == "found" and result.culprit else None,
                  narrowed=(position[narrowed[0]], position[narrowed[1]]) if narrowed else None,
                  guess=position[result.best_guess] if result.best_guess else None,
                  ends_wrong=result.status == "ends_wrong")


def make_world(seed: int, n: int, breaks: str, pin_moves: bool, drop: float = TPUT_DROP,
               spread: float = TPUT_SD, scores: tuple[float, float] = (GOOD_ACC, BAD_ACC), rho: float = RHO,
               samples: int = SAMPLES) -> World:
    """`scores`: the accuracy's good and bad side (shares); `rho`: a sample's intraclass correlation."""
    rng = np.random.default_rng(seed)
    culprit = int(rng.integers(1, n + 1))
    unbuildable = frozenset(i for i in range(1, n) if rng.random() < BUILD_FAIL and i != culprit)
    kappa = 1 / rho - 1
    good = rng.beta(scores[0] * kappa, (1 - scores[0]) * kappa, samples)
    bad = good.copy()
    for i in rng.permutation(samples):  # break samples until the mean has dropped by the regression's points
        if (good - bad).sum() >= samples * (scores[0] - scores[1]):
            break
        bad[i] = good[i] * BROKEN_RATE
    pin_move = int(rng.integers(1, n + 1)) if pin_moves else None
    return World(n, culprit, breaks, pin_move, unbuildable, good, bad, np.random.default_rng([seed, 1]), drop, spread)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=400)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--candidates", type=int, default=39)
    parser.add_argument("--rows", choices=("accuracy", "throughput"), nargs="+", default=["accuracy", "throughput"])
    parser.add_argument("--drop", type=float, default=TPUT_DROP, help="the throughput regression (share)")
    parser.add_argument("--spread", type=float, default=TPUT_SD, help="a throughput run's spread (share)")
    parser.add_argument("--scores", type=float, nargs=2, default=(GOOD_ACC, BAD_ACC), metavar=("GOOD", "BAD"),
                        help="the accuracy regression: the score at the good and the bad side (shares; the case's "
                             "threshold stays 4 points)")
    parser.add_argument("--icc", type=float, default=RHO, help="the accuracy rows: a sample's intraclass correlation")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="the accuracy rows: the dataset's samples")
    parser.add_argument("--search", choices=("session", "per-step", "levels"), default="session",
                        help="throughput rows: through bisect-npu's sessions (levels mode, their default), the "
                             "per-step trials sessions ran before it, or the levels search alone")
    parser.add_argument("--work", type=Path, default=None,
                        help="--search session: where the history and the sessions go [default: a temporary "
                             "directory, removed after]")
    parser.add_argument("--baseline-error", type=float, default=0.0,
                        help="the case's published throughput baseline off the good side's mean by this share")
    parser.add_argument("--nightly-result", action="store_true",
                        help="levels mode: the failing nightly's throughput (one run of the bad side on the "
                             "baseline's host) given as an earlier run at the bad end")
    parser.add_argument("--no-baseline", action="store_true",
                        help="levels mode: the runs alone place the good side (the case's baseline unread)")
    args = parser.parse_args()
    started = time.monotonic()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"seeds {seeds.start}-{seeds.stop - 1} ({args.seeds} seeded culprits per row), {args.candidates} candidates; "
          f"accuracy {args.scores[0]:.0%} -> {args.scores[1]:.0%}, ICC {args.icc:g}, {args.samples} samples; "
          f"throughput drop {args.drop:.0%}, spread {args.spread:.0%}; throughput rows: --search {args.search}; "
          f"the case's throughput baseline "
          f"{'unread' if args.no_baseline else f'{1 + args.baseline_error:.0%} of the good side'}"
          f"{'; the failing nightly result given' if args.nightly_result else ''}")
    work = args.work or Path(tempfile.mkdtemp(prefix="nightly-bench-"))
    history = session_history(work, args.candidates, None if args.no_baseline else args.baseline_error) \
        if args.search == "session" and "throughput" in args.rows else None
    print("| regression | vLLM pin | tools/bisect right | its runs (mean) | bisect-npu culprit named | "
          "best answer the builds allow | its runs (mean) | its samples run (mean) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    notes: list[str] = []
    for breaks in args.rows:
        # bisect-npu installs each commit's own pin and never reads it: the worlds of both rows are
        # the same but for the pin (drawn last, apart from the runs' stream), so its runs are too.
        def world(seed: int, pin_moves: bool, breaks: str = breaks) -> World:
            return make_world(seed, args.candidates, breaks, pin_moves, args.drop, args.spread, tuple(args.scores),
                              args.icc, args.samples)

        if history is not None and breaks == "throughput":
            mine = [ours_in_session(world(seed, False), history, seed,
                                    (nightly_result(world(seed, False), seed, args.baseline_error),)
                                    if args.nightly_result else ()) for seed in seeds]
        else:
            mine = [ours(world(seed, False), args.search == "levels", args.baseline_error, not args.no_baseline,
                         (nightly_result(world(seed, False), seed, args.baseline_error),) if args.nightly_result
                         else ()) for seed in seeds]
        for pin_moves in (False, True):
            worlds = [world(seed, pin_moves) for seed in seeds]
            other = [theirs(w) for w in worlds]
            pin = "moves inside the range" if pin_moves else "the same at every commit"
            samples = f"{np.mean([r.samples for r in mine]):.0f}" if breaks == "accuracy" else "-"
            print(f"| {breaks} | {pin} | {np.mean([r.named for r in other]):.1%} | "
                  f"{np.mean([r.runs for r in other]):.1f} | {np.mean([r.named for r in mine]):.1%} | "
                  f"{np.mean([r.best for r in mine]):.1%} | {np.mean([r.runs for r in mine]):.1f} | {samples} |")
            if not pin_moves:
                misses = [w for w, r in zip(worlds, mine, strict=True) if not r.named]
                wrong = [w for w, r in zip(worlds, mine, strict=True) if not r.best]
                notes.append(f"{breaks}: bisect-npu's {len(misses)} misses of the culprit: {sum(map(blocked, misses))} "
                             f"with the commit before it unbuildable, {sum(not blocked(w) for w in misses)} else; "
                             f"{len(wrong)} answers not the best the builds allow; "
                             f"{sum(r.wrong for r in mine)} wrong culprits named with exit 0 "
                             f"({np.mean([r.wrong for r in mine]):.2%}); {sum(r.ends_wrong for r in mine)} "
                             f"ends judged wrong (exit 4)")
                named = reliability((r.posterior, r.wrong) for r in mine if r.posterior is not None)
                if named.answers:
                    notes.append(f"{breaks}: {named.answers} culprits named at a posterior the search told: "
                                 f"{named.wrong} wrong, {named.expected:.2f} expected (sum of 1 - posterior), "
                                 f"P(wrong >= seen) {p_label(named.p_value)}; by posterior (answers / wrong / "
                                 f"expected): "
                                 + "; ".join(f"{bin_label(b)} {b.answers} / {b.wrong} / {b.expected:.2f}"
                                             for b in named.bins))
    for note in notes:
        print(note)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
