"""Noisy mode: a Bayesian search over the change point when one run proves nothing.

A trial fails with an unknown rate q before the culprit and a higher one p from it on; both
rates are integrated out over a grid prior, so the search names a culprit only when the posterior
is as sure as asked, and only after the culprit's and its parent's own trials show the step (the
sandwich). Each query is where the next trials tell the most about the culprit per cost (engine
start, build). docs/design/search.md gives the model, the steps and how the prior was calibrated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bisect_npu.intervals import wilson_interval
from bisect_npu.search.costs import build_costs
from bisect_npu.search.credible import best_guess
from bisect_npu.search.entropy import entropy, plogp
from bisect_npu.search.types import (
    Decision,
    EndsWrong,
    Evidence,
    Found,
    Narrowed,
    Next,
    Query,
    SearchProblem,
)

SLAB_POINTS = 40
# A twentieth of each rate's prior on the extreme a deterministic test has (q = 0, p = 1): the
# calibration in docs/design/search.md chose it.
EXTREME_WEIGHT = 0.05
# The most trials one query asks when engine starts cost something: bounds the batch search
# (the gain per cost flattens long before; bench/noisy_bench.py shows the batches chosen).
MAX_BATCH = 32
NEG_LOG_ZERO = -1e6

RATES = np.concatenate(([0.0], (np.arange(SLAB_POINTS) + 0.5) / SLAB_POINTS, [1.0]))
_slab = (1.0 - EXTREME_WEIGHT) / SLAB_POINTS
PRIOR_Q = np.concatenate(([EXTREME_WEIGHT], np.full(SLAB_POINTS, _slab), [0.0]))
PRIOR_P = PRIOR_Q[::-1].copy()
PRIOR_COMMON = (PRIOR_Q + PRIOR_P) / 2.0
LOG_R = np.where(RATES > 0, np.log(np.maximum(RATES, 1e-300)), NEG_LOG_ZERO)
LOG_1MR = np.where(RATES < 1, np.log(np.maximum(1.0 - RATES, 1e-300)), NEG_LOG_ZERO)
# Probability that p > q under the independent priors: normalises the ordered prior.
ORDERED_MASS = float(sum(PRIOR_Q[a] * PRIOR_P[a + 1 :].sum() for a in range(len(RATES))))


def _log_lik(bad: np.ndarray, good: np.ndarray) -> np.ndarray:
    """log r^bad (1-r)^good for every count row and every grid rate (rows x grid)."""
    rows: np.ndarray = np.outer(bad, LOG_R) + np.outer(good, LOG_1MR)
    return rows


def _row_max(m: np.ndarray) -> np.ndarray:
    rows: np.ndarray = m.max(axis=1, keepdims=True)
    return rows


@dataclass(frozen=True)
class SegmentPosterior:
    """The change-point posterior, one row per segment of equally likely positions.

    Segment j holds c in (bounds[j], bounds[j + 1]]; ``mass`` is its posterior mass, ``mean_q``
    and ``mean_p`` the posterior means of the two rates given c in that segment.
    """

    bounds: np.ndarray
    mass: np.ndarray
    mean_q: np.ndarray
    mean_p: np.ndarray
    rate_q: float
    rate_p: float


def ordered_rate_integrals(
    bad_left: np.ndarray, good_left: np.ndarray, bad_right: np.ndarray, good_right: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: log of the integrated likelihood over q < p, and E[q], E[p] under it.

    The sum over p > q is a reversed cumulative sum over the p grid, so a row costs O(grid).
    """
    lq = _log_lik(bad_left, good_left)
    lp = _log_lik(bad_right, good_right)
    mq, mp = _row_max(lq), _row_max(lp)
    wq = PRIOR_Q * np.exp(lq - mq)
    wp = PRIOR_P * np.exp(lp - mp)

    def above(w: np.ndarray) -> np.ndarray:
        """For each q index a: the sum of w over p indices b > a."""
        tail = np.cumsum(w[:, ::-1], axis=1)[:, ::-1]
        return np.concatenate((tail[:, 1:], np.zeros((w.shape[0], 1))), axis=1)

    s = above(wp)
    sp = above(wp * RATES)
    total = (wq * s).sum(axis=1)
    safe = np.where(total > 0, total, 1.0)
    mean_q = (wq * RATES * s).sum(axis=1) / safe
    mean_p = (wq * sp).sum(axis=1) / safe
    with np.errstate(divide="ignore"):
        log_total = np.log(total) + mq[:, 0] + mp[:, 0] - math.log(ORDERED_MASS)
    return log_total, mean_q, mean_p


