"""The search's levels mode: one change-point model over every measured run (search/two_levels.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.search import EndsWrong, Evidence, Found, Narrowed, Next, Query, SearchProblem, decide, two_levels
from bisect_npu.search.costs import INFORMATION_FLOOR
from bisect_npu.search.two_levels import (
    BASELINE_PRIOR,
    SPREAD_PRIOR_RUNS,
    UNDER_LINE_PRIOR,
    ends_under_line,
    expected_information,
    posterior,
    t_log_cdf,
)

THRESHOLD = 0.97


def problem(n: int, slots: int = 1, confidence: float = 0.99) -> SearchProblem:
    return SearchProblem(n=n, mode="levels", slots=slots, confidence=confidence, threshold=THRESHOLD)


def test_students_t_cdf_matches_its_closed_forms_in_both_tails() -> None:
    """One and two degrees of freedom have closed forms; the far tail must not cancel to zero
    (a change point far from the data weighs its bad side by it)."""
    t = np.array([-1e4, -30.0, -3.0, -0.5, 0.0, 0.5, 3.0, 30.0])
    cauchy = 0.5 + np.arctan(t) / np.pi
    cauchy[t < 0] = np.arctan(-1 / t[t < 0]) / np.pi  # the same, without cancelling
    assert np.allclose(t_log_cdf(t, 1.0), np.log(cauchy), rtol=1e-10, atol=1e-12)
    two = 0.5 + t / (2 * np.sqrt(2 + t * t))
    left = t < -10  # 0.5 - 0.5 |t| / sqrt(2 + t^2) cancels: its exact form there
    two[left] = 1 / (np.sqrt(2 + t[left] ** 2) * (np.sqrt(2 + t[left] ** 2) - t[left]))
    assert np.allclose(t_log_cdf(t, 2.0), np.log(two), rtol=1e-9, atol=1e-12)
    assert t_log_cdf(np.array([0.0]), 17.0)[0] == pytest.approx(math.log(0.5))


def history(culprit: int, n: int, runs_at: dict[int, int], seed: int, drop: float = 0.07,
            spread: float = 0.02) -> dict[int, list[float]]:
    rng = np.random.default_rng(seed)
    return {i: list(1000 * (1 - drop * (i >= culprit)) + 1000 * spread * rng.normal(size=k))
            for i, k in runs_at.items()}


def test_the_posterior_weighs_every_run_the_ends_included() -> None:
    """Two runs a position leave the change clear; the good end's run alone does not make it so
    (nothing before the culprit but the good end's one run), its second run does."""
    runs = history(9, 16, dict.fromkeys(range(17), 2), seed=3)
    post = posterior(16, runs, THRESHOLD)
    assert post is not None and int(np.argmax(post)) + 1 == 9 and post[8] > 0.99
    thin = history(1, 16, {0: 1, 16: 1, 1: 1, 2: 1, 8: 1}, seed=5)
    assert posterior(16, {0: thin[0], 16: thin[16]}, THRESHOLD) is None  # two runs weigh no spread
    sure = posterior(16, thin, THRESHOLD)
    assert sure is not None and sure[0] < 0.99
    more = posterior(16, {**thin, 0: [*thin[0], *history(1, 16, {0: 2}, seed=6)[0]]}, THRESHOLD)
    assert more is not None and more[0] > sure[0]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(0, 1000), st.floats(0.01, 100.0))
def test_the_posterior_does_not_depend_on_the_unit(culprit: int, seed: int, unit: float) -> None:
    """tokens/s or requests/s: the line is a share of the good side, so every run scaled alike
    leaves the posterior as it was."""
    runs = history(culprit, 12, {i: 1 + i % 3 for i in range(13)}, seed)
    post = posterior(12, runs, THRESHOLD)
    scaled = posterior(12, {i: [unit * v for v in values] for i, values in runs.items()}, THRESHOLD)
    assert post is not None and scaled is not None
    assert np.allclose(post, scaled, atol=1e-9)


