"""The accuracy oracle's statistics: pure functions of per-sample outcomes (numpy and math only).

Four questions, each answered at the recipe's confidence:

- Does the bad end score lower than the good end? A paired test on the samples both ran: exact
  McNemar on the discordant samples when every sample ran once, a paired z test on the
  per-sample rates when samples repeat.
- Which side is a candidate on? The log likelihood ratio of its outcomes under "it behaves like
  the bad end" against "like the good end", each sample's rate at a side the posterior given
  both ends' runs of it under a joint empirical-Bayes prior (`JointPrior`: how the samples'
  rates spread at each end and how the two ends' rates of a sample go together), each side's
  mean integrated over its error. A likelihood ratio stays valid under optional stopping
  (Ville's inequality: under the good side the chance it ever reaches 1/alpha is at most
  alpha), so a step may stop the moment it crosses a Wald bound and the search may multiply the
  ratios of several steps.
- Is a focused candidate broken elsewhere? Its correct runs on the control samples (those the
  ends agree on) against what the good side's rates given both ends' runs predict
  (`control_p`), not against the good end's own results, which lean high on samples picked
  because the ends agreed.
- Is a score below ``baseline - threshold``? A one-sided interval around the mean of the
  per-sample rates; with several rounds alpha is spent evenly over them (Bonferroni), so looking
  after every round keeps the error rate.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Literal

import numpy as np

from bisect_npu.intervals import wilson_interval
from bisect_npu.observations import SampleOutcome
from bisect_npu.oracle.accuracy.judged import Counts, JudgedRuns
from bisect_npu.oracle.ends_error import NODES, WEIGHTS

# A ratio's share from one sample is clipped here: a sample whose end rates were 0/20 and 20/20 can
# say a lot, never everything (a mislabelled sample must not decide a step alone).
MAX_SAMPLE_LOG_LR = 4.0
# Bounds of the intraclass correlation the prior is fitted to: 0 would make runs of one sample
# independent coin flips (no sample tells anything), 1 would make every sample deterministic.
MIN_RHO, MAX_RHO = 0.05, 0.95


def wald_bound(confidence: float) -> float:
    """|log likelihood ratio| at which a sequential test stops at `confidence` (Wald: log((1-b)/a))."""
    return math.log(confidence / (1.0 - confidence))


# The share of 1 - confidence one candidate step may err with. A named culprit rests on two steps,
# its own (bad) and its parent's (good), and is wrong when either is: half each. The other half
# is the margin for the model itself: the spread of rates and the ends' means a step is judged
# against are estimates, and with answers that are fresh draws a step's ratio creeps up in small
# increments, so Wald's bound is reached with almost no overshoot and its error is met in full.
STEP_ERROR_SHARE = 0.25


def step_bound(confidence: float) -> float:
    """The |log likelihood ratio| at which a candidate's step stops: Wald's bound at
    ``STEP_ERROR_SHARE`` of the error asked."""
    return wald_bound(1.0 - (1.0 - confidence) * STEP_ERROR_SHARE)


# A steering step's error: where a sample's runs repeat (the ends' fitted intraclass correlation
# at least STEER_MIN_RHO), a candidate's step stops at the weaker bound of this error; it only
# steers the search, which names a culprit only once the culprit's and its parent's steps add up
# to `step_bound` (SearchProblem.answer_log_lr: they are asked again while they do not). Below
# that correlation the samples the ends disagree on are mostly the noise of their runs, chosen by
# the very runs their rates are estimated from, and only the full bound's margin keeps the answer
# at the confidence asked: every step stops at `step_bound` there.
STEER_ERROR = 0.16
STEER_MIN_RHO = 0.35


def stop_bound(confidence: float, prior: JointPrior) -> float:
    """The |log likelihood ratio| at which a candidate's step stops: the steering bound where the
    ends' runs show samples that repeat (`STEER_MIN_RHO`) at a steering step's own confidence
    (1 - `STEER_ERROR`, one-sided, from the correlation's standard error), else `step_bound`.
    One run a sample at each end places the correlation only to about 0.15: a point estimate over
    the line would steer histories whose samples barely repeat about as often as not."""
    full = step_bound(confidence)
    if prior.rho - NormalDist().inv_cdf(1.0 - STEER_ERROR) * prior.rho_error < STEER_MIN_RHO:
        return full
    return min(full, wald_bound(1.0 - STEER_ERROR))


def by_id(samples: Sequence[SampleOutcome]) -> dict[str, SampleOutcome]:
    return {s.id: s for s in samples}


def pool(*runs: Sequence[SampleOutcome]) -> list[SampleOutcome]:
    """Several rounds of one commit as one set: each sample's runs added, its rate pooled."""
    pooled: dict[str, SampleOutcome] = {}
    for samples in runs:
        for s in samples:
            seen = pooled.get(s.id)
            if seen is None:
                pooled[s.id] = s
            else:
                total = seen.runs + s.runs
                pooled[s.id] = seen.model_copy(update={"runs": total,
                                                       "correct": (seen.correct_runs + s.correct_runs) / total})
    return list(pooled.values())


@dataclass(frozen=True)
class Score:
    """A commit's accuracy on the samples it ran (in points, 0-100) with its interval."""

    accuracy: float
    low: float
    high: float
    samples: int
    runs: int


def score(samples: Sequence[SampleOutcome], confidence: float) -> Score:
    """The mean of the per-sample rates with a two-sided interval at `confidence`: Wilson when
    every sample ran once, else a normal interval from the spread of the per-sample rates (the
    samples are the unit: runs of one sample are not independent draws of the dataset's score)."""
    n = len(samples)
    runs = sum(s.runs for s in samples)
    if n == 0:
        return Score(0.0, 0.0, 100.0, 0, 0)
    rates = [s.correct for s in samples]
    mean = sum(rates) / n
    if all(s.runs == 1 for s in samples):
        low, high = wilson_interval(round(sum(rates)), n, confidence)
    else:
        z = NormalDist().inv_cdf(0.5 + confidence / 2)
        var = sum((r - mean) ** 2 for r in rates) / max(1, n - 1)
        half = z * math.sqrt(var / n) if n > 1 else 1.0
        low, high = max(0.0, mean - half), min(1.0, mean + half)
    return Score(100 * mean, 100 * low, 100 * high, n, runs)


def mcnemar_exact(worse: int, better: int) -> float:
    """One-sided exact McNemar p-value: P(X >= worse), X ~ Binomial(worse + better, 1/2); `worse`
    counts the samples only the reference got right, `better` those only the other side did."""
    m = worse + better
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, k) for k in range(worse, m + 1))
    return min(1.0, tail / 2.0**m)


def discordant_counts(candidate: Sequence[SampleOutcome], reference: Sequence[SampleOutcome]) -> tuple[int, int]:
    """(worse, better) over the shared samples, one run each: reference right and candidate wrong,
    and the other way round (rates are rounded to whole runs)."""
    ref = by_id(reference)
    worse = better = 0
    for s in candidate:
        r = ref.get(s.id)
        if r is None:
            continue
        mine, theirs = s.correct >= 0.5, r.correct >= 0.5
        worse += theirs and not mine
        better += mine and not theirs
    return worse, better


