"""Likelihood mode: a Bayesian search over the change point fed with each step's likelihood ratio.

For oracles that measure rather than vote (the accuracy oracle's paired statistics), a step's
evidence is a log likelihood ratio, log P(measured | bad side) - log P(measured | good side)
(``Evidence.log_lr``), not a bare good or bad. With the culprit c uniform over 1..n, a tested
position i is on the bad side exactly when c <= i, so

    log P(c | evidence) = sum of log_lr_i over the tested i >= c  + constant,

which is exact whatever the ratios' sizes: a weak step moves the posterior a little, a decisive
one a lot, and steps repeated at one position add up. The next query is probabilistic bisection
(the posterior's median, quantiles with several slots; where builds cost differently, the round of
most information per cost, costs.py); a tested position is asked again while
the posterior is not sure which side it is on (its step was not decisive), up to ``max_steps``;
where the problem asks it (``answer_log_lr``), the answer's culprit and parent are asked again
until their own steps reach that ratio, so steps elsewhere may stop early and only steer; such a
search asks the positions that could still move its answer up to ``ANSWER_MAX_STEPS`` times
before it answers below its confidence: the credible range around its best guess
(credible.py). It names no culprit whose own spent steps, or its
parent's, contradict it by that ratio: the range those decisive steps agree on instead.
The ends come first: each must be judged its own side by its step's verdict (EndsWrong otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from bisect_npu.search.agreement import agreed_range
from bisect_npu.search.costs import most_information_per_cost, step_costs
from bisect_npu.search.credible import best_guess
from bisect_npu.search.types import Decision, EndsWrong, Evidence, Found, Narrowed, Next, Query, SearchProblem

# Steps one position may take (the first and repeats): a commit that three steps of the sequential
# test could not place is left to the posterior, which then names a range or a weaker answer.
MAX_STEPS = 3
# Where the answer is held to a ratio of its own (`SearchProblem.answer_log_lr`, steps that only
# steer), a search that would otherwise answer below its confidence (every position that could
# move the answer has spent MAX_STEPS) asks them again, up to this many steps: steering steps err
# often enough that three of them at the culprit can all lean the wrong way.
ANSWER_MAX_STEPS = 6
# A position is worth asking only while both of its sides hold more than this share of the error
# the confidence allows.
TELLING_SHARE = 1e-3


def change_point_posterior(n: int, evidence: Mapping[int, Evidence]) -> np.ndarray:
    """P(c = x | evidence) for x = 1..n (index 0 is position 1), from the inner positions' ratios;
    the steps' node terms (`Weight`) integrated over the ends' error once, over all steps."""
    log_lr = np.zeros(n + 1)
    for i, ev in evidence.items():
        if 0 < i < n:
            log_lr[i] = ev.log_lr - ev.shared_log_lr
    # log P(c = x) = sum over i >= x of log_lr[i], for x = 1..n (the bad end is on the bad side for every c).
    suffix = np.cumsum(log_lr[::-1])[::-1][1:] + _shared_log_lik(n, evidence)
    post = np.exp(suffix - suffix.max())
    normalised: np.ndarray = post / post.sum()
    return normalised


def _shared_log_lik(n: int, evidence: Mapping[int, Evidence]) -> np.ndarray | float:
    """For c = 1..n: log of the integral over each end mean's error of the product of the node
    terms, the positions below c taking their good side's, the rest their bad side's. The two
    ends' errors are independent, so the integral is one per side."""
    inner = {i: ev for i, ev in evidence.items() if 0 < i < n and ev.shared_good}
    if not inner:
        return 0.0
    k = len(next(iter(inner.values())).shared_good)
    weights = hermegauss(k)[1]
    log_w = np.log(weights / weights.sum())
    good, bad = np.zeros((n + 1, k)), np.zeros((n + 1, k))
    for i, ev in inner.items():
        good[i], bad[i] = ev.shared_good, ev.shared_bad
    below = np.cumsum(good, axis=0)[:-1]  # row x - 1: the good terms of positions < x, x = 1..n
    above = np.cumsum(bad[::-1], axis=0)[::-1][1:]  # row x - 1: the bad terms of positions >= x
    shared: np.ndarray = _log_mean(below, log_w) + _log_mean(above, log_w)
    return shared