def segment_posterior(n: int, evidence: Mapping[int, Evidence]) -> SegmentPosterior:
    """Posterior over the change point given every trial count (ends included)."""
    return posterior_of_counts(n, {i: (ev.good, ev.bad) for i, ev in evidence.items() if ev.trials})


def posterior_of_counts(n: int, counts: Mapping[int, tuple[float, float]]) -> SegmentPosterior:
    """The same posterior from (good, bad) counts per position; counts may be fractional (the
    expected outcomes of trials not run yet, when a round's picks are chosen one by one)."""
    inner = sorted(i for i, (good, bad) in counts.items() if 0 < i < n and good + bad > 0)
    bounds = np.array([0, *inner, n])
    rows = np.array([counts[i] for i in inner], dtype=float).reshape(-1, 2)
    end0 = counts.get(0, (0.0, 0.0))
    endn = counts.get(n, (0.0, 0.0))
    # Row j: the left side holds the good end and inner[:j], the right side the rest and the bad end.
    left = np.vstack((end0, rows)).cumsum(axis=0)
    right = np.vstack((rows, endn))[::-1].cumsum(axis=0)[::-1]
    log_lik, mean_q, mean_p = ordered_rate_integrals(left[:, 1], left[:, 0], right[:, 1], right[:, 0])
    widths = np.diff(bounds)
    log_post = log_lik + np.log(widths)
    post = np.exp(log_post - log_post.max())
    post /= post.sum()
    rate_q = float((post * mean_q).sum())
    rate_p = float((post * mean_p).sum())
    return SegmentPosterior(bounds, post, mean_q, mean_p, rate_q, rate_p)


