"""The answer of a search that leans to one commit below the confidence asked: the credible range
around its best guess (a `Narrowed`, never a `Found`), grown toward the heavier side."""

from __future__ import annotations

import numpy as np
import pytest

from bisect_npu.search import Evidence, Found, Narrowed, SearchProblem, decide
from bisect_npu.search.credible import best_guess, credible_range


def test_the_range_grows_from_the_best_guess_toward_the_heavier_neighbour_until_it_holds_the_confidence() -> None:
    blocks = np.arange(6)  # positions 1..6, one block each
    mass = np.array([0.001, 0.02, 0.3, 0.6, 0.07, 0.009])
    assert credible_range(blocks, mass, 3, 0.5) == (3, 4, pytest.approx(0.6))
    assert credible_range(blocks, mass, 3, 0.85) == (2, 4, pytest.approx(0.9))
    assert credible_range(blocks, mass, 3, 0.95) == (2, 5, pytest.approx(0.97))
    assert credible_range(blocks, mass, 3, 0.9995) == (0, 6, pytest.approx(1.0))


def test_a_block_of_skipped_commits_joins_the_range_whole() -> None:
    blocks = np.array([0, 1, 1, 2])  # position 2 skipped: it and 3 are one block
    mass = np.array([0.05, 0.35, 0.6])
    assert credible_range(blocks, mass, 2, 0.9) == (1, 4, pytest.approx(0.95))


def test_a_best_guess_is_a_range_with_the_guess_and_both_posteriors_in_its_figures() -> None:
    guess = best_guess(np.arange(4), np.array([0.05, 0.8, 0.1, 0.05]), 1, 0.9, {"posterior": 0.8})
    assert guess == Narrowed(1, 3, {"posterior": 0.8, "best_guess": 2.0, "range_posterior": pytest.approx(0.9)})


def test_a_noisy_search_whose_commits_are_all_capped_names_its_best_guess_in_a_range() -> None:
    """Every commit at its trial cap, the middle one halfway between the ends' rates: no commit
    holds the confidence, so the answer is the range that does, the likeliest commit inside."""
    problem = SearchProblem(n=2, mode="noisy", confidence=0.99, max_trials_per_query=20)
    evidence = {0: Evidence(good=18, bad=2), 1: Evidence(good=10, bad=10), 2: Evidence(good=2, bad=18)}
    decision = decide(problem, evidence)
    assert isinstance(decision, Narrowed) and (decision.lo, decision.hi) == (0, 2)
    assert decision.figures["best_guess"] in (1, 2) and decision.figures["posterior"] < 0.99


def test_a_likelihood_answer_at_the_confidence_is_still_found() -> None:
    problem = SearchProblem(n=4, mode="likelihood", confidence=0.99)
    evidence = {0: Evidence(good=1), 4: Evidence(bad=1), 1: Evidence(good=1).weigh(-9.0),
                2: Evidence(bad=1).weigh(9.0)}
    decision = decide(problem, evidence)
    assert isinstance(decision, Found) and decision.index == 2 and decision.confidence >= 0.99