def _log_mean(terms: np.ndarray, log_w: np.ndarray) -> np.ndarray:
    """log sum_k w_k exp(terms[:, k]), row by row, without overflow."""
    total = terms + log_w
    top = total.max(axis=1, keepdims=True)
    result: np.ndarray = top[:, 0] + np.log(np.exp(total - top).sum(axis=1))
    return result


def _blocks(n: int, evidence: Mapping[int, Evidence]) -> np.ndarray:
    """Block id per position 1..n: a skipped position joins the next one (no step can split them)."""
    starts = np.ones(n, dtype=int)
    starts[0] = 0
    for i, ev in evidence.items():
        if 0 < i < n and ev.skipped and not ev.trials:
            starts[i] = 0  # position i + 1 continues i's block
    return np.cumsum(starts)


def _steps(ev: Evidence) -> int:
    return ev.good + ev.bad


def _unsure_end(problem: SearchProblem, ev: Evidence, which: str) -> bool:
    """Whether an end its steps put on the other side is asked again: its ratios (where its
    oracle gives any) do not yet make the other side ``confidence`` sure, and it has steps left.
    A measured end near the line can fall on the wrong side once by chance."""
    against = -ev.log_lr if which == "bad" else ev.log_lr
    bound = math.log(problem.confidence / (1 - problem.confidence))
    return ev.log_lr != 0 and against < bound and _steps(ev) < MAX_STEPS


def decide_likelihood(problem: SearchProblem, evidence: Mapping[int, Evidence]) -> Decision:
    """The ends, then the posterior's quantiles until one block holds ``confidence``."""
    n = problem.n
    e0, en = evidence.get(0, Evidence()), evidence.get(n, Evidence())
    ends: list[Query] = []
    if problem.check_ends:
        for index, ev, which in ((0, e0, "good"), (n, en, "bad")):
            if ev.skipped and not ev.trials:
                return EndsWrong(which, {"skipped": 1.0})  # type: ignore[arg-type]
            wrong = ev.bad if which == "good" else ev.good
            if 2 * wrong > ev.trials:  # most of its steps put the end on the other side
                if not _unsure_end(problem, ev, which):
                    return EndsWrong(which, {"log_likelihood_ratio": ev.log_lr})  # type: ignore[arg-type]
                ends.append(Query(index))
            elif not ev.trials:
                ends.append(Query(index))
    if ends:
        return Next(tuple(ends[: problem.slots]))
    if n == 1:
        return Found(1, confidence=1.0, figures={"posterior": 1.0})
    post = change_point_posterior(n, evidence)
    blocks = _blocks(n, evidence)
    block_mass = np.bincount(blocks, weights=post)
    best = int(np.argmax(block_mass))
    if block_mass[best] >= problem.confidence:
        short = _short_of_answer(problem, blocks, best, evidence)
        if short is not None:
            return Next((Query(short),))
        return _answer(problem, blocks, block_mass, best, evidence)
    picks = _quantile_picks(problem, evidence, post)
    if not picks:
        return _answer(problem, blocks, block_mass, best, evidence)
    return Next(tuple(Query(i) for i in picks))