def paired_rate_p(candidate: Sequence[SampleOutcome], reference: Sequence[SampleOutcome]) -> tuple[float, float]:
    """(mean rate difference candidate - reference, one-sided p of "candidate lower") on the shared
    samples: a paired z test on the per-sample rate differences (exact McNemar when all ran once)."""
    ref = by_id(reference)
    diffs = [s.correct - ref[s.id].correct for s in candidate if s.id in ref]
    if not diffs:
        return 0.0, 1.0
    mean = sum(diffs) / len(diffs)
    shared = [s for s in candidate if s.id in ref]
    if all(s.runs == 1 for s in shared) and all(ref[s.id].runs == 1 for s in shared):
        worse, better = discordant_counts(shared, reference)
        return mean, mcnemar_exact(worse, better)
    var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
    if var == 0:
        return mean, 0.0 if mean < 0 else 1.0
    z = mean / math.sqrt(var / len(diffs))
    return mean, NormalDist().cdf(z)


@dataclass(frozen=True)
class EndsPrior:
    """The beta prior of a sample's correctness rate at each end: mean the end's accuracy,
    strength kappa = 1/rho - 1 with rho the intraclass correlation of runs of one sample (how
    repeatable a sample's result is), fitted from the ends' own data (`fit_prior`), with the
    standard error of that fit where it comes from single runs (0: from repeats, whose spread
    `fit_joint` measures itself)."""

    good_mean: float
    bad_mean: float
    rho: float
    rho_error: float = 0.0
    # One run a sample and no sample right only at the lower end (`_single_run_rho`): the
    # higher end's correlation reads 1, its error only that of a count of none.
    none_lower_only: bool = False

    @property
    def kappa(self) -> float:
        return 1.0 / self.rho - 1.0


def _clip_mean(m: float) -> float:
    return min(0.99, max(0.01, m))


def fit_prior(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome], greedy: bool = False) -> EndsPrior:
    """Empirical Bayes from the two ends' full runs. With repeats, rho by moments: the spread of
    per-sample rates is m(1-m)(1 + (R-1) rho)/R. With one run each, from the samples only the
    lower end got right (`_single_run_rho`; `greedy`: answers at temperature 0)."""
    g, b = by_id(good), by_id(bad)
    shared = [i for i in g if i in b]
    good_mean = _clip_mean(sum(g[i].correct for i in shared) / len(shared)) if shared else 0.5
    bad_mean = _clip_mean(sum(b[i].correct for i in shared) / len(shared)) if shared else 0.5
    estimates = []
    for end, m in ((g, good_mean), (b, bad_mean)):
        runs = [end[i].runs for i in shared]
        if shared and min(runs) >= 2:
            r = sum(runs) / len(runs)
            spread = sum((end[i].correct - m) ** 2 for i in shared) / max(1, len(shared) - 1)
            estimates.append((spread * r / (m * (1 - m)) - 1) / (r - 1))
    if not estimates and shared:
        rho, error = _single_run_rho([g[i] for i in shared], [b[i] for i in shared], good_mean, bad_mean, greedy)
        return EndsPrior(good_mean, bad_mean, min(MAX_RHO, max(MIN_RHO, rho)), error, rho >= 1)
    rho = sum(estimates) / len(estimates) if estimates else 0.5
    return EndsPrior(good_mean, bad_mean, min(MAX_RHO, max(MIN_RHO, rho)))


def _single_run_rho(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome], good_mean: float,
                    bad_mean: float, greedy: bool = False) -> tuple[float, float]:
    """(the intraclass correlation, its standard error) from one run of each sample at each end.
    The lower end is taken as the higher one with some samples broken: a sample the lower end got
    right and the higher end wrong is then one the regression left alone (a broken one, its rate
    near 0, almost never lands there); those are a share lo/hi of all, their mean hi, so that
    share is lo/hi x E[r (1 - r)] = lo (1 - hi)(1 - rho). The same share comes out exactly where
    every rate fell alike (rates r and r lo/hi: the estimate is then the higher end's
    correlation), so it holds whichever way the drop came; mending samples too only adds to it,
    a lower rho: weaker, safer evidence. The error is the binomial one of that count, the count
    taken half a sample up where answers are sampled (Jeffreys): a count of none or few is what a
    correlation near 1 and one of 0.8 both give often on a few hundred samples (0.5 expected at
    one, 2.5 at the other on 200), so it must not read as a spread known exactly. Greedy answers
    (`greedy`, temperature 0) repeat by construction: there the count is taken as it is."""
    hi, lo = max(good_mean, bad_mean), min(good_mean, bad_mean)
    lower_is_bad = bad_mean <= good_mean
    n = len(good)
    only_lower = sum((b if lower_is_bad else g).correct >= 0.5 and (g if lower_is_bad else b).correct < 0.5
                     for g, b in zip(good, bad, strict=True)) / n
    scale = 2 * lo * (1 - hi)
    share = only_lower if greedy else (only_lower * n + 0.5) / (n + 1)
    return 1 - 2 * only_lower / scale, 2 * math.sqrt(share * (1 - share) / n) / scale


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


