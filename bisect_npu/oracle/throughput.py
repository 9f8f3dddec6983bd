"""Throughput against a line: vllm-ascend's nightly performance benchmarks pass when the output
token throughput is at least `threshold` x `baseline` (tools/aisbench.py, `_performance_verify`).

Why statistics: one throughput run on a shared card varies by a few percent, and the nightly's
line sits 3% under its baseline, so a single run that dips is a false regression and one that
peaks hides a real one. Here every trial is one sample; the commit is bad when the one-sided
confidence bound of its mean lies under the line, good when the other bound lies over it, and
otherwise (too few trials to tell) by its mean, flagged as not significant. The line is the
published baseline, or (`reference: good_end`) the good end's own mean: a probe that measures
throughput differently from the nightly's AISBench still compares like with like.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist, fmean, stdev
from typing import Any, Literal

from pydantic import Field, model_validator

from bisect_npu.observations import Observation, StrictModel, Verdict, VerdictKind

THROUGHPUT_FIGURE = "output_token_throughput"  # Observation.extra key a harness fills (tokens/s)
# The good end's trials, as a multiple of a candidate's, when its mean is the line: one error in
# that mean moves the line of every step at once, so it is measured to half a candidate's error.
REFERENCE_TRIALS_FACTOR = 4
# The unit of every throughput a recipe gives: output tokens per second, as a run measures it and
# the nightly publishes it (AISBench writes "token/s").
UNITS = ("tokens/s", "token/s")


class EarlierThroughput(StrictModel):
    """Throughput measured at the ends before the session, on the host the `baseline` comes from:
    `bad` at the end that shows the symptom (the failing nightly's: the bad end, or under
    --find-fix the old end), `good` at the end that does not (a passing nightly's: the good end,
    or under --find-fix the new end). The levels search counts them as runs at their end as far
    as that host is the session's, as it weighs the baseline: a value of another host costs runs,
    not the answer."""

    good: list[float] = Field(default_factory=list, description="earlier runs at the end without the symptom, "
                                                                "tokens/s (a passing nightly's output token "
                                                                "throughput): the good end, the new end under "
                                                                "--find-fix")
    bad: list[float] = Field(default_factory=list, description="earlier runs at the end with the symptom, tokens/s "
                                                               "(the failing nightly's output token throughput): "
                                                               "the bad end, the old end under --find-fix")
    unit: str = Field("tokens/s", description="their unit: output token throughput in tokens/s, the runs' (AISBench's "
                                              "'token/s' is the same)")
    source: str = Field("", description="where they were measured (said in the report), e.g. the nightly run's URL")

    @model_validator(mode="after")
    def _runs_in_the_runs_unit(self) -> EarlierThroughput:
        if self.unit.strip().lower() not in UNITS:
            raise ValueError(f"earlier_runs.unit {self.unit!r} is not the runs' unit: give output token throughput "
                             "in tokens/s (AISBench's 'Output Token Throughput'; not requests/s, not ms)")
        if not self.good and not self.bad:
            raise ValueError("earlier_runs gives no run: list the failing nightly's throughput under `bad` (and the "
                             "last good nightly's under `good`), or leave earlier_runs out")
        wrong = [v for v in (*self.good, *self.bad) if not (math.isfinite(v) and v > 0)]
        if wrong:
            raise ValueError(f"earlier_runs holds {wrong[0]}: a throughput is a positive number of tokens/s")
        return self


class ThroughputConfig(StrictModel):
    """The recipe's `oracle.throughput`: the nightly's `baseline` and `threshold`, and the test."""

    baseline: float | None = Field(None, gt=0.0, allow_inf_nan=False,
                                   description="published output token throughput, tokens/s (the nightly "
                                               "config's `baseline`); needed by reference baseline; with "
                                               "good_end, levels search's prior on the good end's level")
    threshold: float = Field(0.97, gt=0.0, le=1.0, allow_inf_nan=False,
                             description="share of the reference a commit must reach (the nightly's "
                                         "`threshold`, default 0.97)")
    reference: Literal["baseline", "good_end"] = Field(
        "baseline", description="baseline: the line is threshold x baseline; good_end: threshold x the good "
                                "end's mean throughput (measured the same way as every candidate's)")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="one-sided confidence of each bound")
    reference_trials: int | None = Field(
        None, strict=True, ge=1, le=10_000,
        description="reference good_end: trials of the good end (with `sequential`, the most it runs), whose mean "
                    f"is the line of every step; unset: {REFERENCE_TRIALS_FACTOR} x trials.count (its error would "
                    "move every step's line at once)")

    search: Literal["levels", "per_step"] = Field(
        "levels", description="reference good_end: levels (one run a step; the session's change-point search "
                              "weighs every run of every commit together, both sides' means and the spread "
                              "unknown, and asks one run where it teaches most); per_step: each step runs its "
                              "trials (see `sequential`) and the search weighs each step's verdict")
    sequential: bool = Field(
        True, description="search per_step: a step's trials stop as soon as its verdict is sure (trials.count "
                          "and reference_trials are the most it runs), and the search weighs each step's "
                          "likelihood ratio; false: every step runs its count")

    earlier_runs: EarlierThroughput | None = Field(
        None, description="search levels: throughput measured at the ends before the session on the baseline's "
                          "host (the failing nightly's at the end with the symptom: the bad end, the old end under "
                          "--find-fix), weighed as runs there as far as that host is the session's")

    @model_validator(mode="after")
    def _baseline_when_asked(self) -> ThroughputConfig:
        if self.reference == "baseline" and self.baseline is None:
            raise ValueError("reference baseline needs `baseline`, the published throughput in tokens/s")
        if self.earlier_runs is not None and (self.reference != "good_end" or self.search != "levels"):
            raise ValueError("earlier_runs are weighed by the levels search only: set reference: good_end and "
                             "search: levels, or leave earlier_runs out")
        return self

    def earlier_levels(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """`earlier_runs` as the levels search takes them (`SearchProblem.earlier_levels`, by level):
        (those without the symptom, those with it), whichever end each lies at."""
        runs = self.earlier_runs
        return (tuple(runs.good), tuple(runs.bad)) if runs is not None else ((), ())


def reference_trials(cfg: ThroughputConfig, trials: int) -> int:
    """The good end's trials when its mean is the line (reference good_end), a candidate taking `trials`."""
    if cfg.reference != "good_end":
        return trials
    return cfg.reference_trials or REFERENCE_TRIALS_FACTOR * trials