def position_mass(post: SegmentPosterior) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position c = 1..n: posterior mass, E[q | c], E[p | c] (index 0 is position 1)."""
    widths = np.diff(post.bounds)
    return (
        np.repeat(post.mass / widths, widths),
        np.repeat(post.mean_q, widths),
        np.repeat(post.mean_p, widths),
    )


def _binary_entropy(p: np.ndarray) -> np.ndarray:
    """The entropy of one trial that fails with probability p."""
    binary: np.ndarray = plogp(p) + plogp(1 - p)
    return binary


def failure_probability(mass: np.ndarray, mean_q: np.ndarray, mean_p: np.ndarray) -> np.ndarray:
    """P(a trial at x fails), for x = 0..n: the bad-side rate when c <= x, else the good-side one."""
    zero = np.zeros(1)
    bad_side = np.concatenate((zero, np.cumsum(mass * mean_p)))
    good_side = np.concatenate(((mass * mean_q)[::-1].cumsum()[::-1], zero))
    probability: np.ndarray = bad_side + good_side
    return probability


def information_gain(mass: np.ndarray, mean_q: np.ndarray, mean_p: np.ndarray) -> np.ndarray:
    """Expected entropy reduction of the change point from one trial at x, for x = 0..n.

    I(Y; c) = H(Y) - sum_c P(c) H(Y | c); a trial at x sees the bad-side rate when c <= x. The
    ends tell nothing about c directly, but they sharpen the rates that c is judged by.
    """
    zero = np.zeros(1)
    cond_bad = np.concatenate((zero, np.cumsum(mass * _binary_entropy(mean_p))))
    cond_good = np.concatenate(((mass * _binary_entropy(mean_q))[::-1].cumsum()[::-1], zero))
    gain: np.ndarray = _binary_entropy(failure_probability(mass, mean_q, mean_p)) - cond_bad - cond_good
    return gain


def _binomial_rows(rates: np.ndarray, m: int) -> np.ndarray:
    """P(j failures in m trials) for each rate (rows) and j = 0..m (columns)."""
    j = np.arange(m + 1)
    coefficients = np.array([math.comb(m, k) for k in j], dtype=float)
    r = rates[:, None]
    rows: np.ndarray = coefficients * np.power(r, j) * np.power(1.0 - r, m - j)
    return rows


def batch_information_gain(mass: np.ndarray, mean_q: np.ndarray, mean_p: np.ndarray, m: int) -> np.ndarray:
    """Expected entropy reduction of the change point from m trials at x, for x = 0..n.

    I(J; c) with J the number of failures: H(J) - sum_c P(c) H(J | c), J | c binomial with the
    bad-side rate when c <= x. For m = 1 this is ``information_gain``.
    """
    rows_bad, rows_good = _binomial_rows(mean_p, m), _binomial_rows(mean_q, m)
    weighted_bad = mass[:, None] * rows_bad
    weighted_good = mass[:, None] * rows_good
    zero = np.zeros((1, m + 1))
    mixture = (np.vstack((zero, np.cumsum(weighted_bad, axis=0)))
               + np.vstack((np.cumsum(weighted_good[::-1], axis=0)[::-1], zero)))
    cond_bad = np.concatenate(([0.0], np.cumsum(mass * entropy(rows_bad))))
    cond_good = np.concatenate(((mass * entropy(rows_good))[::-1].cumsum()[::-1], [0.0]))
    return entropy(mixture) - cond_bad - cond_good


def ends_change_probability(evidence: Mapping[int, Evidence], n: int) -> float:
    """P(the rate at the bad end differs upward from the good end | end trials only).

    Compares "q at the good end < p at the bad end" with "one common rate", even odds.
    """
    e0, en = evidence.get(0, Evidence()), evidence.get(n, Evidence())
    log_h1, _, _ = ordered_rate_integrals(
        np.array([e0.bad]), np.array([e0.good]), np.array([en.bad]), np.array([en.good])
    )
    common = _log_lik(np.array([e0.bad + en.bad]), np.array([e0.good + en.good]))[0]
    top = common.max()
    log_h0 = top + math.log(float((PRIOR_COMMON * np.exp(common - top)).sum()))
    return 1.0 / (1.0 + math.exp(min(700.0, log_h0 - float(log_h1[0]))))


def _rate_figures(name: str, evidence: Evidence) -> dict[str, float]:
    """A position's failure rate with its 95% Wilson interval and trial count, for the report."""
    low, high = wilson_interval(evidence.bad, evidence.trials, 0.95)
    return {
        f"{name}_rate": evidence.bad / evidence.trials if evidence.trials else 0.0,
        f"{name}_rate_lo": low,
        f"{name}_rate_hi": high,
        f"{name}_trials": float(evidence.trials),
    }