@dataclass(frozen=True)
class JointPrior:
    """How a sample's correctness rates at the two ends vary over the dataset, jointly: their
    means, their spreads over samples (variances of the rates, not of runs) and how the two move
    together (covariance). The covariance is what makes a sample's runs at one end evidence about
    its rate at the other: a regression that lowers every sample alike leaves the two rates tied
    (a sample the ends disagree on is then mostly noise), one that breaks a few samples unties
    exactly those. Fitted from the ends' own runs (`fit_joint`)."""

    good_mean: float
    bad_mean: float
    good_var: float
    bad_var: float
    cov: float
    # The standard errors of the two spreads' estimates (0: taken as known).
    good_var_error: float = 0.0
    bad_var_error: float = 0.0
    # How many samples both ends ran: the spreads' evidence is weighed per sample (`readings`).
    samples: int = 1
    # The end whose spread was not measured but given the other end's correlation ("good", "bad";
    # None: each measured its own): with one run a sample the lower end (`_single_run_rho`
    # measures the higher end's), with one end repeating its samples and the other not, the other.
    borrowed: str | None = None
    # The standard error of the covariance's estimate (0: taken as known; `fit_joint` gives one
    # where both ends repeated their samples).
    cov_error: float = 0.0
    # The reading of a drop that scaled every sample's rate by one factor: the two rates of a
    # sample tied (their correlation 1), whatever the spreads (`readings`).
    rates_tied: bool = False

    def moved(self, z: float) -> JointPrior:
        """The prior with each end's spread moved `z` standard errors of its estimate (down to the
        floor), the covariance kept within what the moved spreads allow (at it where the rates are
        tied); its spreads then taken as known. The covariance stays as estimated: scaled with the
        spreads, a covariance next to a spread at its floor would tie the two rates on nothing."""
        good_var = max(MIN_VAR, self.good_var + z * self.good_var_error)
        bad_var = max(MIN_VAR, self.bad_var + z * self.bad_var_error)
        most = 0.999 * math.sqrt(good_var * bad_var)
        cov = most if self.rates_tied else min(self.cov, most)
        return JointPrior(self.good_mean, self.bad_mean, good_var, bad_var, cov, cov_error=self.cov_error,
                          rates_tied=self.rates_tied)

    def cov_moved(self, z: float) -> JointPrior:
        """The prior with the covariance moved `z` standard errors of its estimate, kept within 0
        and what the spreads allow (a correlation of at most 1; at it where the rates are tied);
        then taken as known."""
        most = 0.999 * math.sqrt(self.good_var * self.bad_var)
        cov = most if self.rates_tied else min(max(0.0, self.cov + z * self.cov_error), most)
        return replace(self, cov=cov, cov_error=0.0)

    def tied(self) -> JointPrior:
        """The prior with both spreads moved toward one intraclass correlation (`readings`)."""
        return self._tied(self.good_mean * (1 - self.good_mean), self.bad_mean * (1 - self.bad_mean))

    def scaled(self, tie: bool = False) -> JointPrior:
        """The prior with both spreads moved toward one coefficient of variation (`_tied`): a drop
        that scaled every sample's rate by one factor; `tie`: the two rates of a sample tied too,
        at every node of the spreads' error (`rates_tied`)."""
        return self._tied(self.good_mean ** 2, self.bad_mean ** 2, tie)

    def _tied(self, scale_g: float, scale_b: float, tie: bool = False) -> JointPrior:
        """The prior with both spreads moved toward one value of spread / scale, each end's weight
        in the common value its inverse variance, the difference kept by the probability that the
        ends differ at all: the two models (one value for both ends, one each) weighed by their
        evidence, the Schwarz approximation (`_differ_probability`), even odds before; `tie`: the
        two rates of a sample tied too (`_borrowing`). Spreads known (no error) are kept."""
        if self.good_var_error <= 0 or self.bad_var_error <= 0:
            return self
        rho_g, rho_b = self.good_var / scale_g, self.bad_var / scale_b
        weight_g, weight_b = (scale_g / self.good_var_error) ** 2, (scale_b / self.bad_var_error) ** 2
        common = (rho_g * weight_g + rho_b * weight_b) / (weight_g + weight_b)
        keep = _differ_probability(self._tie_chi2(scale_g, scale_b), self.samples)
        good_var = max(MIN_VAR, (common + keep * (rho_g - common)) * scale_g)
        bad_var = max(MIN_VAR, (common + keep * (rho_b - common)) * scale_b)
        most = 0.999 * math.sqrt(good_var * bad_var)
        return replace(self, good_var=good_var, bad_var=bad_var, cov=most if tie else min(self.cov, most),
                       rates_tied=tie)

    def _tie_chi2(self, scale_g: float, scale_b: float) -> float:
        """How far the two ends' values of spread / scale lie apart, in their estimates' variances
        (chi squared with one degree of freedom under one value for both)."""
        rho_g, rho_b = self.good_var / scale_g, self.bad_var / scale_b
        weight_g, weight_b = (scale_g / self.good_var_error) ** 2, (scale_b / self.bad_var_error) ** 2
        return (rho_b - rho_g) ** 2 * weight_g * weight_b / (weight_g + weight_b)

    def _borrowing(self, scale: Callable[[float], float], tie: bool = False) -> JointPrior:
        """The prior with the borrowed end's spread and its error the measured end's at one value
        of spread / scale(mean): mean (1 - mean) one correlation, mean^2 one coefficient of
        variation (a drop that scaled every sample's rate alike); the two rates tied as far as
        the covariance says, or (`tie`) fully: a scaled drop makes each sample's lower rate its
        higher one times one factor, a correlation of 1 between them, which the covariance of
        the ends' runs (one run a sample at one end at least) only estimates, and one read looser
        than the tie makes a focused sample look broken."""
        good_measured = self.borrowed == "bad"
        measured, other = (self.good_mean, self.bad_mean) if good_measured else (self.bad_mean, self.good_mean)
        var, error = (self.good_var, self.good_var_error) if good_measured else (self.bad_var, self.bad_var_error)
        factor = scale(other) / scale(measured)
        other_var, other_error = max(MIN_VAR, var * factor), error * factor
        good_var, bad_var = (var, other_var) if good_measured else (other_var, var)
        most = 0.999 * math.sqrt(good_var * bad_var)
        return replace(self, good_var=good_var, bad_var=bad_var,
                       good_var_error=error if good_measured else other_error,
                       bad_var_error=other_error if good_measured else error,
                       cov=most if tie else min(self.cov, most))

    def readings(self) -> list[JointPrior]:
        """Each way the ends' spreads may go together: one intraclass correlation for both ends (a
        regression that breaks a subset of samples leaves the samples it spared as they were), or
        one coefficient of variation, spread over mean (a regression that scales every sample's
        rate by one factor scales the spread by it too, and keeps the two rates tied). A candidate
        that ran a sample several times shows how its own runs spread, and a step would weigh which
        side's spread fits that: where the ends measured their spreads loosely (two runs a
        sample), a difference that is only their estimates' noise would decide steps, and a tie to
        the wrong one of the two would too (under a scaled drop the lower end's correlation is far
        below the higher end's, a focused sample then mostly noise, not a broken one). Each reading
        ties the spreads as far as the evidence allows (`_tied`). With one run a sample the ends'
        table measures only the means and the covariance, not which way the spreads go, and where
        one end ran its samples once its spread is the other's correlation: one correlation as
        given, or the scaled drop, its rates tied (`_borrowing`). One reading where the two
        coincide or the spreads are known."""
        if self.good_var_error <= 0 and self.bad_var_error <= 0:
            return [self]
        if self.borrowed is not None:
            options = [self._borrowing(lambda m: m * (1 - m)), self._borrowing(lambda m: m * m, tie=True)]
        elif self.good_var_error <= 0 or self.bad_var_error <= 0:
            return [self]
        else:
            options = [self.tied(), self.scaled()]
        first, second = options
        if (math.isclose(first.good_var, second.good_var, rel_tol=1e-3)
                and math.isclose(first.bad_var, second.bad_var, rel_tol=1e-3)):
            return [first]
        return options

    @property
    def rho(self) -> float:
        """The intraclass correlation of runs of one sample, over both ends (the report's figure)."""
        return (self.good_var / (self.good_mean * (1 - self.good_mean))
                + self.bad_var / (self.bad_mean * (1 - self.bad_mean))) / 2

    @property
    def rho_error(self) -> float:
        """The standard error of `rho`: the two spreads' errors on its scale, taken as moving
        together (one run a sample gives both from one count; 0 where the spreads are known)."""
        return (self.good_var_error / (self.good_mean * (1 - self.good_mean))
                + self.bad_var_error / (self.bad_mean * (1 - self.bad_mean))) / 2


def _differ_probability(chi2: float, samples: int) -> float:
    """P(two estimates differ | their difference is chi2 of its variances from 0), the model with
    one parameter more against the one without, by their evidence (`_differ_log_odds`), the two
    models even before."""
    log_odds = _differ_log_odds(chi2, samples)
    return 1 / (1 + math.exp(-log_odds)) if log_odds > -700 else 0.0