def sample_of(obs: Observation) -> float | None:
    """One trial's throughput: the harness's figure when it wrote one, else output tokens over
    generation seconds (what the probe measured)."""
    given = obs.extra.get(THROUGHPUT_FIGURE)
    if isinstance(given, int | float) and not isinstance(given, bool) and math.isfinite(given):
        return float(given)
    if obs.output_token_ids and obs.timings.generate_s > 0:
        return len(obs.output_token_ids) / obs.timings.generate_s
    return None


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, Cornish-Fisher above (within
    0.01 of the table at 3, 0.001 from 5 on: finer than any throughput run's spread)."""
    if df <= 1:
        return math.tan(math.pi * (p - 0.5))
    if df <= 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def squares(values: Sequence[float]) -> float:
    """The sum of squared deviations from the values' mean."""
    mean = fmean(values)
    return sum((v - mean) ** 2 for v in values)


def judge_throughput(cfg: ThroughputConfig, observations: Sequence[Observation],
                     reference: Sequence[Observation] | None = None, single_is_enough: bool = True) -> Verdict:
    """A commit from its trials' throughput samples (see the module's docstring). A step whose
    runs leave no spread to know (one run against a published baseline) is sure only with
    `single_is_enough` (the trials asked are all there will be); else it is not significant."""
    samples = [s for s in map(sample_of, observations) if s is not None]
    if not samples:
        return Verdict(kind=VerdictKind.SKIP, trials=len(observations),
                       reason="no throughput measured (no output tokens, no generation time)")
    mean, n = fmean(samples), len(samples)
    var = (stdev(samples) ** 2 / n) if n > 1 else 0.0
    figures: dict[str, Any] = {"throughput_mean": round(mean, 3), "throughput_stderr": round(math.sqrt(var), 3),
                               "throughput_samples": [round(s, 3) for s in samples], "threshold": cfg.threshold,
                               "confidence": cfg.confidence, "reference": cfg.reference}
    # One spread for the commit's and the good end's runs (the same benchmark on the same host):
    # pooled, it is known from the good end's runs when a step has run once.
    ss, df = squares(samples), float(n - 1)
    if cfg.reference == "good_end":
        ref = [s for s in map(sample_of, reference or []) if s is not None]
        if not ref:
            return Verdict(kind=VerdictKind.SKIP, trials=n, figures=figures,
                           reason="reference good_end: the good end measured no throughput to compare with")
        ss, df = ss + squares(ref), df + len(ref) - 1
        line = cfg.threshold * fmean(ref)
        spread2 = ss / df if df > 0 else 0.0
        var = spread2 * (1 / n + cfg.threshold**2 / len(ref))
        figures["reference_mean"] = round(fmean(ref), 3)
        figures["throughput_stderr"] = round(math.sqrt(var), 3)
    else:
        assert cfg.baseline is not None
        line = cfg.threshold * cfg.baseline
        figures["baseline"] = cfg.baseline
    figures["line"] = round(line, 3)
    half = t_quantile(cfg.confidence, df) * math.sqrt(var) if df > 0 and var > 0 else 0.0
    low, high = mean - half, mean + half
    figures["bounds"] = [round(low, 3), round(high, 3)]
    told = f"{mean:.1f} tokens/s over {n} trial(s) (bounds {low:.1f}-{high:.1f}) against {line:.1f}"
    spread_known = df > 0 or single_is_enough
    if high < line and spread_known:
        return Verdict(kind=VerdictKind.BAD, trials=n, figures=figures, reason=f"{told}: under the line")
    if low >= line and spread_known:
        return Verdict(kind=VerdictKind.GOOD, trials=n, figures=figures, reason=f"{told}: at or over the line")
    figures["not_significant"] = True
    kind = VerdictKind.BAD if mean < line else VerdictKind.GOOD
    return Verdict(kind=kind, trials=n, figures=figures,
                   reason=f"{told}: {kind.value} by its mean (not significant at this confidence: more trials "
                          "would settle it)")
