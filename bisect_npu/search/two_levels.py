"""One change-point model over every measured run of a session: the throughput search.

A throughput history that a bisection can answer has two levels: every commit before the culprit
runs at the good side's mean, every commit from it on at the bad side's, one run-to-run spread
for all (the same benchmark on the same host). Every run of every commit, the ends' included, is
evidence about both means, the spread and where the change lies, so nothing is measured first
and then taken as a fixed reference: for each culprit position c the likelihood of all runs is
integrated over both means (flat priors) and the spread in closed form,

    P(runs | c) ~ (n_L n_R)^(-1/2) S(c)^(-(N-2)/2) (2w P(under | runs, c) + 2(1 - w) P(over | runs, c)),

n_L and n_R the runs left and right of c, S(c) their squared deviations from each side's own mean,
N all runs. The spread's prior is 1/sigma times two pseudo-runs as wide as the line's gap at the
runs' level (``SPREAD_PRIOR_RUNS``, conjugate: their squares join S(c) and their count N): with
1/sigma alone a few runs that lie close by chance make every step sure, and a search that stops
the first time it is sure stops on exactly those. The last factor is the recipe's own rule as a
prior, not a given: the bad side lies under the line (the threshold's share of the good side,
P(under), a Student's t probability with N - 2 degrees of freedom) with prior w
(``UNDER_LINE_PRIOR``), over it with 1 - w. Taken as given, a drop short of the line put the
change where a few runs of the bad side happened to lie low; as a prior, the line moves the odds
between two positions by at most w / (1 - w), and the runs say where the change is whatever its
size.
The posterior over c is that likelihood under a uniform prior. Where the recipe publishes the good
side's level (a nightly case's `baseline`, in the runs' unit), the good side's mean is normal about
it instead of flat, its variance the spread's squared over a worth in runs (``BASELINE_PRIOR``, a
mixture over how far off the baseline may be): each worth k turns the good side's factor into
(k / (k + n_L))^(1/2), adds k n_L / (k + n_L) (the good runs' mean - baseline)^2 to S(c), gives
S(c) the exponent -(N-1)/2 and the line's t N - 1 degrees of freedom. Runs made before the
session at the ends on the baseline's host (the failing nightly's throughput at the bad end, the
last good one's at the good end: ``SearchProblem.earlier_levels``) share the baseline's worth in
each component: a run of worth k is normal about its side's mean with the spread squared over k as
its variance, so with flat means they join the sums at their end weighted by k and each adds
k^(1/2) to the likelihood (the baseline alone is the same formula, one value at the good end). The
worth-1 component counts them as runs of the session's own host; the others, that host being
another, leave them to move nothing much: a wrong or other-host value costs runs, not the answer.
An answer rests on the session's own runs: a side of it that only earlier runs speak for is run
first, and the ends are judged wrong on the session's runs alone.

A query is one run where it teaches most about c per cost: the expected fall of the change point's
entropy, its outcome drawn from the model's own posterior predictive (every prior of the posterior
in it: `expected_information`), over one run plus a build where the position is not built yet,
among the positions teaching at least ``INFORMATION_FLOOR`` of the most any teaches (a search that
always took the cheapest teaching run would walk its built commits and learn little). Once the
likeliest position holds ``LATE_SHARE`` of the posterior the fall weighed is that of the log-odds
against it, what the stopping rule waits on: the entropy would still pay for runs that only reorder
the small masses far from it. The ends are asked like any position: a run of either sharpens the
means every step is judged by, and nothing makes them special but that the posterior never puts the
change outside them. The answer is the block of positions that skips cannot split holding
``confidence``, never a culprit whose own runs, or its parent's, contradict it by the odds the
answer is held to (``own_log_lr``: what a position's runs alone say against the session's other
runs, which the line's lean, the baseline and the earlier runs can outweigh): the range the runs
agree on instead (`agreement.agreed_range`, as likelihood mode). The ends are wrong when the model
over the session's runs makes it ``confidence`` sure that the bad side does not lie under the good
side's line (``ends_under_line``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from bisect_npu.search.agreement import agreed_range
from bisect_npu.search.costs import INFORMATION_FLOOR, build_costs
from bisect_npu.search.credible import best_guess
from bisect_npu.search.entropy import entropy
from bisect_npu.search.types import (
    NO_EARLIER,
    Decision,
    EarlierLevels,
    EndsWrong,
    Evidence,
    Found,
    Narrowed,
    Next,
    Query,
    SearchProblem,
)

# The incomplete beta's continued fraction converges in O(sqrt(max(a, b))) terms; the degrees of
# freedom are a session's runs (tens), so this bound is never reached in practice.
_FRACTION_TERMS = 300
_TINY = 1e-300
# Outcomes of a run the expected information is integrated over (a grid over the predictive).
OUTCOMES = 24
# Once the likeliest position holds this share, a query is weighed by the expected fall of the
# log-odds against it (what the stopping rule waits on) instead of the entropy's: the entropy
# still pays for shuffling the small masses far from the leader, the odds only for the runs that
# settle the leader against its rivals (docs/benchmarks.md, issue 51).
LATE_SHARE = 0.8
# Positions whose side holds less than this share of the posterior either way are not asked: a
# run there can move nothing the answer rests on (the ends are always weighed).
OPEN_SHARE = 1e-3
# Runs each end has before the ends are judged wrong.
END_RUNS_BEFORE_WRONG = 2
# The spread's prior: as much as this many runs spread as wide as the line's gap (the recipe's
# share under the good side, at the runs' level), with the 1/sigma prior. With the spread flat in
# its log, a few runs that happen to lie close together make it look narrow and every step sure;
# stopping at the first 0.99 picks exactly those histories (docs/benchmarks.md, issue 51). A gap's
# worth of spread is the widest a recipe's line can be read at: a prior that errs wide costs runs
# where the spread is narrow, never the answer.
SPREAD_PRIOR_RUNS = 2.0
# The published baseline as a prior on the good side's mean: a mixture of (worth in runs, weight),
# the good mean normal about the baseline with the spread squared over the worth as its variance.
# Either it holds as well as one run of the session's own host (a few runs check it), or it is off
# by about ten, a hundred or a thousand spreads (another host, another load, another unit), each
# as likely: the runs weigh the four in closed form, so a wrong baseline costs runs, not the answer.
BASELINE_PRIOR = ((1.0, 0.25), (1e-2, 0.25), (1e-4, 0.25), (1e-6, 0.25))
# The prior that the bad side lies under the line (the rest: over it, a smaller drop or none): the
# bisection is asked because the bad end failed the line, so mostly it does, but the runs must be
# able to say it does not. At 1 (the line taken as given) a drop over the line put the culprit
# where a few runs of the bad side happened to lie low, named wrong at 0.99; at 0.5 (no lean) the
# line no longer rules out the splits whose bad side is not under it, which costs runs.
UNDER_LINE_PRIOR = 0.9


def _log_beta_inc(a: float, b: float, x: np.ndarray) -> np.ndarray:
    """log of the regularised incomplete beta I_x(a, b), x in (0, 1], by its continued fraction
    (Lentz), accurate in the far tail where 1 - I would cancel."""
    x = np.clip(x, _TINY, 1.0)
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * np.log(x)
                 + b * np.log1p(-np.minimum(x, 1 - 1e-16)))
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = np.where(np.abs(d) < _TINY, _TINY, d)
    d = 1.0 / d
    h = d.copy()
    for m in range(1, _FRACTION_TERMS + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = np.where(np.abs(d) < _TINY, _TINY, d)
        c = 1.0 + aa / c
        c = np.where(np.abs(c) < _TINY, _TINY, c)
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = np.where(np.abs(d) < _TINY, _TINY, d)
        c = 1.0 + aa / c
        c = np.where(np.abs(c) < _TINY, _TINY, c)
        d = 1.0 / d
        delta = d * c
        h *= delta
        if np.all(np.abs(delta - 1.0) < 1e-13):
            break
    result: np.ndarray = log_front + np.log(np.maximum(h, _TINY)) - math.log(a)
    return result


def t_log_cdf(t: np.ndarray, df: float) -> np.ndarray:
    """log P(T <= t) for Student's t with ``df`` degrees of freedom, exact in both tails."""
    t = np.asarray(t, dtype=float)
    a, b = df / 2.0, 0.5
    x = df / (df + t * t)
    # P(|T| > |t|) = I_x(df/2, 1/2); the far side's half of it is the tail. Each element takes the
    # form of the fraction that converges fast for it.
    switch = x > (a + 1.0) / (a + b + 2.0)
    tail = np.empty_like(x)
    tail[~switch] = _log_beta_inc(a, b, x[~switch])
    tail[switch] = np.log(np.maximum(-np.expm1(_log_beta_inc(b, a, 1.0 - x[switch])), _TINY))
    tail -= math.log(2.0)
    result: np.ndarray = np.where(t < 0, tail, np.log1p(-np.exp(np.minimum(tail, math.log(0.5)))))
    return result