def _differ_log_odds(chi2: float, samples: int) -> float:
    """log Bayes factor of "two estimates differ" against "they are one", their difference chi2
    of its variances from 0: the Schwarz approximation, the extra parameter's prior as wide as one
    sample's information, (chi2 - log n) / 2."""
    return (chi2 - math.log(max(1, samples))) / 2


# Floors of the fitted variances: a rate known to within 0.003 of its mean is as sure as any
# evaluation of a few hundred samples can make it.
MIN_VAR = 1e-5


def _moments(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    d = max(1, n - 1)
    return (sum((x - mx) ** 2 for x in xs) / d, sum((y - my) ** 2 for y in ys) / d,
            sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / d)


def fit_joint(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome], greedy: bool = False) -> JointPrior:
    """Empirical Bayes by moments over the samples both ends ran. An end's spread of rates is the
    spread of its per-sample results less the noise of its runs (estimated without bias from each
    sample's own runs, x(1-x)/(R-1), where samples ran at least twice, with the standard error the
    runs' noise leaves in it; from `fit_prior`'s intraclass correlation where they ran once, with
    that estimate's error); the covariance is the results' own, since the noise of one end's runs is
    independent of the other's. The covariance is kept within what the two spreads allow (a
    correlation of at most 1) and at least 0. `greedy`: answers at temperature 0 (`fit_prior`)."""
    g, b = by_id(good), by_id(bad)
    shared = [i for i in g if i in b]
    ends = fit_prior(good, bad, greedy)
    if len(shared) < 2:
        return JointPrior(ends.good_mean, ends.bad_mean, MIN_VAR, MIN_VAR, 0.0)
    xg, xb = [g[i].correct for i in shared], [b[i].correct for i in shared]
    var_g, var_b, cov = _moments(xg, xb)

    def spread(end: dict[str, SampleOutcome], observed: float, mean: float) -> tuple[float, float]:
        """(the spread, its standard error)."""
        runs = [end[i].runs for i in shared]
        if min(runs) >= 2:
            noises = [end[i].correct * (1 - end[i].correct) / (end[i].runs - 1) for i in shared]
            center = sum(end[i].correct for i in shared) / len(shared)
            # The error of the estimate given these samples' rates (the dataset is what a step
            # runs): a sample's deviation d and the noise s of its mean over R runs make its
            # term's variance 4 d^2 s + 2 s^2 R/(R-1) (exact for a binomial mean).
            error = sum(4 * max(0.0, (end[i].correct - center) ** 2 - noise) * noise
                        + 2 * noise ** 2 * end[i].runs / (end[i].runs - 1)
                        for i, noise in zip(shared, noises, strict=True))
            return max(MIN_VAR, observed - sum(noises) / len(shared)), math.sqrt(error) / len(shared)
        return (max(MIN_VAR, min(observed, ends.rho * mean * (1 - mean))),
                min(observed, ends.rho_error * mean * (1 - mean)))

    (sg, error_g), (sb, error_b) = spread(g, var_g, ends.good_mean), spread(b, var_b, ends.bad_mean)
    if ends.rho_error > 0 and not ends.none_lower_only:
        # Both ends ran each sample once: their runs fix the higher end's spread and how the two
        # rates go together (`_single_run_rho`), not the lower end's spread. A drop that lowers
        # every rate alike leaves the lower end's rates the higher's times lo/hi, the least
        # spread that covariance allows (rates tied); broken samples only add to it, and they
        # make a disagreement between the ends tell more. Taken at that least: the weaker
        # evidence, where the same correlation at both ends would read a scaled drop's
        # disagreements as about twice as telling as they are.
        ratio = (min(ends.good_mean, ends.bad_mean) / max(ends.good_mean, ends.bad_mean)) ** 2
        if ends.bad_mean <= ends.good_mean:
            sb, error_b = max(MIN_VAR, ratio * sg), ratio * error_g
        else:
            sg, error_g = max(MIN_VAR, ratio * sb), ratio * error_b
    # One end ran each sample once, the other repeated it (the bad end asked again while the ends'
    # means were too loose): the once-run end's spread is the other's correlation at its own
    # mean, so it carries that correlation's error too, not none.
    scale_g, scale_b = ends.good_mean * (1 - ends.good_mean), ends.bad_mean * (1 - ends.bad_mean)
    if error_g == 0 < error_b and min(g[i].runs for i in shared) == 1:
        error_g = min(var_g, error_b / scale_b * scale_g)
    elif error_b == 0 < error_g and min(b[i].runs for i in shared) == 1:
        error_b = min(var_b, error_g / scale_g * scale_b)
    borrowed = _borrowed(g, b, shared, ends)
    cov_error = _cov_error([g[i] for i in shared], [b[i] for i in shared], (ends.good_mean, sg),
                           (ends.bad_mean, sb)) if borrowed is None and error_g > 0 and error_b > 0 else 0.0
    return JointPrior(ends.good_mean, ends.bad_mean, sg, sb, min(max(0.0, cov), 0.999 * math.sqrt(sg * sb)),
                      error_g, error_b, len(shared), borrowed, cov_error)


def _run_noises(end: Sequence[SampleOutcome], mean: float, spread: float) -> list[float]:
    """Each sample's run noise, the variance of its mean over its R runs, r(1 - r)/R, at the
    sample's rate r given its runs under the end's beta prior (mean, spread): never 0, where the
    unbiased x(1 - x)/(R - 1) is 0 for every sample at 0/R or R/R (most of them near the ceiling
    or the floor), and an error built from it would read those samples' terms as exact."""
    kappa = max(1e-6, mean * (1 - mean) / max(spread, MIN_VAR) - 1)
    alpha, beta = mean * kappa, (1 - mean) * kappa
    noises = []
    for s in end:
        k, wrong = _counts(s)
        a, b = alpha + k, beta + wrong
        noises.append(a * b / ((a + b) * (a + b + 1)) / s.runs)
    return noises


def _cov_error(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome], good_rate: tuple[float, float],
               bad_rate: tuple[float, float]) -> float:
    """The standard error of the covariance's estimate given the samples' rates, as a spread's
    (`fit_joint`): a sample's term (x_g - m_g)(x_b - m_b), its deviations d and its two ends'
    independent run noises s, has variance d_g^2 s_b + d_b^2 s_g + s_g s_b."""
    noise_g = _run_noises(good, *good_rate)
    noise_b = _run_noises(bad, *bad_rate)
    center_g = sum(s.correct for s in good) / len(good)
    center_b = sum(s.correct for s in bad) / len(bad)
    total = 0.0
    for g, b, sg, sb in zip(good, bad, noise_g, noise_b, strict=True):
        dg2 = max(0.0, (g.correct - center_g) ** 2 - sg)
        db2 = max(0.0, (b.correct - center_b) ** 2 - sb)
        total += dg2 * sb + db2 * sg + sg * sb
    return math.sqrt(total) / len(good)