def test_a_few_runs_that_lie_close_do_not_make_the_change_sure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight runs a 4% drop apart that happen to spread a quarter of the true 2% (a history where the
    1/sigma prior alone named a wrong culprit at 0.99, its runs rounded): under the spread's prior it is
    not sure yet; where many runs measure the spread, the prior moves the posterior little."""
    close = {0: [988.0], 19: [984.0], 29: [983.0], 31: [988.0], 32: [976.0], 33: [933.0], 39: [946.0, 939.0]}
    assert (post := posterior(39, close, THRESHOLD, 1000.0)) is not None and post[32:34].sum() < 0.9
    many = history(20, 39, {**dict.fromkeys(range(0, 39, 2), 3), 39: 3}, seed=7, drop=0.04)
    with_prior = posterior(39, many, THRESHOLD)
    monkeypatch.setattr(two_levels, "SPREAD_PRIOR_RUNS", 0.0)
    alone = posterior(39, close, THRESHOLD, 1000.0)
    assert alone is not None and alone[32:34].sum() > 0.98  # 33 and 34 (unbuildable there): one block
    assert with_prior is not None and np.abs(with_prior - posterior(39, many, THRESHOLD)).max() < 0.05


def test_the_ends_come_first_and_a_bad_end_over_the_line_is_wrong() -> None:
    assert decide(problem(16), {}) == Next((Query(0),))
    assert decide(problem(16, slots=2), {}) == Next((Query(0), Query(16)))
    assert isinstance(decide(problem(16), {0: Evidence(skipped=True)}), EndsWrong)
    level = history(17, 16, {0: 4, 16: 4, 8: 3}, seed=2)  # no change at all: the bad end is not bad
    wrong = decide(problem(16), {i: Evidence().measure(tuple(v)) for i, v in level.items()})
    assert isinstance(wrong, EndsWrong) and wrong.which == "bad"
    assert ends_under_line(16, level, THRESHOLD) < 0.01
    tight = (1000.0, 1000.5, 999.8, 1000.2, 1000.1, 999.9)
    once = {0: (1000.0,), 16: (1030.0,), 8: tight, 4: tuple(v - 1 for v in tight)}  # a tight spread, one run an end
    assert ends_under_line(16, once, THRESHOLD) < 0.01
    asked = decide(problem(16), {i: Evidence().measure(v) for i, v in once.items()})
    assert asked == Next((Query(16),))  # asked again before it is judged wrong
    assert ends_under_line(16, history(16, 16, {0: 4, 16: 4, 8: 3}, seed=2, drop=0.12), THRESHOLD) > 0.99


def test_the_ends_are_judged_under_the_posteriors_spread_prior(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four runs that lie close do not make a bad end just over the line surely wrong: the check
    reads the spread under the same prior as the posterior (1/sigma alone called it wrong); where
    many runs measure the spread the prior moves it little."""
    close = {0: (1000.0,), 16: (1001.0,), 8: (1000.0, 1000.5), 4: (999.0, 999.4)}
    level = history(17, 16, dict.fromkeys(range(17), 3), seed=4, drop=0.0)
    near = {**level, 16: [v - 29.0 for v in level[16]]}  # the bad end about on the line
    assert ends_under_line(16, close, THRESHOLD) > 0.1
    with_prior = ends_under_line(16, near, THRESHOLD)
    monkeypatch.setattr(two_levels, "SPREAD_PRIOR_RUNS", 0.0)
    assert ends_under_line(16, close, THRESHOLD) < 0.01
    assert abs(ends_under_line(16, near, THRESHOLD) - with_prior) < 0.05


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(0, 1000), st.floats(0.0, 0.1), st.sampled_from([None, 1000.0]))
def test_the_line_moves_no_positions_odds_past_its_priors(culprit: int, seed: int, drop: float,
                                                          baseline: float | None) -> None:
    """Whatever the runs (a drop past the line, short of it or none), the line moves the odds
    between any two positions by at most its prior's, UNDER_LINE_PRIOR to 1 - UNDER_LINE_PRIOR,
    against the model that does not ask it: a split the runs do not favour is not made sure by its
    bad side happening to lie low (taken as given, the line named such splits at 0.99)."""
    runs = history(culprit, 12, {i: 1 + i % 3 for i in range(13)}, seed, drop=drop)
    with_line = two_levels.log_likelihood(12, runs, THRESHOLD, baseline)
    with patch("bisect_npu.search.two_levels.UNDER_LINE_PRIOR", 0.5):
        without = two_levels.log_likelihood(12, runs, THRESHOLD, baseline)
    assert with_line is not None and without is not None
    moved = with_line - without
    assert float(moved.max() - moved.min()) <= math.log(UNDER_LINE_PRIOR / (1 - UNDER_LINE_PRIOR)) + 1e-9