def _side_sums(n: int, runs: Mapping[int, Sequence[float]],
               center: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position 0..n: its runs' count, sum and sum of squares (about ``center``)."""
    count, total, squares = np.zeros(n + 1), np.zeros(n + 1), np.zeros(n + 1)
    for i, values in runs.items():
        shifted = np.asarray(values, dtype=float) - center
        count[i], total[i], squares[i] = len(shifted), shifted.sum(), (shifted * shifted).sum()
    return count, total, squares


def _split(count: np.ndarray, total: np.ndarray,
           squares: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each split c (last axis, c = 1..n): the left side's (positions < c) mean and run count,
    the right side's, and the squared deviations from each side's own mean, summed."""
    n_left, s_left, q_left = (np.cumsum(a, axis=-1)[..., :-1] for a in (count, total, squares))
    n_right, s_right, q_right = (np.cumsum(a[..., ::-1], axis=-1)[..., ::-1][..., 1:] for a in (count, total, squares))
    mean_left, mean_right = s_left / n_left, s_right / n_right
    return mean_left, n_left, mean_right, n_right, (q_left - s_left * mean_left) + (q_right - s_right * mean_right)


def _log_lik_of_sums(count: np.ndarray, total: np.ndarray, squares: np.ndarray, center: float,
                     threshold: float, baseline: float | None = None,
                     earlier: EarlierLevels = NO_EARLIER) -> np.ndarray:
    """``log_likelihood`` from per-position sums (last axis 0..n; leading axes: alternatives)."""
    runs = float(count.reshape(-1, count.shape[-1])[0].sum())  # the same in every alternative
    # The published baseline and the earlier runs come from the nightly's host: one worth for all
    # of them in each of the prior's components (that host is this one, or it is off).
    good = ((baseline,) if baseline is not None else ()) + tuple(earlier[0])
    # the level the spread's prior is read at: the session's runs' mean (a value of another host,
    # or in another unit, would move the prior's scale with it)
    level = _level(count, total, center)
    if not good and not earlier[1]:
        return _flat_good_side(*_split(count, total, squares), runs, center, threshold, level)
    terms = [math.log(weight) + _with_host_runs(count, total, squares, runs, center, threshold, good, earlier[1], worth,
                                                level)
             for worth, weight in BASELINE_PRIOR]
    result: np.ndarray = np.logaddexp.reduce(terms, axis=0)
    return result


def _flat_good_side(mean_left: np.ndarray, n_left: np.ndarray, mean_right: np.ndarray, n_right: np.ndarray,
                    within: np.ndarray, runs: float, center: float, threshold: float,
                    level: np.ndarray) -> np.ndarray:
    """Both means flat a priori, under the line with ``UNDER_LINE_PRIOR``: (n_L n_R)^(-1/2)
    S^(-(N-2)/2) (2w P(under) + 2(1 - w) P(over)), S and N with the spread's pseudo-runs
    (``SPREAD_PRIOR_RUNS``, read at ``level``). The counts may be weights (a run of the nightly's
    host counts ``worth``), ``runs`` every value's count."""
    log_lik, log_under, log_over = _flat_sides(mean_left, n_left, mean_right, n_right, within, runs, center,
                                               threshold, level)
    mixed: np.ndarray = log_lik + np.logaddexp(math.log(2 * UNDER_LINE_PRIOR) + log_under,
                                               math.log(2 * (1 - UNDER_LINE_PRIOR)) + log_over)
    return mixed


def _flat_sides(mean_left: np.ndarray, n_left: np.ndarray, mean_right: np.ndarray, n_right: np.ndarray,
                within: np.ndarray, runs: float, center: float,
                threshold: float, level: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per split: the log likelihood with the means flat anywhere, and log P(the bad side's mean
    under the line | the runs, c) and over it: threshold x mu_good - mu_bad > 0, its error
    Student's t."""
    within = np.maximum(within, np.max(within, axis=-1, keepdims=True) * 1e-12 + _TINY)
    within, df = _with_spread_prior(within, runs, level, threshold)
    gap = threshold * (mean_left + center) - (mean_right + center)
    error = np.sqrt(within / df * (threshold**2 / n_left + 1.0 / n_right))
    log_lik: np.ndarray = -0.5 * np.log(n_left * n_right) - df / 2.0 * np.log(within)
    return log_lik, t_log_cdf(gap / error, df), t_log_cdf(-gap / error, df)


def _level(count: np.ndarray, total: np.ndarray, center: float) -> np.ndarray:
    """The session's runs' mean (per alternative, last axis the positions): the level the spread's
    prior is read at."""
    level: np.ndarray = center + total.sum(axis=-1, keepdims=True) / count.sum(axis=-1, keepdims=True)
    return level


def _with_spread_prior(within: np.ndarray, runs: float, level: np.ndarray,
                       threshold: float) -> tuple[np.ndarray, float]:
    """The squared deviations and degrees of freedom of ``runs`` values about two means, with the
    spread's prior as pseudo-runs joined: ``SPREAD_PRIOR_RUNS`` of them, each spread as wide as the
    line's gap at ``level``; none where the line is the good side's own level (no gap to read a
    spread from)."""
    if threshold == 1.0:
        return within, runs - 2.0
    gap = (1.0 - threshold) * level
    return within + SPREAD_PRIOR_RUNS * gap * gap, runs - 2.0 + SPREAD_PRIOR_RUNS


def _with_host_runs(count: np.ndarray, total: np.ndarray, squares: np.ndarray, runs: float, center: float,
                    threshold: float, good: Sequence[float], bad: Sequence[float], worth: float,
                    level: np.ndarray) -> np.ndarray:
    """The values of the nightly's host (``good``: the baseline and the good end's earlier runs,
    ``bad``: the bad end's) as runs of weight ``worth`` at the ends, each normal about its side's
    mean with the spread squared over ``worth`` as its variance; with flat means that is the flat
    formula over weighted sums, times worth^(1/2) per value. For the baseline alone it is the good
    mean normal about it: (worth / (worth + n_L))^(1/2) n_R^(-1/2) S'^(-(N-1)/2) P(under the line)."""
    host = len(good) + len(bad)
    return (0.5 * host * math.log(worth)
            + _flat_good_side(*_split(*_host_sums(count, total, squares, center, good, bad, worth)), runs + host,
                              center, threshold, level))


def _host_sums(count: np.ndarray, total: np.ndarray, squares: np.ndarray, center: float, good: Sequence[float],
               bad: Sequence[float], worth: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sums with ``good`` joined to the good end's (position 0) and ``bad`` to the bad end's,
    each value weighing ``worth``."""
    count, total, squares = count.copy(), total.copy(), squares.copy()
    for index, values in ((0, good), (-1, bad)):
        shifted = np.asarray(values, dtype=float) - center
        count[..., index] += worth * len(shifted)
        total[..., index] += worth * shifted.sum()
        squares[..., index] += worth * (shifted * shifted).sum()
    return count, total, squares


def _ready(n: int, runs: Mapping[int, Sequence[float]], earlier: EarlierLevels = NO_EARLIER) -> bool:
    """Each end has a run (of the session, or an earlier one), the session one at least, and three
    runs in all."""
    ends = all(runs.get(i) or earlier[side] for side, i in enumerate((0, n)))
    measured = sum(len(v) for v in runs.values())
    return ends and measured >= 1 and measured + len(earlier[0]) + len(earlier[1]) >= 3


def _center(runs: Mapping[int, Sequence[float]]) -> float:
    return float(np.mean([v for values in runs.values() for v in values]))


def log_likelihood(n: int, runs: Mapping[int, Sequence[float]], threshold: float,
                   baseline: float | None = None, earlier: EarlierLevels = NO_EARLIER) -> np.ndarray | None:
    """log P(every run | c) + constant for c = 1..n (index 0 is position 1), both means and the
    spread integrated out; None while the runs cannot weigh a change (an end without a run, or
    fewer than three runs in all). ``baseline``: the published good-side mean, in the runs' unit,
    a prior on the good side's mean (``BASELINE_PRIOR``); None: flat. ``earlier``: runs at the good
    end and the bad end made on the baseline's host, each weighed as the baseline is."""
    if not _ready(n, runs, earlier):
        return None
    center = _center(runs)
    return _log_lik_of_sums(*_side_sums(n, runs, center), center, threshold, baseline, earlier)


def posterior(n: int, runs: Mapping[int, Sequence[float]], threshold: float,
              baseline: float | None = None, earlier: EarlierLevels = NO_EARLIER) -> np.ndarray | None:
    """P(c = x | every run) for x = 1..n (index 0 is position 1), the culprit uniform a priori;
    None where ``log_likelihood`` is."""
    log_lik = log_likelihood(n, runs, threshold, baseline, earlier)
    if log_lik is None:
        return None
    return _normalised(log_lik)


def _normalised(log_lik: np.ndarray) -> np.ndarray:
    weights = np.exp(log_lik - log_lik.max(axis=-1, keepdims=True))
    normalised: np.ndarray = weights / weights.sum(axis=-1, keepdims=True)
    return normalised


def expected_information(n: int, runs: Mapping[int, Sequence[float]], threshold: float,
                         positions: Sequence[int], outcomes: int = OUTCOMES,
                         baseline: float | None = None, earlier: EarlierLevels = NO_EARLIER) -> np.ndarray:
    """For each of ``positions``: the expected fall in the change point's entropy from one more run
    there (in the log-odds against the likeliest position once it holds ``LATE_SHARE``), its
    outcome drawn from the model's own posterior predictive, integrated on a grid of ``outcomes``
    values: P(y | runs) is the sum over c of P(runs, y | c), the likelihood the posterior after the
    run is read from, so every prior the posterior has (the spread's, the baseline, the earlier
    runs, the line's lean) weighs the outcome as it weighs the answer, and the expected fall is
    never negative."""
    assert _ready(n, runs, earlier)
    center = _center(runs)
    sums = _side_sums(n, runs, center)
    post = _normalised(_log_lik_of_sums(*sums, center, threshold, baseline, earlier))
    ys = _outcome_grid(sums, center, threshold, post, earlier, outcomes)
    xs = np.asarray(positions)
    count, total, squares = (np.repeat(np.repeat(a[None, None, :], len(xs), axis=0), outcomes, axis=1)
                             for a in sums)
    rows, columns = np.arange(len(xs)), xs
    count[rows, :, columns] += 1
    total[rows, :, columns] += ys
    squares[rows, :, columns] += ys * ys
    joint = _log_lik_of_sums(count, total, squares, center, threshold, baseline, earlier)  # positions x outcomes x c
    # the culprit uniform a priori: P(y | runs) at x is the sum over c of P(runs, y | c), up to a
    # factor the same for every outcome (the runs' count), normalised on the grid
    weights = _normalised(np.logaddexp.reduce(joint, axis=-1))
    after = _normalised(joint)
    measure = entropy if float(post.max()) < LATE_SHARE else _unsure
    gains: np.ndarray = float(measure(post)) - (weights * measure(after)).sum(axis=1)
    return gains


def _outcome_grid(sums: tuple[np.ndarray, np.ndarray, np.ndarray], center: float, threshold: float,
                  post: np.ndarray, earlier: EarlierLevels, outcomes: int) -> np.ndarray:
    """The outcomes a run is integrated over: evenly from four spreads under the lower of the two
    sides' posterior means to four over the higher (the earlier runs taken as runs, a side may
    have no run of the session's; the spread under the posterior's prior), centred values."""
    known = _host_sums(*sums, center, earlier[0], earlier[1], 1.0)
    left, _, right, _, within = _split(*known)
    within, df = _with_spread_prior(within, float(known[0].sum()), _level(sums[0], sums[1], center), threshold)
    spread = float(np.sqrt((post * np.maximum(within / df, _TINY)).sum()))
    low = float(min((post * right).sum(), (post * left).sum())) - 4 * spread
    high = float(max((post * right).sum(), (post * left).sum())) + 4 * spread
    ys: np.ndarray = np.linspace(low, high, outcomes)
    return ys


def _unsure(post: np.ndarray) -> np.ndarray:
    """The log-odds against the likeliest position, log((1 - p_max) / p_max): what the stopping
    rule waits on, falling as the leader's share nears ``confidence``."""
    top = post.max(axis=-1)
    unsure: np.ndarray = np.log(np.maximum(1.0 - top, 1e-12)) - np.log(np.maximum(top, _TINY))
    return unsure


def measured_runs(evidence: Mapping[int, Evidence]) -> dict[int, tuple[float, ...]]:
    """Every position's measured values, positions without any left out."""
    return {i: ev.measured for i, ev in evidence.items() if ev.measured}


def ends_under_line(n: int, runs: Mapping[int, Sequence[float]], threshold: float) -> float:
    """P(the bad side's mean < threshold x the good side's mean | the runs): the line asked of the
    change-point model over the session's runs (both means flat, the line's prior
    ``UNDER_LINE_PRIOR``, the spread under the posterior's prior): P(under the line | c) weighed by
    P(c). Every run on either side speaks for its level, not the ends' alone; a split the runs do
    not favour weighs little."""
    center = _center(runs)
    count, total, squares = _side_sums(n, runs, center)
    level = _level(count, total, center)
    if _with_spread_prior(np.zeros(1), float(count.sum()), level, threshold)[1] < 1:
        return 0.5  # two runs and no gap to read a spread from: nothing is known of it
    log_lik, log_under, log_over = _flat_sides(*_split(count, total, squares), float(count.sum()), center,
                                               threshold, level)
    under = math.log(UNDER_LINE_PRIOR) + log_under
    either = np.logaddexp(under, math.log(1 - UNDER_LINE_PRIOR) + log_over)
    return float((_normalised(log_lik + either) * np.exp(under - either)).sum())


def decide_levels(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    """The ends' first runs, then one run at a time where it teaches most, until one block of
    positions holds ``confidence`` of the change point's posterior."""
    n = problem.n
    for index, which in ((0, "good"), (n, "bad")):
        ev = evidence.get(index, Evidence())
        if ev.skipped and not ev.measured:
            return EndsWrong(which, {"skipped": 1.0})  # type: ignore[arg-type]
    runs, earlier = measured_runs(evidence), problem.earlier_levels
    known = {0: len(runs.get(0, ())) + len(earlier[0]), n: len(runs.get(n, ())) + len(earlier[1])}
    if not _ready(n, runs, earlier):
        # an end known by earlier runs alone is asked last: they may be another host's
        first = [i for i in (0, n) if not known[i]] or [min((n, 0), key=lambda i: (known[i], not runs.get(i)))]
        return Next(tuple(Query(i) for i in first[: problem.slots]))
    # The ends are judged wrong on the session's own runs only (an earlier run may be another host's).
    under = ends_under_line(n, runs, problem.threshold) if runs.get(0) and runs.get(n) else None
    if problem.check_ends and under is not None and 1 - under >= problem.confidence:
        # One low run of the good end can put a sound bad end over the line: an end is judged
        # wrong only once both have run again (as likelihood mode asks a weak end again).
        again = [i for i in (n, 0) if len(runs[i]) < END_RUNS_BEFORE_WRONG
                 and len(runs[i]) < problem.max_trials_per_query]
        if not again:
            return EndsWrong("bad", {"under_line": under})
        return Next((Query(min(again, key=lambda i: len(runs[i]))),))
    post = posterior(n, runs, problem.threshold, problem.baseline, earlier)
    assert post is not None
    blocks = _blocks(n, evidence)
    block_mass = np.bincount(blocks, weights=post)
    best = int(np.argmax(block_mass))
    unmeasured = _side_unmeasured(n, runs, evidence, blocks, best, problem.max_trials_per_query)
    if block_mass[best] >= problem.confidence and unmeasured is None:
        return _answer(problem, runs, blocks, block_mass, best, under)
    if block_mass[best] >= problem.confidence:
        assert unmeasured is not None
        return Next((Query(unmeasured),))
    cumulative = np.cumsum(post)[:-1]  # P(c <= x) for x = 1..n-1
    room = {i: problem.max_trials_per_query - len(evidence.get(i, Evidence()).measured) for i in range(n + 1)}
    askable = [x for x in range(1, n) if room[x] > 0 and not (evidence.get(x, Evidence()).skipped
                                                               and not evidence.get(x, Evidence()).measured)
               and OPEN_SHARE < float(cumulative[x - 1]) < 1 - OPEN_SHARE]
    asked = [i for i in (0, *askable, n) if room[i] > 0]
    if not asked:
        return _answer(problem, runs, blocks, block_mass, best, under)
    costs = build_costs(problem, evidence)
    for i in runs:
        costs[i] = 0.0
    gains = expected_information(n, runs, problem.threshold, asked, baseline=problem.baseline,
                                 earlier=earlier)
    per_cost = gains / (1.0 + costs[asked])
    # a cheaper run only where it teaches at least INFORMATION_FLOOR of the most informative one
    # (the likelihood search's floor): each run's build weighed, the runs a bisection needs kept
    close = gains >= INFORMATION_FLOOR * float(gains.max())
    order = sorted(range(len(asked)), key=lambda k: (not close[k], -per_cost[k], asked[k]))
    return Next(tuple(Query(asked[k]) for k in order[: problem.slots]))


def _blocks(n: int, evidence: Mapping[int, Evidence]) -> np.ndarray:
    """Block id per position 1..n: a position skipped without a run joins the next one (no run
    can split them)."""
    starts = np.ones(n, dtype=int)
    starts[0] = 0
    for i, ev in evidence.items():
        if 0 < i < n and ev.skipped and not ev.measured:
            starts[i] = 0
    return np.cumsum(starts)


def _side_unmeasured(n: int, runs: Mapping[int, Sequence[float]], evidence: Mapping[int, Evidence],
                     blocks: np.ndarray, best: int, max_trials: int) -> int | None:
    """Where the block ``best`` has a side without a run of the session (only the nightly's host
    speaks for it): the block's end on that side, else that side's end of the range; None when
    both sides have one (or no run there is left to ask). An answer rests on this host's runs."""
    lo, hi = _bounds(blocks, best)
    for side, near, far in ((range(0, lo + 1), lo, 0), (range(hi, n + 1), hi, n)):
        if any(runs.get(i) for i in side):
            continue
        for i in (near, far):
            ev = evidence.get(i, Evidence())
            if len(ev.measured) < max_trials and not (ev.skipped and not ev.measured):
                return i
    return None


def _answer(problem: SearchProblem, runs: Mapping[int, Sequence[float]], blocks: np.ndarray,
            block_mass: np.ndarray, best: int, under: float | None) -> Decision:
    """The block ``best``: a culprit, or the range of skipped commits no run can split; the range
    the runs agree on where its parent's or culprit's own runs contradict it (``own_log_lr``)."""
    lo, hi = _bounds(blocks, best)
    below = [v for i, values in runs.items() if i <= lo for v in values]
    above = [v for i, values in runs.items() if i >= hi for v in values]
    means = {name: float(np.mean(values)) for name, values in (("good_mean", below), ("bad_mean", above)) if values}
    figures = {"posterior": float(block_mass[best]), **means, "runs": float(sum(len(v) for v in runs.values())),
               **({"ends_under_line": under} if under is not None else {})}
    agreed = agreed_range(own_log_lr(problem.n, runs, problem.threshold, lo, hi), _own_bound(problem), lo, hi,
                          problem.n)
    if agreed != (lo, hi):
        return Narrowed(*agreed, figures={**figures, "disagreeing_culprit": float(hi)})
    if hi - lo == 1 and block_mass[best] < problem.confidence:
        return best_guess(blocks, block_mass, best, problem.confidence, figures)
    if hi - lo == 1:
        return Found(hi, confidence=float(block_mass[best]), figures=figures)
    return Narrowed(lo, hi, figures=figures)


def _bounds(blocks: np.ndarray, best: int) -> tuple[int, int]:
    """The block ``best`` as a range (lo, hi]: its culprit's parent and its last position."""
    members = np.flatnonzero(blocks == best) + 1
    return int(members[0]) - 1, int(members[-1])


def _own_bound(problem: SearchProblem) -> float:
    """The ratio a neighbour's own runs must reach against the answer to contradict it: the odds
    the answer itself is held to (``confidence``)."""
    return math.log(problem.confidence / (1 - problem.confidence))


def own_log_lr(n: int, runs: Mapping[int, Sequence[float]], threshold: float, lo: int, hi: int) -> dict[int, float]:
    """Each inner position's own log likelihood ratio under the answer (lo, hi]: log P(its runs |
    it on the bad side) - log P(them | on the good side), the two levels and the spread learned
    from the session's other runs (both means flat, the spread under the posterior's prior); the
    marginal likelihood of every run of the session with the position moved to the other side
    against it where it is. It is what the position's runs alone say, without the line's lean, the
    baseline or the earlier runs: the evidence the answer could outweigh. Positions without runs,
    and one whose side would be left without a run, have none."""
    center = _center(runs)
    count, total, squares = _side_sums(n, runs, center)
    level = _level(count, total, center)
    good = np.arange(n + 1) <= lo
    sides = np.array([[a[good].sum(), a[~good].sum()] for a in (count, total, squares)])  # (sum kind, side)
    own: dict[int, float] = {}
    for p in runs:
        if not 0 < p < n or (lo < p < hi):
            continue
        mine = np.array([count[p], total[p], squares[p]])
        here, there = (0, 1) if good[p] else (1, 0)
        if sides[0, here] <= mine[0]:
            continue
        moved = sides.copy()
        moved[:, here] -= mine
        moved[:, there] += mine
        as_is, other = _two_sides_log_lik(sides, level, threshold), _two_sides_log_lik(moved, level, threshold)
        own[p] = other - as_is if good[p] else as_is - other
    return own


def _two_sides_log_lik(sides: np.ndarray, level: np.ndarray, threshold: float) -> float:
    """log of (n_L n_R)^(-1/2) S^(-df/2) for two sides' sums (rows: count, sum, sum of squares;
    columns: good, bad), the spread's prior joined (``_with_spread_prior``)."""
    count, total, squares = sides
    within = float((squares - total * total / count).sum())
    spread, df = _with_spread_prior(np.array([max(within, _TINY)]), float(count.sum()), level, threshold)
    return float(-0.5 * math.log(count[0] * count[1]) - df / 2.0 * math.log(float(spread.ravel()[0])))