def counted_evidence(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Mapping[int, Evidence]:
    """The session's trials plus the ends' earlier runs, which the posterior and the ends'
    change test count exactly like trials of the ends (``SearchProblem.earlier_runs``)."""
    runs = problem.earlier_runs
    if runs is None:
        return evidence
    counted = dict(evidence)
    e0, en = evidence.get(0, Evidence()), evidence.get(problem.n, Evidence())
    counted[0] = Evidence(e0.good + runs.good_runs - runs.good_failed, e0.bad + runs.good_failed, e0.skipped)
    counted[problem.n] = Evidence(en.good + runs.bad_runs - runs.bad_failed, en.bad + runs.bad_failed, en.skipped)
    return counted


def decide_noisy(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    """Own trials decide what this session must still run (its ends, the sandwich, the caps);
    own trials plus earlier runs decide where the culprit is."""
    n = problem.n
    counted = counted_evidence(problem, evidence)
    ends = _ends_step(problem, evidence, counted)
    if isinstance(ends, EndsWrong):
        return ends
    post = segment_posterior(n, counted)
    mass, mean_q, mean_p = position_mass(post)
    blocks = _blocks(n, evidence)
    block_mass = np.bincount(blocks, weights=mass)
    best = int(np.argmax(block_mass))
    queries: list[Query] = list(ends)
    if not queries and block_mass[best] >= problem.confidence:
        members = np.flatnonzero(blocks == best) + 1
        lo, hi = int(members[0]) - 1, int(members[-1])
        verdict = _sandwich(problem, evidence, post, lo, hi, float(block_mass[best]))
        if not isinstance(verdict, list):
            return verdict
        queries = verdict
    spare = problem.slots - len(queries)
    if spare > 0:
        queries += _search_picks(problem, evidence, counted, mass, mean_q, mean_p, spare, list(queries))
    if not queries:
        return _exhausted(blocks, block_mass, best, problem.confidence)
    return Next(tuple(queries))


def _ends_step(
    problem: SearchProblem, evidence: Mapping[int, Evidence], counted: Mapping[int, Evidence]
) -> EndsWrong | list[Query]:
    """EndsWrong, or the end trials still needed (empty once the ends are established).

    Each end must show its side in this session's own trials (the bad end fail once, the good
    end pass once) whatever earlier runs said: the session's builds are what is bisected. The
    ends are judged wrong when either the own trials alone or the ``counted`` ones (earlier
    runs included) make "one rate everywhere" as sure as the confidence asked for.
    """
    n = problem.n
    e0, en = evidence.get(0, Evidence()), evidence.get(n, Evidence())
    if not problem.check_ends:
        return []
    if en.skipped and not en.trials:
        return EndsWrong("bad", {"skipped": 1.0})
    if e0.skipped and not e0.trials:
        return EndsWrong("good", {"skipped": 1.0})
    change = ends_change_probability(counted, n)
    if problem.earlier_runs is not None:
        change = min(change, ends_change_probability(evidence, n))
    figures = _end_figures(e0, en, change)
    which: Literal["good", "bad"] = "bad" if en.bad == 0 else "good"
    if 1.0 - change >= problem.confidence:
        return EndsWrong(which, figures)
    if en.bad >= 1 and e0.good >= 1 and change >= 0.5:
        return []
    if en.bad == 0:
        end = n
    elif e0.good == 0:
        end = 0
    else:
        end = n if en.trials <= e0.trials else 0
    room = problem.max_trials_per_query - evidence.get(end, Evidence()).trials
    if room <= 0:
        return EndsWrong(which, figures)
    return [Query(end, _end_batch(problem.load_cost, counted.get(end, Evidence()), end == n, room))]


def _end_batch(load_cost: float, counted: Evidence, bad_end: bool, room: int) -> int:
    """Trials for one end query: the m with the best chance per cost that the end shows its side
    (the bad end fails, the good end passes) at least once, under the end's rate posterior."""
    if load_cost == 0:
        return 1
    prior = PRIOR_P if bad_end else PRIOR_Q
    log_w = counted.bad * LOG_R + counted.good * LOG_1MR
    w = prior * np.exp(log_w - log_w.max())
    w /= w.sum()
    miss = 1.0 - RATES if bad_end else RATES
    sizes = np.arange(1, min(room, MAX_BATCH) + 1)
    shown = 1.0 - (w * np.power(miss[None, :], sizes[:, None])).sum(axis=1)
    return int(sizes[np.argmax(shown / (load_cost + sizes))])


def _end_figures(e0: Evidence, en: Evidence, change: float) -> dict[str, float]:
    return {**_rate_figures("good_end", e0), **_rate_figures("bad_end", en), "change_probability": change}


def _blocks(n: int, evidence: Mapping[int, Evidence]) -> np.ndarray:
    """Block id per position 1..n: skipped positions join the next testable one.

    No trial can tell c = s from c = s + 1 when s cannot be tested, so the search can at best
    name a block; a one-position block is a culprit, a longer one git's skip range.
    """
    skipped = np.zeros(n + 1, dtype=bool)
    for i, ev in evidence.items():
        if 0 < i < n and ev.skipped:
            skipped[i] = True
    ends_block = np.concatenate(([0], (~skipped[1:n]).astype(int)))
    return np.cumsum(ends_block)


_SEPARATION_GRID = np.linspace(0.0005, 0.9995, 1000)


def _rate_posterior(ev: Evidence) -> np.ndarray:
    """Jeffreys Beta(1/2, 1/2) posterior of one position's failure rate, on a grid."""
    g = _SEPARATION_GRID
    w = np.exp((ev.bad - 0.5) * np.log(g) + (ev.good - 0.5) * np.log1p(-g))
    posterior: np.ndarray = w / w.sum()
    return posterior


def separation(culprit: Evidence, parent: Evidence) -> float:
    """P(the culprit's failure rate exceeds its parent's | their own trials only)."""
    hi, lo = _rate_posterior(culprit), _rate_posterior(parent)
    return float((hi * (np.cumsum(lo) - lo / 2)).sum())


def _sandwich(
    problem: SearchProblem,
    evidence: Mapping[int, Evidence],
    post: SegmentPosterior,
    lo: int,
    hi: int,
    mass: float,
) -> Decision | list[Query]:
    """The answer once the culprit (hi) fails more often than its parent (lo), else more trials.

    Pinpoint's sandwich: the two neighbours alone, without the model's other evidence, must
    show the step. The member with fewer trials gets the next one (the culprit on a tie). Once
    both have spent their trials without showing it, the posterior's answer rests on the model
    alone (its two rates, learnt from other commits): the answer is the range whose own ends'
    trials do show a step (`_separated_range`), not the culprit.
    """
    e_lo, e_hi = evidence.get(lo, Evidence()), evidence.get(hi, Evidence())
    separated = separation(e_hi, e_lo)
    figures = _found_figures(evidence, post, e_lo, e_hi, mass, separated)
    open_ = [i for i in (hi, lo) if evidence.get(i, Evidence()).trials < problem.max_trials_per_query]
    if separated < problem.sandwich_confidence and not open_:
        return Narrowed(*_separated_range(problem, evidence, post, lo, hi),
                        figures={**figures, "disagreeing_culprit": float(hi)})
    if separated >= problem.sandwich_confidence:
        if hi - lo == 1:
            return Found(hi, confidence=mass, figures=figures)
        return Narrowed(lo, hi, figures=figures)
    open_.sort(key=lambda i: evidence.get(i, Evidence()).trials)
    queries = []
    for i in open_[: problem.slots]:
        other = e_lo if i == hi else e_hi
        room = problem.max_trials_per_query - evidence.get(i, Evidence()).trials
        queries.append(Query(i, _sandwich_batch(problem, evidence.get(i, Evidence()), other, i == hi, room)))
    return queries


def _separated_range(
    problem: SearchProblem, evidence: Mapping[int, Evidence], post: SegmentPosterior, lo: int, hi: int
) -> tuple[int, int]:
    """The narrowest (a, b] around the block (lo, hi] whose two ends' own trials alone show the
    step (the sandwich's test, `separation` >= ``sandwich_confidence``), among tested positions
    and the ends; of equally narrow ones, the one holding the most posterior mass. The ends
    (0, n] where no pair does."""
    n = problem.n
    tested = [i for i, ev in evidence.items() if ev.trials and not ev.skipped]
    below = sorted({0, *(i for i in tested if i <= lo)}, reverse=True)
    above = sorted({n, *(i for i in tested if i >= hi)})
    mass = position_mass(post)[0]
    best: tuple[int, float, int, int] | None = None
    for a in below:
        for b in above:
            if best is not None and b - a > best[0]:
                break
            if separation(evidence.get(b, Evidence()), evidence.get(a, Evidence())) >= problem.sandwich_confidence:
                held = float(mass[a:b].sum())  # mass[c - 1]: the change at c, c in (a, b]
                if best is None or (b - a, -held) < (best[0], -best[1]):
                    best = (b - a, held, a, b)
                break
    return (best[2], best[3]) if best is not None else (0, n)


def _sandwich_batch(problem: SearchProblem, member: Evidence, other: Evidence, is_culprit: bool, room: int) -> int:
    """Trials for one sandwich query: the m with the best chance per cost that the culprit and
    its parent separate after m more trials of ``member`` (its outcomes drawn from its own
    Jeffreys posterior); one trial when no m can separate them alone."""
    if problem.load_cost == 0:
        return 1
    rate = _rate_posterior(member)
    best, best_score = 1, 0.0
    for m in range(1, min(room, MAX_BATCH) + 1):
        outcomes = (rate[:, None] * _binomial_rows(_SEPARATION_GRID, m)).sum(axis=0)
        reached = 0.0
        for failed, chance in enumerate(outcomes):
            grown = Evidence(member.good + m - failed, member.bad + failed)
            pair = (grown, other) if is_culprit else (other, grown)
            if separation(*pair) >= problem.sandwich_confidence:
                reached += float(chance)
        score = reached / (problem.load_cost + m)
        if score > best_score:
            best, best_score = m, score
    return best


def _found_figures(
    evidence: Mapping[int, Evidence],
    post: SegmentPosterior,
    e_lo: Evidence,
    e_hi: Evidence,
    mass: float,
    separated: float,
) -> dict[str, float]:
    """The evidence behind an answer: both rates with 95% intervals, and the posterior."""
    return {
        "posterior": mass,
        **_rate_figures("culprit", e_hi),
        **_rate_figures("parent", e_lo),
        "separation": separated,
        "bad_rate_estimate": post.rate_p,
        "good_rate_estimate": post.rate_q,
        "trials": float(sum(ev.trials for ev in evidence.values())),
    }


def _search_picks(
    problem: SearchProblem,
    evidence: Mapping[int, Evidence],
    counted: Mapping[int, Evidence],
    mass: np.ndarray,
    mean_q: np.ndarray,
    mean_p: np.ndarray,
    count: int,
    taken: list[Query],
) -> list[Query]:
    """Queries for the next ``count`` slots, chosen one after another.

    Each pick is the most informative query given the evidence plus the expected outcomes of
    the queries before it in the round (``taken`` included), so a round can spread over the range
    early and put several trials on the culprit and its parent late; a position may appear more
    than once. Own trials plus the round's picks never pass ``max_trials_per_query``.
    """
    n = problem.n
    room = np.full(n + 1, problem.max_trials_per_query)
    for i, ev in evidence.items():
        room[i] = 0 if ev.skipped else max(0, problem.max_trials_per_query - ev.trials)
    counts = {i: (float(ev.good), float(ev.bad)) for i, ev in counted.items() if ev.trials}
    fixed = problem.load_cost + build_costs(problem, evidence)
    groups = np.array(problem.build_groups) if problem.build_groups is not None else None
    picks: list[Query] = []
    for query in [*taken, *[None] * count]:
        if query is None:
            query = _best_query(mass, mean_q, mean_p, room, fixed)
            if query is None:
                break
            picks.append(query)
        x = query.index
        room[x] -= query.trials
        if groups is not None:
            fixed = np.minimum(fixed, np.where(groups == groups[x], problem.load_cost + problem.overlay_cost, np.inf))
        fixed[x] = problem.load_cost
        if len(picks) == count:
            break
        failing = float(failure_probability(mass, mean_q, mean_p)[x]) * query.trials
        good, bad = counts.get(x, (0.0, 0.0))
        counts[x] = (good + query.trials - failing, bad + failing)
        mass, mean_q, mean_p = position_mass(posterior_of_counts(n, counts))
    return picks


def _best_query(
    mass: np.ndarray, mean_q: np.ndarray, mean_p: np.ndarray, room: np.ndarray, fixed: np.ndarray
) -> Query | None:
    """The position and trial count with the most expected information per cost, a query at x
    of m trials costing fixed[x] + m (engine start, and the build where x is not built yet);
    one trial at the most informative position when nothing costs more than its trials. None
    when every position is capped or skipped."""
    gain = np.where(room > 0, information_gain(mass, mean_q, mean_p), -np.inf)
    if not np.isfinite(gain).any():
        return None
    if not fixed.any():
        return Query(int(np.argmax(gain)))
    per_cost = gain / (fixed + 1)
    best = Query(int(np.argmax(per_cost)))
    best_score = float(per_cost[best.index])
    for m in range(2, min(int(room.max()), MAX_BATCH) + 1):
        per_cost = np.where(room >= m, batch_information_gain(mass, mean_q, mean_p, m), -np.inf) / (fixed + m)
        x = int(np.argmax(per_cost))
        if float(per_cost[x]) > best_score:
            best, best_score = Query(x, m), float(per_cost[x])
    return best


def _exhausted(blocks: np.ndarray, block_mass: np.ndarray, best: int, confidence: float) -> Decision:
    """Every position is capped or skipped: the best block with its (low) confidence, a single
    commit as the credible range around it (credible.py)."""
    members = np.flatnonzero(blocks == best) + 1
    lo, hi = int(members[0]) - 1, int(members[-1])
    figures = {"posterior": float(block_mass[best]), "separation": 0.0}
    if hi - lo == 1:
        return best_guess(blocks, block_mass, best, confidence, figures)
    return Narrowed(lo, hi, figures=figures)
