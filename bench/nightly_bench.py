"""vllm-ascend's `tools/bisect` against bisect-npu on the demo-shaped nightly case, simulated.

    .venv/bin/python bench/nightly_bench.py [--seeds 400] [--candidates 39]

The case is the demo's nightly case file: one server, an accuracy benchmark (`baseline` 96,
`threshold` 4, 100 samples) and a performance benchmark (`threshold` 0.97 of its baseline). Over
many seeded culprits it counts how often each tool names the right commit, and how many
benchmark runs it spent. Two regressions: the accuracy falls (96% -> 88%), or the throughput
does (-7%). Every run can crash for an infrastructure reason (3%); a candidate's build fails at
5%; in the `pin move` rows the vLLM pin moves inside the range (as the demo's VLLM_TAG does).

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

bisect-npu's, with its own code where it has it: the exact search (`bisect_npu.search.decide`)
with its end checks and skips; only the failing benchmark runs; the vLLM pin is installed at
each commit (no skip); a crashed run is an infrastructure failure and is run again, up to the
evaluator's default retry budget (`bisect_npu.defaults.TRIAL_RETRIES`), each attempt counted as a
run; a run still crashed after them is dropped and the step judged on its other runs (a step
with none is a skip: no verdict from no evidence);
accuracy by the accuracy oracle's baseline rule (one-sided: bad when the 99% Wilson bound of
the pooled score lies under `baseline` - `threshold`, good when the other bound lies over it,
another round of the samples while undecided, 3 rounds at most, then the point estimate;
re-implemented here over drawn scores), throughput by `bisect_npu.oracle.throughput` itself
(5 trials, against the good end's measured mean).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from bisect_npu.contracts import Observation, Timings, VerdictKind
from bisect_npu.defaults import TRIAL_RETRIES
from bisect_npu.oracle.throughput import ThroughputConfig, judge_throughput
from bisect_npu.search import Evidence, Found, Next, SearchProblem, decide

SAMPLES = 100
GOOD_ACC, BAD_ACC, BASELINE, THRESHOLD = 0.96, 0.88, 96.0, 4.0
GOOD_TPUT, BAD_TPUT, TPUT_SD, TPUT_THRESHOLD = 1.00, 0.93, 0.02, 0.97
CRASH, BUILD_FAIL = 0.03, 0.05
CONFIDENCE, MAX_ROUNDS, PERF_TRIALS = 0.99, 3, 5


@dataclass(frozen=True)
class World:
    """One seeded history: the culprit, which benchmark it breaks, the pin move, the build breaks."""

    n: int  # candidates 1..n; 0 is the good end, n the bad end
    culprit: int
    breaks: str  # "accuracy" or "throughput"
    pin_move: int | None  # commits before it pin the older vLLM
    unbuildable: frozenset[int]
    rng: np.random.Generator

    def bad_at(self, i: int) -> bool:
        return i >= self.culprit

    def accuracy_run(self, i: int) -> float | None:
        """One accuracy evaluation's score in points, or None when the run crashed."""
        if self.rng.random() < CRASH:
            return None
        acc = BAD_ACC if self.breaks == "accuracy" and self.bad_at(i) else GOOD_ACC
        return 100.0 * self.rng.binomial(SAMPLES, acc) / SAMPLES

    def throughput_run(self, i: int) -> float | None:
        if self.rng.random() < CRASH:
            return None
        mean = BAD_TPUT if self.breaks == "throughput" and self.bad_at(i) else GOOD_TPUT
        return float(self.rng.normal(mean, TPUT_SD))


@dataclass
class Outcome:
    correct: bool
    runs: int


def blocked(world: World) -> bool:
    """Whether the commit before the culprit cannot be built: no tool can name the culprit then
    (the answer is the range), whatever its retries."""
    return world.culprit - 1 in world.unbuildable


# -- tools/bisect -------------------------------------------------------------------------------

def theirs(world: World) -> Outcome:
    runs = 0

    def trial(i: int) -> str:
        nonlocal runs
        if i in world.unbuildable:
            return "SKIP"
        if world.pin_move is not None and i < world.pin_move:
            return "SKIP"  # pins another vLLM than the container's (the bad end's)
        runs += 1
        acc, tput = world.accuracy_run(i), world.throughput_run(i)
        if acc is None or tput is None:
            return "FAIL"  # a crash mid-test: pytest exits non-zero
        passed = abs(acc - BASELINE) <= THRESHOLD and tput >= TPUT_THRESHOLD * GOOD_TPUT
        return "PASS" if passed else "FAIL"

    def judge(i: int) -> str:
        verdict = trial(i)
        if verdict == "FAIL" and trial(i) != "FAIL":
            return "SKIP"  # flaky: a FAIL whose re-run passed
        return verdict

    if judge(world.n) != "FAIL" or judge(0) != "PASS":
        return Outcome(False, runs)
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
    return Outcome(lo + 1 == world.culprit, runs)