def _borrowed(g: dict[str, SampleOutcome], b: dict[str, SampleOutcome], shared: list[str],
              ends: EndsPrior) -> str | None:
    """Which end's spread `fit_prior` gave from the other's correlation (`JointPrior.borrowed`)."""
    good_repeats, bad_repeats = min(g[i].runs for i in shared) >= 2, min(b[i].runs for i in shared) >= 2
    if good_repeats == bad_repeats:
        return None if good_repeats else ("bad" if ends.bad_mean <= ends.good_mean else "good")
    return "bad" if good_repeats else "good"


@dataclass(frozen=True)
class SideRates:
    """A sample's rate at each side given both ends' runs: (mean, variance) per side."""

    good: tuple[float, float]
    bad: tuple[float, float]


def _noise(mean: float, spread: float, runs: int) -> float:
    """The variance of an end's observed rate around the sample's true rate: E[r(1-r)]/R."""
    return max(MIN_VAR, mean * (1 - mean) - spread) / runs


def side_rates(prior: JointPrior, good: SampleOutcome | None, bad: SampleOutcome | None) -> SideRates:
    """The two rates' posterior given the runs each end made of this sample (either may be
    missing), integrated exactly on a grid (`_given_runs`): one end's rate a beta of its prior
    moments, the other's a beta around the linear regression on it (the covariance), each end's
    runs binomial in its own rate. Near the ceiling a rate's mass piles at 1, and a normal update
    with a beta fitted to its moments afterwards read a focused sample's k of n there by the wrong
    noise, several units of log likelihood a step. The end with the larger mean is the one the
    other regresses on (a scaled drop makes the lower rate a fraction of the higher, which a
    regression the other way round would let reach past it); with equal means both ways round,
    met halfway, so swapping the ends only swaps the sides."""
    return _side_rates(prior, _counts(good), _counts(bad))


def judged_side_rates(prior: JointPrior, good: SampleOutcome | None, bad: SampleOutcome | None,
                      judged: JudgedRuns | None, sample_id: str) -> SideRates:
    """`side_rates` with the runs of the candidates already judged on each side added to the
    ends' (`judged.JudgedRuns`, weighed by how sure each side is)."""
    if not judged:
        return side_rates(prior, good, bad)
    return _side_rates(prior, judged.added("good", sample_id, _counts(good)),
                       judged.added("bad", sample_id, _counts(bad)))


@functools.lru_cache(maxsize=65536)
def _side_rates(prior: JointPrior, good: Counts, bad: Counts) -> SideRates:
    """`side_rates` by the ends' (correct, wrong) runs: a search asks the same few counts of one
    prior again at every step."""
    if good == bad == (0, 0):
        return SideRates(_as_rate(prior.good_mean, prior.good_var), _as_rate(prior.bad_mean, prior.bad_var))
    good_end = (prior.good_mean, prior.good_var, good)
    bad_end = (prior.bad_mean, prior.bad_var, bad)
    if prior.good_mean > prior.bad_mean:
        good_rate, bad_rate = _given_runs(good_end, bad_end, prior.cov)
    elif prior.bad_mean > prior.good_mean:
        bad_rate, good_rate = _given_runs(bad_end, good_end, prior.cov)
    else:
        g1, b1 = _given_runs(good_end, bad_end, prior.cov)
        b2, g2 = _given_runs(bad_end, good_end, prior.cov)
        good_rate, bad_rate = _halfway(g1, g2), _halfway(b1, b2)
    return SideRates(_as_rate(*good_rate), _as_rate(*bad_rate))


_End = tuple[float, float, Counts]

# Gauss-Legendre nodes and log weights on [0, 1] (`_half_nodes`), and how far below a half's
# edge (in log distance to its end of the range) they reach before the rest is one node.
_LEGENDRE = np.polynomial.legendre.leggauss(32)
_UNIT = (_LEGENDRE[0] + 1) / 2
_UNIT_LOG_WEIGHTS = np.log(_LEGENDRE[1] / 2)
_LOG_REACH = 14.0


def _beta_nodes(rate: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log r, log(1 - r), log weight) of nodes integrating the beta of these moments (its
    normalizing constant left out), the range split at the mean (`_half_nodes`)."""
    mean, var = rate
    kappa = mean * (1 - mean) / var - 1
    alpha, beta = mean * kappa, (1 - mean) * kappa
    low, low_rest, low_w = _half_nodes(math.log(mean), alpha, beta)
    high_rest, high, high_w = _half_nodes(math.log(1 - mean), beta, alpha)
    return np.concatenate([low, high]), np.concatenate([low_rest, high_rest]), np.concatenate([low_w, high_w])


def _half_nodes(log_edge: float, near: float, far: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One half of a beta's range, x from 0 (this end) to the mean's distance from it, density
    x^(near-1) (1-x)^(far-1): (log x, log(1 - x), log weight), Gauss-Legendre in log x over
    `_LOG_REACH` below the edge (less where x^near has fallen e^-40 by then) and the rest below
    one node at its mean (x^near / near there).
    In log x a density piled at this end (near under 1, a rate at the ceiling) is as smooth as
    one spread out, and the nodes reach as close to the end as the runs can tell apart."""
    reach = min(_LOG_REACH, 40 / near)
    log_x = log_edge - reach * _UNIT
    log_weights = _UNIT_LOG_WEIGHTS + math.log(reach) + near * log_x
    log_tail = log_edge - reach
    log_x = np.append(log_x, log_tail + math.log(near / (near + 1)))
    log_weights = np.append(log_weights, near * log_tail - math.log(near))
    log_rest = np.log1p(-np.exp(log_x))
    return log_x, log_rest, log_weights + (far - 1) * log_rest


def _counts(end: SampleOutcome | None) -> tuple[int, int]:
    """(correct, wrong) runs of an end on a sample; none where it did not run it."""
    if end is None or end.runs <= 0:
        return 0, 0
    k = round(end.correct * end.runs)
    return k, end.runs - k