def test_a_drop_short_of_the_line_is_not_put_where_the_bad_end_runs_low(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2% drop at commit 9 (the line 3% under the good side), its bad end's runs low by chance:
    taken as given, the line puts most of the change at the bad end, the one split whose bad side
    lies under it; as a prior it leaves the runs to say so, and P(under the line) says it is unsure."""
    runs = history(9, 16, {0: 3, 4: 2, 8: 3, 9: 3, 12: 2, 15: 2, 16: 2}, seed=22, drop=0.02)
    post = posterior(16, runs, THRESHOLD)
    assert post is not None and post[15] < 0.6 and ends_under_line(16, runs, THRESHOLD) < 0.9
    monkeypatch.setattr(two_levels, "UNDER_LINE_PRIOR", 1 - 1e-12)
    given = posterior(16, runs, THRESHOLD)
    assert given is not None and given[15] > 0.8


def brute_force_under_line(n: int, runs: dict[int, list[float]]) -> float:
    """P(the bad side's mean under the line | runs) summed on a grid: both means flat, the line a
    prior (``line_prior``), the spread 1/sigma with its pseudo-runs, the culprit uniform."""
    good_means = np.linspace(0.8, 1.2, 201)[:, None]
    bad_means = np.linspace(0.8, 1.2, 201)[None, :]
    prior, under = line_prior(good_means, bad_means), bad_means < THRESHOLD * good_means
    every, below = 0.0, 0.0
    for sigma in np.geomspace(0.004, 0.4, 100):
        for c in range(1, n + 1):
            left = [v for i, vs in runs.items() if i < c for v in vs]
            right = [v for i, vs in runs.items() if i >= c for v in vs]
            squares = sum((v - good_means) ** 2 for v in left) + sum((v - bad_means) ** 2 for v in right)
            weight = (spread_prior(sigma, runs) * prior * np.exp(-squares / (2 * sigma**2))
                      / sigma ** (len(left) + len(right)))
            every, below = every + float(weight.sum()), below + float((weight * under).sum())
    return below / every


def test_the_line_is_asked_of_the_model_summed_by_brute_force() -> None:
    """P(under the line), the ends' check, against the model on a grid: a drop short of the line,
    the runs unsure which side of it the bad side lies."""
    runs = {0: [1.0, 0.97], 1: [1.01], 2: [0.96], 3: [0.99, 0.97], 4: [0.975]}
    closed = ends_under_line(4, runs, THRESHOLD)
    assert 0.05 < closed < 0.95 and closed == pytest.approx(brute_force_under_line(4, runs), abs=3e-3)


def test_once_a_position_leads_the_run_asked_settles_it_against_its_rivals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(two_levels, "SPREAD_PRIOR_RUNS", 0.0)  # the query rule on the runs' own spread
    runs = {0: (1.005,), 1: (1.019,), 2: (0.937, 0.918), 8: (0.934,)}
    post = posterior(8, runs, THRESHOLD)
    assert post is not None and two_levels.LATE_SHARE <= post.max() < 0.99 and int(np.argmax(post)) + 1 == 2
    asked = decide(problem(8), {i: Evidence().measure(v) for i, v in runs.items()})
    assert asked == Next((Query(1),))  # the run that tells c = 2 from c = 1, its likeliest rival
    monkeypatch.setattr(two_levels, "LATE_SHARE", 1.0)  # the entropy alone: it asks far from the leader
    gains = expected_information(8, runs, THRESHOLD, list(range(9)))
    assert int(np.argmax(gains)) > 2


def test_a_built_commit_is_run_again_where_it_teaches_nearly_as_much_as_a_new_build() -> None:
    """A run is weighed by what it teaches per cost (one run, plus a build where the commit has no
    image): a built commit that teaches nearly as much as the most informative one is run again
    instead of building that one; one that teaches under ``INFORMATION_FLOOR`` of it is not, however
    dear the build (a search that always took the cheapest teaching run would walk its built
    commits and learn little)."""
    n = 16
    near = {0: (1.0, 1.005), n: (0.93, 0.925), 8: (0.963,)}  # commit 8 halfway: a run there teaches nearly the most
    evidence = {i: Evidence().measure(v) for i, v in near.items()}
    gains = expected_information(n, near, THRESHOLD, list(range(n + 1)))
    assert int(np.argmax(gains)) != 8 and gains[8] >= INFORMATION_FLOOR * gains.max()
    assert decide(problem(n), evidence) == Next((Query(int(np.argmax(gains))),))
    for build in (1.0, 20.0):
        assert decide(replace(problem(n), build_cost=build), evidence) == Next((Query(8),))
    far = {**near, 8: (0.99,), 12: (0.935,)}  # the change between 8 and 12: 8 and 12 teach little now
    evidence = {i: Evidence().measure(v) for i, v in far.items()}
    gains = expected_information(n, far, THRESHOLD, list(range(n + 1)))
    assert max(gains[8], gains[12]) < INFORMATION_FLOOR * gains.max()
    assert decide(replace(problem(n), build_cost=20.0), evidence) == Next((Query(int(np.argmax(gains))),))


@pytest.mark.parametrize(("baseline", "earlier"), [(None, ((), ())), (1.0, ((), ())), (1.0, ((), (0.93,))),
                                                   (0.9, ((), (1.01,)))])
def test_a_run_is_expected_to_teach_something_wherever_it_goes(
        baseline: float | None, earlier: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    """The query rule's outcome is drawn from the model's own predictive, every prior of the
    posterior in it (the baseline, the earlier runs, the line's lean): a run's expected fall of the
    change point's entropy is then never negative, the good end's with a baseline where its runs are
    or a nightly value over the line included."""
    runs = {0: (1.0, 0.98), 1: (1.0,), 4: (0.93, 0.92), 9: (0.92,)}
    with patch.object(two_levels, "LATE_SHARE", 1.0):  # the entropy throughout
        gains = expected_information(9, runs, THRESHOLD, list(range(10)), baseline=baseline, earlier=earlier)
    assert gains.min() >= 0.0 and int(np.argmax(gains)) in (2, 3)  # the culprit lies between 1 and 4


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 10), st.integers(0, 10_000), st.sets(st.integers(1, 9), max_size=3))
def test_every_decision_asks_what_it_may_and_answers_only_when_sure(culprit: int, seed: int,
                                                                     unbuildable: set[int]) -> None:
    """Driven to the end on a simulated history: a query never goes to a position skipped without a
    run, a position never runs past max_trials_per_query, and an answer holds its confidence."""
    n, cap = 10, 6
    rng = np.random.default_rng(seed)
    search = SearchProblem(n=n, mode="levels", confidence=0.95, threshold=THRESHOLD, max_trials_per_query=cap)
    evidence: dict[int, Evidence] = {}
    for _ in range(8 * n):
        decision = decide(search, evidence)
        if not isinstance(decision, Next):
            break
        (query,) = decision.queries
        ev = evidence.get(query.index, Evidence())
        assert not (ev.skipped and not ev.measured) and len(ev.measured) < cap
        if query.index in unbuildable - {culprit}:
            evidence[query.index] = ev.add("skip")
        else:
            value = 1000 * (1 - 0.07 * (query.index >= culprit)) + 20 * rng.normal()
            evidence[query.index] = ev.measure((value,))
    assert isinstance(decision, Found | Narrowed)
    if isinstance(decision, Found):
        assert decision.confidence >= 0.95 or all(len(evidence.get(i, Evidence()).measured) >= cap
                                                   for i in range(n + 1))


@pytest.mark.heavy
def test_wrong_culprits_named_stay_under_the_confidence_left() -> None:
    """Calibration: over seeded histories (39 candidates, a 7% drop against a 3% line, a 2%
    spread) the share of wrong culprits named at confidence 0.95 stays within what 0.95 allows,
    at about as many runs as bisection's; the means and spread are learned from the runs alone."""
    n, histories, wrong, runs = 39, 60, 0, 0
    for seed in range(histories):
        rng = np.random.default_rng([seed, 51])
        culprit = int(rng.integers(1, n + 1))
        evidence: dict[int, Evidence] = {}
        decision = decide(problem(n, confidence=0.95), evidence)
        while isinstance(decision, Next):
            (query,) = decision.queries
            value = 1000 * (1 - 0.07 * (query.index >= culprit)) + 20 * rng.normal()
            evidence[query.index] = evidence.get(query.index, Evidence()).measure((value,))
            runs += 1
            decision = decide(problem(n, confidence=0.95), evidence)
        assert isinstance(decision, Found)
        wrong += decision.index != culprit
    assert wrong <= 0.05 * histories
    assert runs / histories < 16


def spread_prior(sigma: float, runs: dict[int, list[float]]) -> float:
    """SPREAD_PRIOR_RUNS pseudo-runs as wide as the line's gap at the session's runs' level."""
    gap = (1 - THRESHOLD) * float(np.mean([v for vs in runs.values() for v in vs]))
    return float(sigma ** -SPREAD_PRIOR_RUNS * np.exp(-SPREAD_PRIOR_RUNS * gap**2 / (2 * sigma**2)))


def line_prior(good_means: np.ndarray, bad_means: np.ndarray) -> np.ndarray:
    """The two means' prior density on a grid: UNDER_LINE_PRIOR where the bad one lies under the
    line, the rest over it."""
    result: np.ndarray = np.where(bad_means < THRESHOLD * good_means, UNDER_LINE_PRIOR, 1 - UNDER_LINE_PRIOR)
    return result


def brute_force_posterior(n: int, runs: dict[int, list[float]], baseline: float) -> np.ndarray:
    """P(c | runs) by summing the model on a grid: the good mean under BASELINE_PRIOR's mixture,
    the bad mean flat, under the line with the prior's UNDER_LINE_PRIOR, the spread 1/sigma with
    its pseudo-runs, every run normal."""
    good_means = np.linspace(0.6, 1.4, 401)[:, None]
    bad_means = np.linspace(0.6, 1.4, 401)[None, :]
    under = line_prior(good_means, bad_means)
    lik = np.zeros(n)
    for sigma in np.geomspace(0.01, 1.0, 160):  # the 1/sigma prior: uniform on a log grid
        prior_good = sum(weight * np.sqrt(worth) / sigma
                         * np.exp(-worth * (good_means - baseline) ** 2 / (2 * sigma**2))
                         for worth, weight in BASELINE_PRIOR)
        for c in range(1, n + 1):
            left = [v for i, vs in runs.items() if i < c for v in vs]
            right = [v for i, vs in runs.items() if i >= c for v in vs]
            squares = sum((v - good_means) ** 2 for v in left) + sum((v - bad_means) ** 2 for v in right)
            log_runs = -squares / (2 * sigma**2)
            lik[c - 1] += spread_prior(sigma, runs) * float(
                (prior_good * under * np.exp(log_runs) / sigma ** (len(left) + len(right))).sum())
    result: np.ndarray = lik / lik.sum()
    return result


@pytest.mark.parametrize("baseline", [1.0, 0.96, 1.1])
def test_the_baseline_prior_is_the_model_summed_by_brute_force(baseline: float) -> None:
    """The closed form against the model summed on a grid of both means and the spread: the
    baseline where the runs put the good side, a little under it, and far over it."""
    runs = {0: [1.02, 0.95], 1: [0.99], 2: [0.91], 3: [0.83, 0.9], 4: [0.86]}
    closed = posterior(4, runs, THRESHOLD, baseline)
    assert closed is not None
    assert np.allclose(closed, brute_force_posterior(4, runs, baseline), atol=2e-3)
    assert not np.allclose(closed, posterior(4, runs, THRESHOLD), atol=2e-3)  # the baseline weighs


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(0, 1000), st.floats(0.01, 100.0), st.floats(-0.1, 0.1))
def test_the_baseline_posterior_does_not_depend_on_the_unit(culprit: int, seed: int, unit: float,
                                                            off: float) -> None:
    """The baseline scaled with the runs (tokens/s or requests/s) leaves the posterior as it was."""
    runs = history(culprit, 12, {i: 1 + i % 3 for i in range(13)}, seed)
    post = posterior(12, runs, THRESHOLD, 1000 * (1 + off))
    scaled = posterior(12, {i: [unit * v for v in values] for i, values in runs.items()}, THRESHOLD,
                       unit * 1000 * (1 + off))
    assert post is not None and scaled is not None
    assert np.allclose(post, scaled, atol=1e-9)


def test_a_baseline_where_the_good_side_is_sharpens_the_culprit_and_one_far_off_does_not_mislead() -> None:
    """One run of the good end and a few candidates': the published level where the good side
    runs puts more of the posterior on the culprit than the runs alone (over seeded histories);
    a baseline a hundred spreads off moves no history's answer from the culprit to another."""
    sharper = 0
    for seed in range(20):
        runs = history(6, 12, {0: 1, 3: 1, 5: 1, 6: 1, 9: 1, 12: 1}, seed)
        alone, right, off = (posterior(12, runs, THRESHOLD, b) for b in (None, 1000.0, 3000.0))
        assert alone is not None and right is not None and off is not None
        sharper += right[5] > alone[5]
        assert int(np.argmax(off)) == int(np.argmax(alone)) or max(off) < 0.5
    assert sharper >= 15


def test_a_baseline_that_is_not_a_positive_number_is_refused() -> None:
    for bad in (0.0, -5.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="baseline"):
            decide(SearchProblem(n=4, mode="levels", baseline=bad), {})


def brute_force_with_earlier(n: int, runs: dict[int, list[float]], baseline: float,
                             earlier: tuple[tuple[float, ...], tuple[float, ...]]) -> np.ndarray:
    """P(c | runs) summed on a grid, the nightly host's values (the baseline, the earlier runs at
    each end) sharing one worth per component of BASELINE_PRIOR: each normal about its side's mean
    with the spread squared over the worth as its variance, both means flat, the bad one under the
    line with the prior's UNDER_LINE_PRIOR."""
    good_means = np.linspace(0.6, 1.4, 401)[:, None]
    bad_means = np.linspace(0.6, 1.4, 401)[None, :]
    under = line_prior(good_means, bad_means)
    host_good, host_bad = (baseline, *earlier[0]), earlier[1]
    lik = np.zeros(n)
    for sigma in np.geomspace(0.01, 1.0, 160):
        host = sum(weight * (np.sqrt(worth) / sigma) ** (len(host_good) + len(host_bad))
                   * np.exp(-worth * (sum((v - good_means) ** 2 for v in host_good)
                                      + sum((v - bad_means) ** 2 for v in host_bad)) / (2 * sigma**2))
                   for worth, weight in BASELINE_PRIOR)
        for c in range(1, n + 1):
            left = [v for i, vs in runs.items() if i < c for v in vs]
            right = [v for i, vs in runs.items() if i >= c for v in vs]
            squares = sum((v - good_means) ** 2 for v in left) + sum((v - bad_means) ** 2 for v in right)
            lik[c - 1] += spread_prior(sigma, runs) * float((host * under * np.exp(-squares / (2 * sigma**2))
                                                             / sigma ** (len(left) + len(right))).sum())
    result: np.ndarray = lik / lik.sum()
    return result


@pytest.mark.heavy  # a grid of both means and the spread per case: seconds each
@pytest.mark.parametrize(("baseline", "earlier"), [(1.0, ((), (0.9,))), (1.0, ((1.01,), (0.88, 0.92))),
                                                   (1.1, ((), (1.05,)))])
def test_earlier_runs_are_the_model_summed_by_brute_force(
        baseline: float, earlier: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
    """The closed form against the model on a grid: a nightly value at the bad side's level, runs
    at both ends, and a host off where the baseline and the value are both over the runs."""
    runs = {0: [1.02, 0.95], 1: [0.99], 2: [0.91], 3: [0.83, 0.9], 4: [0.86]}
    closed = posterior(4, runs, THRESHOLD, baseline, earlier)
    assert closed is not None
    assert np.allclose(closed, brute_force_with_earlier(4, runs, baseline, earlier), atol=2e-3)
    assert not np.allclose(closed, posterior(4, runs, THRESHOLD, baseline), atol=2e-3)  # they weigh


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(0, 1000), st.lists(st.floats(900.0, 1100.0), max_size=2),
       st.lists(st.floats(850.0, 1000.0), min_size=1, max_size=2), st.sampled_from([None, 1000.0]))
def test_on_the_sessions_host_earlier_runs_move_the_posterior_as_runs_at_the_ends(
        culprit: int, seed: int, good: list[float], bad: list[float], baseline: float | None) -> None:
    """Where the nightly's host is the session's (the prior's worth-1 component alone), the earlier
    values, and the baseline, are runs at their ends: the posterior is the one of those runs (the
    spread's prior, read at the session's own runs' level, left out: the values join that level here)."""
    runs = history(culprit, 12, {i: 1 + i % 2 for i in range(0, 13, 2)}, seed)
    with patch("bisect_npu.search.two_levels.SPREAD_PRIOR_RUNS", 0.0):
        with patch("bisect_npu.search.two_levels.BASELINE_PRIOR", ((1.0, 1.0),)):
            given_earlier = posterior(12, runs, THRESHOLD, baseline, (tuple(good), tuple(bad)))
        as_runs = posterior(12, {**runs, 0: [*runs[0], *good, *([baseline] if baseline else [])],
                                 12: [*runs[12], *bad]}, THRESHOLD)
    assert given_earlier is not None and as_runs is not None
    assert np.allclose(given_earlier, as_runs, atol=1e-9)


def test_the_bad_ends_earlier_run_spares_its_first_run_and_an_answer_rests_on_the_sessions_runs() -> None:
    """Given the failing nightly's value, the first runs are the good end's; an answer names a
    block with a run of the session on each side of it, even where the nightly's value alone
    would put the change at the bad end."""
    n = 8
    nightly = SearchProblem(n=n, mode="levels", threshold=THRESHOLD, baseline=1000.0, earlier_levels=((), (930.0,)))
    assert decide(nightly, {}) == Next((Query(0),))
    assert decide(nightly, {0: Evidence().measure((1001.0,))}) == Next((Query(0),))
    # every commit the session ran runs at the good level: only the nightly's value is low
    good = {i: Evidence().measure((1000.0 + d, 998.0 - d)) for i, d in zip(range(n), (3, -2, 4, 1, -3, 2, 0, 5),
                                                                           strict=True)}
    decision = decide(nightly, good)
    assert decision == Next((Query(n),))


@pytest.mark.heavy  # two dozen whole searches
def test_off_host_earlier_runs_cost_runs_not_the_answer() -> None:
    """The failing nightly's value from another host (its level 20-50% off the session's, either
    way, the baseline with it): over seeded histories no wrong culprit is named at 0.95 beyond
    what 0.95 allows, and the bad end is run by the session itself."""
    n, histories, wrong = 20, 24, 0
    for seed in range(histories):
        rng = np.random.default_rng([seed, 61])
        culprit, host = int(rng.integers(1, n + 1)), float(rng.choice([0.5, 0.8, 1.2, 1.5]))
        problem_ = SearchProblem(n=n, mode="levels", confidence=0.95, threshold=THRESHOLD, baseline=1000.0 * host,
                                 earlier_levels=((), (930.0 * host + 20 * rng.normal(),)))
        evidence: dict[int, Evidence] = {}
        decision = decide(problem_, evidence)
        while isinstance(decision, Next):
            (query,) = decision.queries
            value = 1000 * (1 - 0.07 * (query.index >= culprit)) + 20 * rng.normal()
            evidence[query.index] = evidence.get(query.index, Evidence()).measure((value,))
            decision = decide(problem_, evidence)
        assert isinstance(decision, Found | Narrowed)
        wrong += isinstance(decision, Found) and decision.index != culprit
        hi = decision.index if isinstance(decision, Found) else decision.hi
        assert any(evidence.get(i, Evidence()).measured for i in range(hi, n + 1))
    assert wrong <= 0.05 * histories


def test_earlier_runs_that_are_no_throughput_are_refused() -> None:
    for bad in (0.0, -951.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="earlier_levels"):
            decide(SearchProblem(n=4, mode="levels", earlier_levels=((), (bad,))), {})


def test_a_positions_own_ratio_is_the_flat_models_odds_of_moving_it_alone() -> None:
    """The parent's own ratio is the flat model's log odds of the change at the parent against at
    the culprit (only the parent changes side), the culprit's the odds of the change at it against
    one after it; positions inside a skipped range and the ends have none."""
    n, runs = 10, history(6, 10, dict.fromkeys(range(11), 2), seed=7)
    center = two_levels._center(runs)
    count, total, squares = two_levels._side_sums(n, runs, center)
    flat = two_levels._flat_sides(*two_levels._split(count, total, squares), float(count.sum()), center, THRESHOLD,
                                  two_levels._level(count, total, center))[0]
    own = two_levels.own_log_lr(n, runs, THRESHOLD, 5, 6)
    assert own[5] == pytest.approx(flat[4] - flat[5]) and own[6] == pytest.approx(flat[5] - flat[6])
    assert own[5] < -4 < 4 < own[6] and 0 not in own and n not in own
    assert 6 not in two_levels.own_log_lr(n, runs, THRESHOLD, 5, 7)


def test_an_answer_the_parents_own_runs_contradict_is_the_range_they_agree_on() -> None:
    """The nightly host's earlier runs (the good end's at 1000, the bad end's at 930) outweigh the
    session's runs, which put the good end and commit 1 together at 911 and the bad end at 1004:
    the posterior leans to commit 1 as the culprit, its own runs say good by more than the answer's
    odds (4.6), every run spent. The search names the range (0, 2], its runs disagreeing."""
    runs = {0: (909.0, 914.0), 1: (912.0, 910.0), 2: (1004.0, 1005.0)}
    held = SearchProblem(n=2, mode="levels", threshold=THRESHOLD, max_trials_per_query=2, check_ends=False,
                         earlier_levels=((930.0, 1000.0, 1000.0, 1000.0, 1000.0), (930.0, 930.0, 930.0, 1000.0)))
    post = posterior(2, runs, THRESHOLD, None, held.earlier_levels)
    assert post is not None and int(np.argmax(post)) == 0
    assert two_levels.own_log_lr(2, runs, THRESHOLD, 0, 1)[1] < -math.log(99)
    decision = decide(held, {i: Evidence().measure(v) for i, v in runs.items()})
    assert isinstance(decision, Narrowed) and (decision.lo, decision.hi) == (0, 2)
    assert decision.figures["disagreeing_culprit"] == 1


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(1, 3), st.data())
def test_no_answer_is_named_that_its_neighbours_own_runs_contradict(n: int, k: int, data: st.DataObject) -> None:
    """Histories whose every position has spent its runs, each at one of two levels or between,
    with the nightly host's earlier runs and a baseline that may disagree with the session's: a
    culprit named is never one whose own runs, or its parent's, go against it by the answer's
    odds; a range named instead holds the culprit the posterior leaned to, and no position outside
    it has runs so judged against it (or, below the confidence, holds the best guess, which no
    neighbour's runs so contradict)."""
    level = st.sampled_from([1000.0, 965.0, 930.0])
    runs = {i: tuple(data.draw(level) + data.draw(st.floats(-40.0, 40.0)) for _ in range(k)) for i in range(n + 1)}
    earlier = tuple(tuple(data.draw(st.lists(st.floats(900.0, 1050.0), max_size=12))) for _ in range(2))
    held = SearchProblem(n=n, mode="levels", threshold=THRESHOLD, max_trials_per_query=k, check_ends=False,
                         baseline=data.draw(st.sampled_from([None, 1000.0, 930.0])),
                         earlier_levels=(earlier[0], earlier[1]))
    decision = decide(held, {i: Evidence().measure(v) for i, v in runs.items()})
    bound = math.log(99)
    if isinstance(decision, Found):
        own = two_levels.own_log_lr(n, runs, THRESHOLD, decision.index - 1, decision.index)
        assert own.get(decision.index - 1, 0.0) < bound and own.get(decision.index, 0.0) > -bound
    elif isinstance(decision, Narrowed) and "best_guess" in decision.figures:
        guess = int(decision.figures["best_guess"])
        assert decision.lo < guess <= decision.hi and decision.figures["posterior"] < held.confidence
        own = two_levels.own_log_lr(n, runs, THRESHOLD, guess - 1, guess)
        assert own.get(guess - 1, 0.0) < bound and own.get(guess, 0.0) > -bound
    elif isinstance(decision, Narrowed):
        culprit = int(decision.figures["disagreeing_culprit"])
        assert decision.lo < culprit <= decision.hi and decision.hi - decision.lo > 1
        own = two_levels.own_log_lr(n, runs, THRESHOLD, culprit - 1, culprit)
        assert own.get(culprit - 1, 0.0) >= bound or own.get(culprit, 0.0) <= -bound
        assert all(v < bound for i, v in own.items() if i <= decision.lo)
        assert all(v > -bound for i, v in own.items() if i >= decision.hi)
    else:
        assert not isinstance(decision, Next)