# -- bisect-npu ---------------------------------------------------------------------------------

def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def ours(world: World) -> Outcome:
    runs = 0
    z = NormalDist().inv_cdf(CONFIDENCE)
    line = (BASELINE - THRESHOLD) / 100
    reference: list[Observation] = []

    def retried(run: Callable[[int], float | None], i: int) -> float | None:
        """A run that crashed is run again (the evaluator's retries); every attempt is a run."""
        nonlocal runs
        for _ in range(1 + TRIAL_RETRIES):
            runs += 1
            value = run(i)
            if value is not None:
                return value
        return None

    def accuracy_verdict(i: int) -> str:
        nonlocal runs
        correct = total = 0
        for _ in range(MAX_ROUNDS):
            score = retried(world.accuracy_run, i)
            if score is None:
                continue  # a crashed round gives no samples; the others are judged
            correct, total = correct + round(score * SAMPLES / 100), total + SAMPLES
            low, high = _wilson(correct, total, z)
            if high < line:
                return "bad"
            if low >= line:
                return "good"
        if not total:
            return "skip"
        return "bad" if correct / total < line else "good"

    def throughput_verdict(i: int) -> str:
        nonlocal reference
        observations = []
        for trial in range(PERF_TRIALS):
            value = retried(world.throughput_run, i)
            if value is None:
                continue  # as the evaluator: the usable trials are judged, a step with none skips
            observations.append(Observation(case_id="perf", trial=trial, output_token_ids=list(range(1000)),
                                            timings=Timings(generate_s=1000 / (value * 1000))))
        if i == 0:
            reference = observations
        cfg = ThroughputConfig(threshold=TPUT_THRESHOLD, reference="good_end", confidence=0.95)
        verdict = judge_throughput(cfg, observations, reference)
        return {VerdictKind.GOOD: "good", VerdictKind.BAD: "bad"}.get(verdict.kind, "skip")

    judge: Callable[[int], str] = accuracy_verdict if world.breaks == "accuracy" else throughput_verdict
    problem = SearchProblem(n=world.n)
    evidence: dict[int, Evidence] = {}
    if world.breaks == "throughput":  # its reference: the good end goes first
        evidence[0] = Evidence().add(judge(0))  # type: ignore[arg-type]
    for _ in range(10 * world.n):
        decision = decide(problem, evidence)
        if not isinstance(decision, Next):
            return Outcome(isinstance(decision, Found) and decision.index == world.culprit, runs)
        for query in decision.queries:
            i = query.index
            outcome = "skip" if i in world.unbuildable else judge(i)
            evidence[i] = evidence.get(i, Evidence()).add(outcome)  # type: ignore[arg-type]
    return Outcome(False, runs)


def make_world(seed: int, n: int, breaks: str, pin_moves: bool) -> World:
    rng = np.random.default_rng(seed)
    culprit = int(rng.integers(1, n + 1))
    pin_move = int(rng.integers(1, n + 1)) if pin_moves else None
    unbuildable = frozenset(i for i in range(1, n) if rng.random() < BUILD_FAIL and i != culprit)
    return World(n, culprit, breaks, pin_move, unbuildable, rng)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=400)
    parser.add_argument("--candidates", type=int, default=39)
    args = parser.parse_args()
    started = time.monotonic()
    print(f"{args.seeds} seeded culprits per row, {args.candidates} candidates")
    print("| regression | vLLM pin | tools/bisect right | its runs (mean) | bisect-npu right | its runs (mean) |")
    print("|---|---|---:|---:|---:|---:|")
    notes: list[str] = []
    for breaks in ("accuracy", "throughput"):
        for pin_moves in (False, True):
            rows = {}
            for name, tool in (("theirs", theirs), ("ours", ours)):
                results = [tool(make_world(seed, args.candidates, breaks, pin_moves)) for seed in range(args.seeds)]
                rows[name] = (sum(r.correct for r in results) / len(results),
                              sum(r.runs for r in results) / len(results))
                if name == "ours" and not pin_moves:
                    worlds = [make_world(seed, args.candidates, breaks, pin_moves) for seed in range(args.seeds)]
                    misses = [w for w, r in zip(worlds, results, strict=True) if not r.correct]
                    notes.append(f"{breaks}: bisect-npu's {len(misses)} misses: {sum(map(blocked, misses))} with the "
                                 f"commit before the culprit unbuildable, {sum(not blocked(w) for w in misses)} "
                                 "from a wrong verdict")
            pin = "moves inside the range" if pin_moves else "the same at every commit"
            print(f"| {breaks} | {pin} | {rows['theirs'][0]:.1%} | {rows['theirs'][1]:.1f} | "
                  f"{rows['ours'][0]:.1%} | {rows['ours'][1]:.1f} |")
    for note in notes:
        print(note)
    print(f"({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