def _given_runs(base: _End, other: _End, cov: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """(base end's, other end's) rate posterior (mean, variance): the base rate r a beta of its
    prior moments, the other rate given r a beta with mean its prior mean moved by the regression
    on r and the variance the regression leaves; both ends' runs binomial in their own rates."""
    base_mean, base_var, base_runs = base
    other_mean, other_var, other_runs = other
    log_r, log_rest, log_w = _beta_nodes(_as_rate(base_mean, base_var))
    r = np.exp(log_r)
    k, wrong = base_runs
    slope = cov / base_var if base_var > 0 else 0.0
    mean = np.clip(other_mean + slope * (r - base_mean), 0.005, 0.995)
    var = np.minimum(max(MIN_VAR, other_var - slope * cov), 0.9 * mean * (1 - mean))
    kappa = mean * (1 - mean) / var - 1
    alpha, beta = mean * kappa, (1 - mean) * kappa
    other_k, other_wrong = other_runs
    # log B(alpha + k, beta + n - k) / B(alpha, beta)
    log_pred = (_log_rising(alpha, other_k) + _log_rising(beta, other_wrong)
                - _log_rising(alpha + beta, other_k + other_wrong))
    log_post = log_w + k * log_r + wrong * log_rest + log_pred
    weight = np.exp(log_post - log_post.max())
    weight /= weight.sum()
    base_post = float(weight @ r), float(weight @ (r * r))
    a, b = alpha + other_k, beta + other_wrong
    other_each = a / (a + b)
    other_second = other_each * (a + 1) / (a + b + 1)
    other_post = float(weight @ other_each), float(weight @ other_second)
    return ((base_post[0], base_post[1] - base_post[0] ** 2),
            (other_post[0], other_post[1] - other_post[0] ** 2))


_lgamma = np.vectorize(math.lgamma, otypes=[float])


def _log_rising(x: np.ndarray, count: float) -> np.ndarray:
    """log x (x + 1) ... (x + count - 1), lgamma(x + count) - lgamma(x): a product for the whole
    runs, lgamma for a weighed run's fraction (`judged`)."""
    whole = int(count)
    product: np.ndarray = sum((np.log(x + j) for j in range(whole)), np.zeros_like(x))
    if count > whole:
        rest: np.ndarray = _lgamma(x + count) - _lgamma(x + whole)
        product = product + rest
    return product


def _halfway(one: tuple[float, float], two: tuple[float, float]) -> tuple[float, float]:
    """The even mixture of two posteriors' (mean, variance)."""
    mean = (one[0] + two[0]) / 2
    return mean, (one[1] + one[0] ** 2 + two[1] + two[0] ** 2) / 2 - mean * mean


def _as_rate(mean: float, var: float) -> tuple[float, float]:
    """A posterior moved back into a rate's range: the mean within [0.005, 0.995], the variance
    below what a beta with that mean can hold."""
    m = min(0.995, max(0.005, mean))
    return m, min(max(var, MIN_VAR), 0.9 * m * (1 - m))


def log_predictive(k: float, n: int, rate: tuple[float, float]) -> float:
    """log P(k of n correct | the side's rate (mean, variance)), beta-binomial by moments (the
    binomial coefficient left out: it cancels in a ratio)."""
    mean, var = rate
    kappa = mean * (1 - mean) / var - 1
    alpha, beta = mean * kappa, (1 - mean) * kappa
    return _log_beta(alpha + k, beta + n - k) - _log_beta(alpha, beta)


def sample_log_lr(candidate: SampleOutcome, good: SampleOutcome | None, bad: SampleOutcome | None,
                  prior: JointPrior) -> float:
    """One sample's log P(outcome | bad side) - log P(outcome | good side), clipped."""
    k, n = candidate.correct_runs, candidate.runs
    rates = side_rates(prior, good, bad)
    return _clip(log_predictive(k, n, rates.bad) - log_predictive(k, n, rates.good))


def _clip(log_lr: float) -> float:
    return max(-MAX_SAMPLE_LOG_LR, min(MAX_SAMPLE_LOG_LR, log_lr))


# Where each end's mean rate may really lie, given how many samples measured it (`NODES`).
_LOG_WEIGHTS = tuple(math.log(w / math.sqrt(2 * math.pi)) for w in WEIGHTS)


def mean_errors(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
                prior: JointPrior | None = None) -> tuple[float, float]:
    """The standard error of each end's mean rate from the noise of its runs alone: a candidate
    runs the same samples, so how the samples' rates spread cancels in the comparison, while
    the ends' run noise is shared by every sample of a step."""
    prior = prior or fit_joint(good, bad)

    def error(end: Sequence[SampleOutcome], mean: float, spread: float) -> float:
        if not end:
            return 0.0
        return math.sqrt(sum(_noise(mean, spread, s.runs) for s in end)) / len(end)

    return error(good, prior.good_mean, prior.good_var), error(bad, prior.bad_mean, prior.bad_var)


def looser_end(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
               ) -> tuple[Literal["good", "bad"], float, float]:
    """Which end's mean rate is the less known (`mean_errors`; the good end on a tie), with both
    errors: every candidate is placed between the ends' means, so while the drop between them is
    unclear another round of the looser end tells more than another of the other."""
    good_error, bad_error = mean_errors(good, bad)
    return ("good" if good_error >= bad_error else "bad"), good_error, bad_error


def control_p(candidate: Sequence[SampleOutcome], good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
              prior: JointPrior, confidence: float | None = None) -> tuple[float, float]:
    """(mean of the candidate's rates less the good side's expected ones, one-sided p of "fewer
    correct runs than a good commit gives") on the control samples it ran. The reference is each
    sample's good-side rate given both ends' runs (`side_rates`), not the good end's own results:
    samples are picked because the ends' runs agreed, so where runs barely repeat the good end's
    results on them lean high by selection, while the posterior rate accounts for that choice
    (and where answers repeat it is the good end's result). Exact: the beta-binomial counts of
    the samples convolved, the good side's mean integrated over its error (`mean_errors`, `NODES`)
    as a step's likelihoods are, since that error is shared by every sample.
    Where the good end ran its samples once and a `confidence` is given, the good side's mean is
    taken at the low end of its error instead (`step_bound`'s share of 1 - confidence, one-sided):
    that error is shared by every step too, so integrated at one step's level a good end read
    high by chance flags every good commit at once."""
    g, b = by_id(good), by_id(bad)
    rows = [(round(s.correct_runs), s.runs, side_rates(prior, g.get(s.id), b.get(s.id)).good)
            for s in candidate if s.runs > 0]
    if not rows:
        return 0.0, 1.0
    diff = sum(k / n - rate[0] for k, n, rate in rows) / len(rows)
    observed = sum(k for k, _, _ in rows)
    error = mean_errors(good, bad, prior)[0]
    if confidence is not None and good and min(s.runs for s in good) == 1:
        low = NormalDist().inv_cdf(1.0 - (1.0 - confidence) * STEP_ERROR_SHARE)
        return diff, min(1.0, _lower_tail(rows, observed, -low * error))
    tail = sum(w * _lower_tail(rows, observed, z * error) for z, w in zip(NODES, WEIGHTS, strict=True))
    return diff, min(1.0, tail / math.sqrt(2 * math.pi))


def _lower_tail(rows: Sequence[tuple[int, int, tuple[float, float]]], observed: int, shift: float) -> float:
    """P(at most `observed` correct runs in all), each sample's count beta-binomial at its rate
    moved by `shift` (counts above `observed` dropped as they come: they cannot reach the tail)."""
    pmf = np.ones(1)
    for _, n, rate in rows:
        r = _as_rate(rate[0] + shift, rate[1])
        choose = _log_choose(n)
        pmf = np.convolve(pmf, np.exp([choose[j] + log_predictive(j, n, r) for j in range(n + 1)]))[:observed + 1]
    return float(pmf.sum())


# An end's mean is known well enough once its standard error is at most this share of the drop
# between the ends: candidates are placed between the two means, so the drop must stand clear of
# either end's error.
ENDS_ERROR_SHARE = 0.2
# Where an end ran its samples once, the drop that share is taken of is the measured one less this
# many standard errors of the difference (`ends_known`).
ENDS_DROP_ERRORS = 2.0


def ends_known(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome]) -> bool:
    """Whether both ends' mean rates are known to within ``ENDS_ERROR_SHARE`` of the drop. Where
    either end ran its samples once, of the drop's lower bound (``ENDS_DROP_ERRORS`` standard
    errors of the difference below the measured drop): an end off by chance in the drop's
    direction makes the drop read large and so itself look known, and every candidate then leans
    one way. One run a sample leaves an end's mean its widest error against the drop (a fifth of
    a 12-point drop at 200 fresh draws); with repeats the measured drop is kept, since there the
    bound would run an end again on about half the histories for an error already small."""
    if not good or not bad:
        return False
    drop = abs(sum(s.correct for s in good) / len(good) - sum(s.correct for s in bad) / len(bad))
    good_error, bad_error = mean_errors(good, bad)
    if min(s.runs for s in (*good, *bad)) == 1:
        drop -= ENDS_DROP_ERRORS * math.hypot(good_error, bad_error)
    return max(good_error, bad_error) <= ENDS_ERROR_SHARE * drop


