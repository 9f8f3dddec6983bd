"""When a step's throughput trials may stop: as soon as its verdict is sure, and at the good end
as soon as its mean is known well enough to draw the line.

Why: a throughput drop of several run-to-run spreads shows in one or two runs, and a nightly run
is a server start and thousands of requests; a fixed count spends most of them on commits whose
verdict was sure after the first. After each run the step's log likelihood ratio is taken again
(good: at the good end's mean; bad: somewhere under the line, and mostly at the bad end's mean
once the bad end has run, `log_likelihood_ratio`), with Student's t on a spread pooled with the
ends' runs, so few runs never say more than they hold. Every commit runs on the same host, so a
session that knows all its runs pools the within-commit spread of every commit it ran
(`Spread`, `pooled_spread`): the degrees of freedom grow with the session, and a step's ratio nears
the one a known spread would give. The step stops once the ratio is past
`STEP_BOUND` either way, or at its count; the search (likelihood mode) weighs every step's ratio
in its posterior and asks a commit again while that is not sure, so the step itself need not be.
Every step is measured against the same ends, so their means' error is shared: a step's verdict
also carries its likelihoods given each end's mean at the Gauss-Hermite nodes of that error
(figure `ends_error_nodes`), and the search integrates the error once over all steps together
instead of counting it in each step's ratio apart.

The good end's mean is every step's line and its runs are the pooled spread's first degrees of
freedom: it runs at least `REFERENCE_MIN_TRIALS` and then until the standard error of its mean is
at most `REFERENCE_PRECISION` of the gap between it and the line, at most its count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean, stdev
from typing import Literal

from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.ends_error import NODES
from bisect_npu.oracle.throughput import ThroughputConfig, judge_throughput, sample_of, squares

STEP_BOUND = 3.5
BAD_DROPS = (0.0, 2.0)  # where a bad commit's mean may lie, in gaps under the line
AT_BAD_END = 0.95  # the bad hypothesis's weight at the bad end's mean, once it has run
BAD_POINTS = 9
REFERENCE_MIN_TRIALS = 6
REFERENCE_PRECISION = 1 / 3

Stop = Literal["sure good", "sure bad", "cap", "nothing measured", "reference known"]


@dataclass(frozen=True)
class Spread:
    """The run-to-run spread pooled over commits: the sum of squared deviations from each commit's
    own mean, and its degrees of freedom (runs less one per commit)."""

    squares: float = 0.0
    df: int = 0


def pooled_spread(groups: Iterable[Sequence[float]]) -> Spread:
    """The spread pooled over each group's runs (one group a commit; a single run adds nothing)."""
    kept = [g for g in groups if len(g) >= 2]
    return Spread(sum(squares(g) for g in kept), sum(len(g) - 1 for g in kept))


def throughputs(observations: Iterable[Observation]) -> list[float]:
    """The throughput samples of the observations that measured one."""
    return [s for s in map(sample_of, observations) if s is not None]


def _t_log_pdf(t: float, df: float) -> float:
    """log of Student's t density at `t`, less its constant (which cancels in a ratio)."""
    return -(df + 1) / 2 * math.log1p(t * t / df)


def log_likelihood_ratio(cfg: ThroughputConfig, samples: Sequence[float], reference: Sequence[float],
                         bad_end: Sequence[float] = (), others: Spread | None = None) -> float | None:
    """log P(samples | bad) - log P(samples | good). Good: at the good end's mean. Bad: anywhere
    from the line to `BAD_DROPS[1]` gaps under it (a gap: the good end's mean less the line),
    evenly likely, since the recipe's threshold calls every mean under the line bad; and, once the
    bad end has run (`bad_end`), with weight `AT_BAD_END` at the bad end's mean, where a bisected
    history's bad side sits. Student's t on the samples' mean, the spread pooled with the ends'
    runs (`others`, where given: the spread of every other commit the session ran, the ends
    included) and the ends' own errors counted, so a step on few runs never says more than they
    hold. None where no spread is known yet (one run in all)."""
    terms = step_terms(cfg, samples, reference, bad_end, others)
    return None if terms is None else terms.log_lr


@dataclass(frozen=True)
class StepTerms:
    """A step's ratio, and log P(its samples' mean | the side, that side's end mean at node k)
    for the Gauss-Hermite nodes `NODES` over each end mean's error (`good`, `bad`): every step
    is measured against the same ends, so the search integrates their error once over all steps
    (search.Weight) instead of each step counting it apart."""

    log_lr: float
    good: tuple[float, ...]
    bad: tuple[float, ...]


