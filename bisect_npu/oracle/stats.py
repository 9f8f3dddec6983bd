"""Verdicts over repeated trials: a rate of bad trials, its Wilson interval, and a sequential test.

Why sequential: a failure seen in 1 run of 5 needs many trials to tell from a clean commit, but a
commit that loops every time needs only a few. The SPRT (Wald) between the good-end rate and the
bad-end rate stops as soon as the evidence reaches the recipe's confidence; `doubling` instead
asks for twice the trials until the Wilson interval separates the two rates (Pinpoint style).
Rates of exactly 0 or 1 are clamped (RATE_FLOOR) so one surprising trial is strong, not infinite,
evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bisect_npu.intervals import wilson_interval
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.oracle.config import StatsConfig

RATE_FLOOR = 1e-3


@dataclass(frozen=True)
class Undecided:
    """Not enough evidence yet: run `more_trials` more trials and judge again."""

    more_trials: int
    figures: dict[str, Any] = field(default_factory=dict)


def _clamp(rate: float) -> float:
    return min(1 - RATE_FLOOR, max(RATE_FLOOR, rate))


def judge_trials(bad_flags: list[bool], cfg: StatsConfig,
                 reference_rate: float | None = None) -> Verdict | Undecided:
    """Good, bad, or Undecided from per-trial bad flags; the good end's measured rate, if known, is p0."""
    trials, bad = len(bad_flags), sum(bool(f) for f in bad_flags)
    p0 = _clamp(cfg.good_rate if reference_rate is None else reference_rate)
    p1 = _clamp(max(cfg.bad_rate, p0 + (cfg.bad_rate - cfg.good_rate)))
    low, high = wilson_interval(bad, trials, cfg.confidence)
    rate = bad / trials if trials else 0.0
    figures: dict[str, Any] = {"bad_trials": bad, "trials": trials, "rate": round(rate, 4),
                               "interval": [round(low, 4), round(high, 4)], "confidence": cfg.confidence,
                               "reference_rate": round(p0, 4), "bad_rate": round(p1, 4), "method": cfg.method}
    alpha = beta = 1 - cfg.confidence
    decision: VerdictKind | None = None
    if cfg.method == "sprt":
        llr = bad * math.log(p1 / p0) + (trials - bad) * math.log((1 - p1) / (1 - p0))
        figures["log_likelihood_ratio"] = round(llr, 4)
        if llr >= math.log((1 - beta) / alpha):
            decision = VerdictKind.BAD
        elif llr <= math.log(beta / (1 - alpha)):
            decision = VerdictKind.GOOD
    elif trials:
        if low > p0:
            decision = VerdictKind.BAD
        elif high < p1:
            decision = VerdictKind.GOOD
    if decision is None and trials >= cfg.max_trials:
        decision = VerdictKind.BAD if rate > (p0 + p1) / 2 else VerdictKind.GOOD
        figures["forced_at_max_trials"] = True
    if decision is None:
        more = min(cfg.max_trials - trials, max(cfg.trials - trials, trials, 1))
        return Undecided(more_trials=more, figures=figures)
    word = "bad" if decision == VerdictKind.BAD else "good"
    return Verdict(kind=decision, figures=figures, trials=trials,
                   reason=f"{bad} of {trials} trials bad (rate {rate:.2f}, {cfg.confidence:.0%} interval "
                          f"{low:.2f}-{high:.2f}; good-end rate {p0:.2f}): {word}")