def _node_log_liks(outcomes: Sequence[tuple[float, int, tuple[float, float]]], error: float) -> list[float]:
    """log P(a step's outcomes | one side, that side's mean z_k errors off its estimate), per
    node k: one shift for every sample at once, since they share it."""
    return [sum(log_predictive(k, n, _as_rate(rate[0] + z * error, rate[1])) for k, n, rate in outcomes)
            for z in NODES]


def _integrated(node_log_liks: Sequence[float]) -> float:
    """The node terms integrated over the error (the Gauss-Hermite weights)."""
    return _log_sum_exp([log_w + t for log_w, t in zip(_LOG_WEIGHTS, node_log_liks, strict=True)])


def _log_sum_exp(terms: Sequence[float]) -> float:
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


# Where the ends' spreads of rates may really lie, given their estimates (`JointPrior.moved`):
# (z, log weight), Gauss-Hermite with 3 nodes. Each step's likelihoods are averaged over them:
# a spread that came out high by chance at one end pulls that end's predicted rates of the
# samples it happened to get wrong (the very samples focusing picks) toward those results, and
# a candidate on that end's side would then sit between the two sides' predictions.
_SPREAD_NODES = ((-math.sqrt(3.0), math.log(1 / 6)), (0.0, math.log(2 / 3)), (math.sqrt(3.0), math.log(1 / 6)))


def _spread_nodes(reading: JointPrior) -> list[tuple[float, JointPrior]]:
    """(log weight, prior) over one reading's spreads' nodes; the reading alone where its spreads
    are known."""
    if reading.good_var_error == 0 and reading.bad_var_error == 0:
        spreads = [(0.0, reading)]
    else:
        spreads = [(log_w, reading.moved(z)) for z, log_w in _SPREAD_NODES]
    if reading.cov_error == 0 or reading.rates_tied:
        return spreads
    return [(log_w + log_v, moved.cov_moved(z)) for log_w, moved in spreads for z, log_v in _SPREAD_NODES]


# The most a reading the ends' spreads rule out may still hold, as a share of a step's error
# (`evident_readings`): a step that leans on the other reading alone errs by at most a tenth more.
READING_ERROR_SHARE = 0.1


def evident_readings(prior: JointPrior, confidence: float | None = None) -> list[JointPrior]:
    """The readings a step weighs (`JointPrior.readings`), less one the ends' own spreads rule out.
    Where both ends repeated their samples, their spreads weigh the readings themselves: three
    models of them, one correlation for both ends, one coefficient of variation for both, each
    end its own (the two readings read that one alike), each tie against the spreads apart by
    the Schwarz approximation as `_differ_probability` weighs it, even odds between tied and
    apart and between the two ties. A reading whose tie keeps at most `READING_ERROR_SHARE` of a
    step's error at `confidence` (`STEP_ERROR_SHARE` of 1 - confidence) is dropped: the other
    reading's tie holds then, or the spreads are apart and the two read them alike, and leaning
    on the other reading alone errs that much more at most.
    Where one end borrowed the other's spread (one run a sample) the ends' table cannot tell the
    readings apart, and without a confidence there is no margin to spend: both are weighed, as
    where the evidence is unclear."""
    readings = prior.readings()
    if len(readings) < 2 or prior.borrowed is not None or confidence is None:
        return readings
    chi2 = (prior._tie_chi2(prior.good_mean * (1 - prior.good_mean), prior.bad_mean * (1 - prior.bad_mean)),
            prior._tie_chi2(prior.good_mean ** 2, prior.bad_mean ** 2))
    # log posterior weights: each tie 1/4 x its Schwarz evidence against the spreads apart, apart 1/2
    log_ties = [-_differ_log_odds(c, prior.samples) + math.log(0.25) for c in chi2]
    total = _log_sum_exp([*log_ties, math.log(0.5)])
    kept, dropped = (0, 1) if chi2[0] <= chi2[1] else (1, 0)
    if log_ties[dropped] - total <= math.log((1.0 - confidence) * STEP_ERROR_SHARE * READING_ERROR_SHARE):
        # The scaled drop left alone is read as the drop it is: each sample's lower rate its
        # higher one times one factor, the two tied. With the covariance as measured a sample's
        # bad-side rate could sit below that factor times its good-side one (the bad end's spread
        # less the covariance's share, a small difference of two estimates), and a sample the
        # bad end missed by chance read as broken.
        return [readings[0] if kept == 0 else prior.scaled(tie=True)]
    return readings


@dataclass(frozen=True)
class StepEvidence:
    """A candidate step's log likelihood ratio, and (when that ratio is the integrated one) its
    log likelihoods per node of each end mean's error (`NODES`, one common constant dropped), for
    a search that integrates the shared ends' error once over all its steps."""

    log_lr: float
    good_nodes: tuple[float, ...] = ()
    bad_nodes: tuple[float, ...] = ()


def step_evidence(candidate: Sequence[SampleOutcome], good: Sequence[SampleOutcome],
                  bad: Sequence[SampleOutcome], prior: JointPrior | None = None,
                  confidence: float | None = None, judged: JudgedRuns | None = None) -> StepEvidence:
    """log P(candidate | bad side) - log P(candidate | good side) over the samples it ran: > 0
    says bad, < 0 good. Samples are independent given the side and its mean; each side's mean is
    integrated over its standard error (`mean_errors`), so a step cannot be surer than the ends'
    own measurement allows. A sample neither end ran predicts each side's mean. The answer is
    the weaker of that and the sum of the per-sample ratios clipped (`sample_log_lr`); the node
    terms come with it when it is the integrated one. Both are averaged over where the ends'
    spreads may lie (`_SPREAD_NODES`): each side's likelihood as a mixture, the clipped ratio as
    the ratio of the mixtures is (each spread's ratio weighed by that spread's posterior). Where
    the ends' spreads may be read two ways (`JointPrior.readings`) the step is as sure as the
    less sure reading, and says nothing where they disagree: one reading holds for every step
    of a search, so a step must not lean on whichever suits its own candidate best.
    ``judged``: the runs of the candidates already judged, added to the ends' for the side rates
    only (`judged_side_rates`); the prior, the ends' means and their errors stay the ends'."""
    prior = prior or fit_joint(good, bad)
    if not candidate:
        return StepEvidence(0.0)
    errors = mean_errors(good, bad, prior)
    each = [_reading_evidence(candidate, by_id(good), by_id(bad), _spread_nodes(reading), errors, judged)
            for reading in evident_readings(prior, confidence)]
    if any(e.log_lr * each[0].log_lr <= 0 for e in each):
        return StepEvidence(0.0)
    return min(each, key=lambda e: abs(e.log_lr))