def _log_sum(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def step_terms(cfg: ThroughputConfig, samples: Sequence[float], reference: Sequence[float],
               bad_end: Sequence[float] = (), others: Spread | None = None) -> StepTerms | None:
    """The step's ratio (`log_likelihood_ratio`) and its node terms; None where no spread is known."""
    if not samples or not reference:
        return None
    pool = others if others is not None else pooled_spread([reference, bad_end])
    df = len(samples) - 1 + pool.df
    if df < 1:
        return None
    good, mean = fmean(reference), fmean(samples)
    line = cfg.threshold * good
    spread2 = (squares(samples) + pool.squares) / df
    stderr = math.sqrt(spread2 * (1 / len(samples) + 1 / len(reference)))
    if stderr <= 0:
        llr = math.copysign(math.inf, line - mean)
        return StepTerms(llr, (), ())
    own = math.sqrt(spread2 / len(samples))  # the samples' mean's error alone, an end's mean given

    def log_t(at: float, scale: float) -> float:
        return _t_log_pdf((mean - at) / scale, df) - math.log(scale)

    low, high = BAD_DROPS
    bad_means = [line - (good - line) * (low + (high - low) * j / (BAD_POINTS - 1)) for j in range(BAD_POINTS)]
    under_line = [log_t(bad, stderr) - math.log(BAD_POINTS) for bad in bad_means]
    good_nodes = tuple(log_t(good + z * math.sqrt(spread2 / len(reference)), own) for z in NODES)
    if bad_end:
        under_line = [v + math.log(1 - AT_BAD_END) for v in under_line]
        at_bad = math.sqrt(spread2 * (1 / len(samples) + 1 / len(bad_end)))
        bad_llr = _log_sum([*under_line, log_t(fmean(bad_end), at_bad) + math.log(AT_BAD_END)])
        bad_error = math.sqrt(spread2 / len(bad_end))
        bad_nodes = tuple(_log_sum([*under_line, log_t(fmean(bad_end) + z * bad_error, own) + math.log(AT_BAD_END)])
                          for z in NODES)
    else:
        bad_llr = _log_sum(under_line)
        bad_nodes = (bad_llr,) * len(NODES)
    return StepTerms(bad_llr - log_t(good, stderr), good_nodes, bad_nodes)


def judge_sequential(cfg: ThroughputConfig, observations: Sequence[Observation],
                     reference: Sequence[Observation] | None, tried: int, cap: int,
                     bad_end: Sequence[Observation] = (), others: Spread | None = None,
                     ) -> tuple[Verdict, Stop | None]:
    """A candidate's verdict from its trials so far (`tried` of them run, crashed ones included),
    and why its step stops (None: run one more): its likelihood ratio past `STEP_BOUND` either way,
    or the cap (the search's posterior weighs the ratio either way). `others`: the spread pooled
    over the session's other commits (`pooled_spread`), else the ends' runs alone."""
    verdict = judge_throughput(cfg, observations, reference)
    samples, ref, bad = throughputs(observations), throughputs(reference or []), throughputs(bad_end)
    terms = step_terms(cfg, samples, ref, bad, others) if cfg.reference == "good_end" else None
    if verdict.kind == VerdictKind.SKIP or terms is None:
        stop: Stop | None = None
        if tried >= cap:
            stop = "nothing measured" if verdict.kind == VerdictKind.SKIP else "cap"
        return (said(verdict, stop, tried) if stop else verdict), stop
    llr = terms.log_lr
    kind = VerdictKind.BAD if llr > 0 else VerdictKind.GOOD
    figures = {k: v for k, v in verdict.figures.items() if k != "not_significant"}
    figures["log_likelihood_ratio"] = round(llr, 4)
    if terms.good:
        figures["ends_error_nodes"] = {side: [round(t, 4) for t in side_terms]
                                       for side, side_terms in (("good", terms.good), ("bad", terms.bad))}
    if abs(llr) >= STEP_BOUND:
        stop = "sure bad" if kind == VerdictKind.BAD else "sure good"
    else:
        stop = "cap" if tried >= cap else None
        figures["not_significant"] = True
    reason = (f"{fmean(samples):.1f} tokens/s ({len(samples)} run(s)), line {figures['line']:.1f}: "
              f"log LR {llr:+.2f} bad vs good")
    verdict = verdict.model_copy(update={"kind": kind, "figures": figures, "reason": reason})
    return (said(verdict, stop, tried) if stop else verdict), stop


def reference_known(cfg: ThroughputConfig, observations: Sequence[Observation], tried: int, cap: int) -> Stop | None:
    """Why the good end has run enough for its mean to be the line (None: run one more)."""
    samples = throughputs(observations)
    if tried >= cap:
        return "cap"
    if len(samples) < REFERENCE_MIN_TRIALS:
        return None
    gap = (1 - cfg.threshold) * fmean(samples)
    stderr = stdev(samples) / math.sqrt(len(samples))
    return "reference known" if stderr <= REFERENCE_PRECISION * gap else None


def trials_wanted(cfg: ThroughputConfig, observations: Sequence[Observation], reference: Sequence[Observation] | None,
                  tried: int, cap: int, as_reference: bool, bad_end: Sequence[Observation] = (),
                  others: Spread | None = None) -> int:
    """How many trials the step runs next (0: it stops): the good end its minimum at once, then
    one at a time; a candidate one at a time."""
    if as_reference:
        if reference_known(cfg, observations, tried, cap):
            return 0
        return max(1, min(cap, REFERENCE_MIN_TRIALS) - tried)
    return 0 if judge_sequential(cfg, observations, reference, tried, cap, bad_end, others)[1] else 1


def judge_reference(cfg: ThroughputConfig, verdict: Verdict) -> Verdict:
    """The good end's verdict (its runs against themselves) said as what it is: the line."""
    figures = verdict.figures
    if verdict.kind == VerdictKind.SKIP or "reference_mean" not in figures:
        return verdict
    reason = (f"the good end: {figures['reference_mean']:.1f} tokens/s ({len(figures['throughput_samples'])} run(s)), "
              f"the line {figures['line']:.1f} ({cfg.threshold:g} x)")
    return verdict.model_copy(update={"reason": reason})


def said(verdict: Verdict, stop: Stop, trials: int) -> Verdict:
    """The verdict with how many trials its step took and why it stopped (figures `stopped`)."""
    return verdict.model_copy(update={
        "figures": {**verdict.figures, "stopped": stop, "trials_run": trials},
        "reason": f"{verdict.reason}; {stop} after {trials} trial(s)"})