def _quantile_picks(problem: SearchProblem, evidence: Mapping[int, Evidence], post: np.ndarray) -> list[int]:
    """Positions at the posterior's k/(k+1) quantiles (k slots): a step at x tells c <= x from c > x,
    so the quantiles split the mass evenly. Positions that cannot be asked (skipped, or at
    ``MAX_STEPS``) are left out. Where steps cost differently (builds against overlays) the round
    is the one of most information per cost instead (costs.py), one slot or several."""
    n = problem.n
    cumulative = np.cumsum(post)[:-1]  # P(c <= x) for x = 1..n-1
    # A step at x tells c <= x from c > x: where either holds (almost) none of the mass it can
    # move nothing (asking it would only spend runs while the undecided commits stay undecided).
    telling = TELLING_SHARE * (1 - problem.confidence)

    def askable_within(cap: int) -> list[int]:
        return [x for x in range(1, n)
                if not evidence.get(x, Evidence()).skipped and _steps(evidence.get(x, Evidence())) < cap
                and telling < float(cumulative[x - 1]) < 1 - telling]

    askable = askable_within(MAX_STEPS)
    if not askable and problem.answer_log_lr > 0:
        askable = askable_within(ANSWER_MAX_STEPS)
    if not askable:
        return []
    cheaper = most_information_per_cost(cumulative, askable, step_costs(problem, evidence), problem.slots)
    if cheaper is not None:
        return list(cheaper)
    picks: list[int] = []
    for k in range(1, problem.slots + 1):
        target = k / (problem.slots + 1)
        # The askable position whose P(c <= x) is nearest the quantile: with the mass on one commit
        # that is its parent (P small), not the commit itself (P = 1 tells nothing).
        choice = min((a for a in askable if a not in picks),
                     key=lambda a: (abs(float(cumulative[a - 1]) - target), a), default=None)
        if choice is None:
            break
        picks.append(choice)
    return sorted(picks)


def _short_of_answer(problem: SearchProblem, blocks: np.ndarray, best: int,
                     evidence: Mapping[int, Evidence]) -> int | None:
    """The answer's culprit or parent whose steps add up to less than ``answer_log_lr`` on its
    side and may be asked again (the culprit first); None when both stand, or neither can be asked."""
    if problem.answer_log_lr <= 0:
        return None
    members = np.flatnonzero(blocks == best) + 1
    for position, side in ((int(members[-1]), 1.0), (int(members[0]) - 1, -1.0)):
        ev = evidence.get(position, Evidence())
        if 0 < position < problem.n and side * ev.log_lr < problem.answer_log_lr and not ev.skipped \
                and _steps(ev) < MAX_STEPS:
            return position
    return None


def _answer(problem: SearchProblem, blocks: np.ndarray, block_mass: np.ndarray, best: int,
            evidence: Mapping[int, Evidence]) -> Decision:
    members = np.flatnonzero(blocks == best) + 1
    lo, hi = int(members[0]) - 1, int(members[-1])
    figures = {"posterior": float(block_mass[best]),
               "culprit_log_lr": float(evidence.get(hi, Evidence()).log_lr),
               "parent_log_lr": float(evidence.get(lo, Evidence()).log_lr),
               "steps": float(sum(_steps(ev) for ev in evidence.values()))}
    agreed = _agreed_range(problem, lo, hi, evidence)
    if agreed != (lo, hi):
        return Narrowed(*agreed, figures={**figures, "disagreeing_culprit": float(hi)})
    if hi - lo == 1 and block_mass[best] < problem.confidence:
        return best_guess(blocks, block_mass, best, problem.confidence, figures)
    if hi - lo == 1:
        return Found(hi, confidence=float(block_mass[best]), figures=figures)
    return Narrowed(lo, hi, figures=figures)


def _agreed_range(problem: SearchProblem, lo: int, hi: int, evidence: Mapping[int, Evidence]) -> tuple[int, int]:
    """The answer (lo, hi], or, where its parent's own steps put it on the bad side by at least
    ``answer_log_lr`` (or its culprit's on the good side), the range no position's steps
    contradict by that much (`agreement.agreed_range`). By the time the search answers, such a
    neighbour has spent its steps (it is asked again while short of the bound): the posterior then
    outweighs decisive steps of its own neighbour only through the other steps and the ends'
    shared error, and the history disagrees with itself."""
    own = {p: ev.log_lr for p, ev in evidence.items() if 0 < p < problem.n}
    return agreed_range(own, problem.answer_log_lr, lo, hi, problem.n)