def _reading_evidence(candidate: Sequence[SampleOutcome], g: dict[str, SampleOutcome], b: dict[str, SampleOutcome],
                      spreads: list[tuple[float, JointPrior]], errors: tuple[float, float],
                      judged: JudgedRuns | None = None) -> StepEvidence:
    """A step's evidence under one reading of the ends' spreads, over its spreads' nodes."""
    error_good, error_bad = errors
    clipped_at, good_at, bad_at = [], [], []
    for _, moved in spreads:
        outcomes_good: list[tuple[float, int, tuple[float, float]]] = []
        outcomes_bad: list[tuple[float, int, tuple[float, float]]] = []
        clipped = 0.0
        for s in candidate:
            rates = judged_side_rates(moved, g.get(s.id), b.get(s.id), judged, s.id)
            clipped += _clip(log_predictive(s.correct_runs, s.runs, rates.bad)
                             - log_predictive(s.correct_runs, s.runs, rates.good))
            outcomes_good.append((s.correct_runs, s.runs, rates.good))
            outcomes_bad.append((s.correct_runs, s.runs, rates.bad))
        clipped_at.append(clipped)
        good_at.append(_node_log_liks(outcomes_good, error_good))
        bad_at.append(_node_log_liks(outcomes_bad, error_bad))
    log_ws = [log_w for log_w, _ in spreads]
    nodes_good = [_log_sum_exp([w + at[k] for w, at in zip(log_ws, good_at, strict=True)]) for k in range(len(NODES))]
    nodes_bad = [_log_sum_exp([w + at[k] for w, at in zip(log_ws, bad_at, strict=True)]) for k in range(len(NODES))]
    integrated = _integrated(nodes_bad) - _integrated(nodes_good)
    # The ratio of the mixtures is each spread's ratio averaged under either side's posterior of
    # the spreads (the good side's, or inverted, the bad side's); clipped ratios are averaged
    # both ways and the two met halfway, so swapping the ends only flips the sign.
    on_good = [w + _integrated(at) for w, at in zip(log_ws, good_at, strict=True)]
    on_bad = [w + _integrated(at) for w, at in zip(log_ws, bad_at, strict=True)]
    by_good = _log_sum_exp([t + c for t, c in zip(on_good, clipped_at, strict=True)]) - _log_sum_exp(on_good)
    by_bad = _log_sum_exp([t - c for t, c in zip(on_bad, clipped_at, strict=True)]) - _log_sum_exp(on_bad)
    clipped = (by_good - by_bad) / 2
    if integrated * clipped <= 0:
        return StepEvidence(0.0)
    if abs(clipped) <= abs(integrated):
        return StepEvidence(clipped)
    top = max(*nodes_good, *nodes_bad)
    return StepEvidence(integrated, tuple(t - top for t in nodes_good), tuple(t - top for t in nodes_bad))


def log_likelihood_ratio(candidate: Sequence[SampleOutcome], good: Sequence[SampleOutcome],
                         bad: Sequence[SampleOutcome], prior: JointPrior | None = None) -> float:
    """The step's ratio alone (`step_evidence`)."""
    return step_evidence(candidate, good, bad, prior).log_lr


@dataclass(frozen=True)
class BaselineCheck:
    """The one-sample test against ``baseline - threshold`` (points)."""

    verdict: str | None  # "good", "bad", or None: not clear yet at this confidence
    line: float
    score: Score
    alpha: float


@functools.lru_cache(maxsize=64)
def _log_choose(n: int) -> tuple[float, ...]:
    """log C(n, j) for j = 0..n: the bounds' root search asks the same n's coefficients at every p."""
    return tuple(math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) for j in range(n + 1))


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k), X ~ Binomial(n, p), summed in log space (n in the thousands is fine)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    choose = _log_choose(n)
    terms = [choose[j] + j * log_p + (n - j) * log_q for j in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def clopper_pearson(correct: int, n: int, alpha: float) -> tuple[float, float]:
    """Exact one-sided bounds at level alpha each: the rates whose binomial tail at `correct` is alpha."""
    def solve(tail_above: bool) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            tail = 1 - binomial_cdf(correct - 1, n, mid) if tail_above else binomial_cdf(correct, n, mid)
            if (tail < alpha) == tail_above:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    low = 0.0 if correct == 0 else solve(tail_above=True)
    high = 1.0 if correct == n else solve(tail_above=False)
    return low, high


def baseline_check(samples: Sequence[SampleOutcome], baseline: float, threshold: float, confidence: float,
                   rounds_planned: int = 1) -> BaselineCheck:
    """Bad when the score's upper bound is below ``baseline - threshold``, good when its lower bound
    is at or above it, each one-sided at `confidence` with alpha spent evenly over the planned
    rounds (so looking after every round keeps the error rate); otherwise undecided. One run per
    sample: exact (Clopper-Pearson) bounds; rates: the normal bounds of `score`."""
    alpha = (1 - confidence) / rounds_planned
    s = score(samples, 1 - 2 * alpha)  # a two-sided (1 - 2 alpha) interval: each side one-sided at 1 - alpha
    if samples and all(x.runs == 1 for x in samples):
        low, high = clopper_pearson(round(sum(x.correct for x in samples)), len(samples), alpha)
        s = Score(s.accuracy, 100 * low, 100 * high, s.samples, s.runs)
    line = baseline - threshold
    verdict = "bad" if s.high < line else "good" if s.low >= line else None
    return BaselineCheck(verdict, line, s, alpha)


def flipped(good: Mapping[str, SampleOutcome], bad: Mapping[str, SampleOutcome],
            limit: int = 5) -> list[dict[str, object]]:
    """The samples the good end got right and the bad end wrong, largest drop first: the bad case
    for the user, with both answers."""
    drops = sorted(((g.correct - bad[i].correct, i) for i, g in good.items() if i in bad
                    and g.correct > bad[i].correct), key=lambda t: (-t[0], t[1]))
    shown = []
    for drop, i in drops[:limit]:
        g, b = good[i], bad[i]
        shown.append({"id": i, "drop": round(drop, 4), "good_correct": g.correct, "bad_correct": b.correct,
                      "prompt": _excerpt(g.prompt or b.prompt), "target": _excerpt(g.target or b.target),
                      "good_output": _excerpt(g.output), "bad_output": _excerpt(b.output),
                      "bad_finish_reason": b.finish_reason})
    return shown


def _excerpt(text: str | None, chars: int = 300) -> str | None:
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 1] + "…"
