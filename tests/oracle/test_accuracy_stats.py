"""The accuracy oracle's statistics, focusing and judge, on simulated per-sample results."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.observations import Observation, SampleOutcome, VerdictKind
from bisect_npu.oracle.accuracy import stats
from bisect_npu.oracle.accuracy.focus import discordant_ids, focus_ids, round_plan
from bisect_npu.oracle.accuracy.judge import judge_accuracy
from bisect_npu.oracle.config import AccuracyConfig, FocusConfig
from bisect_npu.recipe.schema import AccuracySpec, CommandHarnessSpec, SamplingSpec


def outcomes(counts: np.ndarray | list[int], runs: int = 1, prefix: str = "s") -> list[SampleOutcome]:
    return [SampleOutcome(id=f"{prefix}{i}", correct=float(k) / runs, runs=runs) for i, k in enumerate(counts)]


def observe(samples: list[SampleOutcome]) -> Observation:
    return Observation(case_id="accuracy", samples=samples)


def dataset(rng: np.random.Generator, size: int, good: float, drop: float, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample correctness rates of the good side and of the bad side (a broken subset)."""
    kappa = 1 / rho - 1
    good_rates = rng.beta(good * kappa, (1 - good) * kappa, size)
    bad_rates = good_rates.copy()
    for i in rng.permutation(size):
        if (good_rates - bad_rates).sum() >= size * drop:
            break
        bad_rates[i] = 0.0
    return good_rates, bad_rates


@given(st.integers(0, 40), st.integers(0, 40))
def test_mcnemar_is_a_probability_monotone_in_each_count(worse: int, better: int) -> None:
    p = stats.mcnemar_exact(worse, better)
    assert 0.0 <= p <= 1.0
    assert stats.mcnemar_exact(worse + 1, better) <= p  # more samples only the reference got right: stronger
    assert stats.mcnemar_exact(worse, better + 1) >= p


def test_mcnemar_matches_the_binomial_tail() -> None:
    assert stats.mcnemar_exact(5, 1) == pytest.approx(7 / 64)
    assert stats.mcnemar_exact(0, 0) == 1.0


def test_mcnemar_keeps_its_level_under_the_null() -> None:
    """Two commits with the same per-sample rates: the one-sided test rejects at most alpha of the time."""
    rng = np.random.default_rng(7)
    rejected = 0
    for _ in range(2000):
        rates = rng.beta(0.8, 0.2, 30)
        a, b = rng.random(30) < rates, rng.random(30) < rates
        rejected += stats.mcnemar_exact(int((b & ~a).sum()), int((a & ~b).sum())) <= 0.05
    assert rejected / 2000 <= 0.05


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=30))
def test_the_likelihood_ratio_changes_sign_when_the_ends_swap(rows: list[tuple[int, int, int]]) -> None:
    good = outcomes([g for g, _, _ in rows], 4)
    bad = outcomes([b for _, b, _ in rows], 4)
    candidate = outcomes([c for _, _, c in rows], 4)
    forward = stats.log_likelihood_ratio(candidate, good, bad)
    backward = stats.log_likelihood_ratio(candidate, bad, good)
    assert forward == pytest.approx(-backward, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3))
def test_a_candidate_more_like_the_good_end_has_a_lower_ratio(correct: int) -> None:
    """On samples the good end gets right and the bad end wrong, each more correct run says good."""
    good, bad = outcomes([4] * 6 + [3] * 20, 4), outcomes([0] * 6 + [3] * 20, 4)
    less = outcomes([correct] * 6 + [3] * 20, 4)
    more = outcomes([correct + 1] * 6 + [3] * 20, 4)
    assert stats.log_likelihood_ratio(more, good, bad) < stats.log_likelihood_ratio(less, good, bad)


def test_the_prior_fits_how_repeatable_samples_are() -> None:
    rng = np.random.default_rng(3)
    for rho in (0.2, 0.6, 0.9):
        rates, _ = dataset(rng, 2000, 0.7, 0.0, rho)
        good, bad = outcomes(rng.binomial(8, rates), 8), outcomes(rng.binomial(8, rates), 8)
        assert stats.fit_prior(good, bad).rho == pytest.approx(rho, abs=0.08)


@pytest.mark.parametrize("rho", [0.0, 0.5])
@pytest.mark.parametrize("shape", ["scaled", "subset"])
def test_one_run_an_end_finds_the_correlation_whichever_way_the_drop_came(rho: float, shape: str) -> None:
    """One run a sample at each end, 82% -> 70%: every rate scaled down or a subset broken, the
    single-run estimate finds the correlation either way (it used to find about 0.3 where answers
    are fresh draws and a scaled drop, and read the rest as samples that repeat)."""
    rng = np.random.default_rng(5)
    size = 8000
    kappa = 1 / rho - 1 if rho > 0 else math.inf
    good_rates = np.full(size, 0.82) if rho == 0.0 else rng.beta(0.82 * kappa, 0.18 * kappa, size)
    bad_rates = good_rates * (0.70 / 0.82) if shape == "scaled" else _subset_broken(rng, good_rates, 0.12)
    good, bad = outcomes(rng.binomial(1, good_rates)), outcomes(rng.binomial(1, bad_rates))
    fitted = stats.fit_prior(good, bad)
    want = min(stats.MAX_RHO, max(stats.MIN_RHO, rho))
    assert fitted.rho == pytest.approx(want, abs=0.08)
    assert fitted.rho_error < 0.05


def _subset_broken(rng: np.random.Generator, good_rates: np.ndarray, drop: float) -> np.ndarray:
    """The bad side's rates: the good side's with a random subset broken until the mean falls `drop`."""
    order = rng.permutation(len(good_rates))
    broken = order[:int(np.searchsorted(np.cumsum(good_rates[order]), drop * len(good_rates))) + 1]
    bad_rates = good_rates.copy()
    bad_rates[broken] = 0.0
    return bad_rates


def test_one_run_an_end_carries_the_correlations_error_into_the_spreads() -> None:
    """From single runs the spreads are estimates with an error (steps average over where they may
    lie), even where no sample the lower end got right did the higher end get wrong; greedy ends
    (temperature 0) know them exactly."""
    rng = np.random.default_rng(9)
    good, bad = outcomes(rng.binomial(1, 0.82, 200)), outcomes(rng.binomial(1, 0.70, 200))
    prior = stats.fit_joint(good, bad)
    assert prior.good_var_error > 0 and prior.bad_var_error > 0
    assert prior.rho < stats.STEER_MIN_RHO
    ends = outcomes([1] * 140 + [1] * 24 + [0] * 36), outcomes([1] * 140 + [0] * 24 + [0] * 36)
    assert stats.fit_joint(*ends).good_var_error > 0
    greedy = stats.fit_joint(*ends, greedy=True)
    assert greedy.good_var_error == 0 and greedy.bad_var_error == 0
    assert greedy.rho >= stats.STEER_MIN_RHO


def test_the_baseline_check_keeps_its_level_at_the_line() -> None:
    """A commit whose true score is exactly baseline - threshold is called bad at most alpha of the time."""
    rng = np.random.default_rng(11)
    bad_calls = 0
    for _ in range(1000):
        samples = outcomes((rng.random(200) < 0.7).astype(int))
        check = stats.baseline_check(samples, baseline=80.0, threshold=10.0, confidence=0.95)
        bad_calls += check.verdict == "bad"
    assert bad_calls / 1000 <= 0.05


def test_a_score_carries_its_interval() -> None:
    s = stats.score(outcomes([1] * 24 + [0] * 6), 0.95)
    assert s.accuracy == pytest.approx(80.0)
    assert s.low < 80.0 < s.high
    assert (s.samples, s.runs) == (30, 30)


def _step(cfg: AccuracyConfig, commit: str, rates: np.ndarray, good: list[SampleOutcome], bad: list[SampleOutcome],
          rng: np.random.Generator) -> tuple[VerdictKind, float, int]:
    """A candidate's step as the session runs it: rounds of its plan until the verdict is clear."""
    plan = round_plan(cfg, good, bad, commit)
    rounds: list[Observation] = []
    ran = 0
    for number, ids in enumerate(plan):
        chosen = [int(i[1:]) for i in ids] if ids is not None else list(range(len(rates)))
        ran += len(chosen) * cfg.repeats
        counts = rng.binomial(cfg.repeats, rates[chosen])
        rounds.append(observe([SampleOutcome(id=f"s{i}", correct=k / cfg.repeats, runs=cfg.repeats)
                               for i, k in zip(chosen, counts, strict=True)]))
        verdict = judge_accuracy(cfg, rounds, [observe(good)], [observe(bad)], role="candidate",
                                 final=number == len(plan) - 1)
        if not verdict.figures["more_rounds"]:
            break
    return verdict.kind, verdict.figures["log_likelihood_ratio"], ran


@pytest.mark.parametrize(("rho", "repeats"), [(0.95, 1), (0.5, 4)])
def test_sequential_steps_err_less_often_than_the_confidence_allows(rho: float, repeats: int) -> None:
    """Simulated regressions (500 samples, 95% -> 92%): candidates on either side are put on their
    side wrongly in at most 1 - confidence of the steps, however early a step stops; focused, at
    a quarter of the whole dataset's runs on average (one run a sample at each end cannot tell a
    broken subset from every rate scaled down, and a good commit then runs more to rule out the
    scaled drop)."""
    rng = np.random.default_rng(5)
    cfg = AccuracyConfig(repeats=repeats, confidence=0.95)
    wrong = steps = 0
    runs = []
    for case in range(40):
        good_rates, bad_rates = dataset(rng, 500, 0.95, 0.03, rho)
        good = outcomes(rng.binomial(repeats, good_rates), repeats)
        bad = outcomes(rng.binomial(repeats, bad_rates), repeats)
        for side, rates in (("good", good_rates), ("bad", bad_rates)):
            kind, _, ran = _step(cfg, f"c{case}{side}", rates, good, bad, rng)
            wrong += kind.value != side
            steps += 1
            runs.append(ran)
    assert wrong / steps <= 0.05
    assert np.mean(runs) < 500 * repeats / 4


def test_a_candidate_broken_elsewhere_is_bad() -> None:
    """The ends agree on the control samples; a candidate failing them is bad whatever the discordant say."""
    good = outcomes([1] * 10 + [1] * 90)
    bad = outcomes([0] * 10 + [1] * 90)
    cfg = AccuracyConfig(focus=FocusConfig(control=60))
    ids = focus_ids(cfg, good, bad, "abc") or []
    mine = [SampleOutcome(id=i, correct=1.0 if int(i[1:]) < 10 else 0.0) for i in ids]
    verdict = judge_accuracy(cfg, [observe(mine)], [observe(good)], [observe(bad)], role="candidate", final=True)
    assert verdict.kind == VerdictKind.BAD
    assert verdict.figures["broken_elsewhere"]


def test_focusing_runs_the_discordant_samples_first_then_more() -> None:
    good = outcomes([1] * 20 + [1] * 180)
    bad = outcomes([0] * 20 + [1] * 180)
    cfg = AccuracyConfig(max_rounds=2, focus=FocusConfig(batch=8, control=0.05))
    plan = round_plan(cfg, good, bad, "abc")
    # rounds of 8 and 16 sample runs, every discordant sample twice (max_rounds), each once before
    # any twice (the ends ran them once); 9 control samples ride along, twice each
    assert [len(r or []) for r in plan[:-1]] == [8 + 4, 16 + 7, 16 + 7]
    assert set(plan[0] or []) >= {f"s{i}" for i in range(8)}
    assert {*(plan[0] or []), *(plan[1] or [])} >= {f"s{i}" for i in range(20)}
    assert plan[-1] is None  # the fallback: the whole dataset
    assert round_plan(cfg, good, bad, "abc") == plan  # the same for one commit (a resume asks the same)
    assert round_plan(cfg, good, bad, "abd")[0] != plan[0]  # another commit, another control set
    assert set(discordant_ids(good, bad)) == {f"s{i}" for i in range(20)}


def test_too_few_discordant_samples_run_the_whole_dataset() -> None:
    good, bad = outcomes([1, 1, 1] + [1] * 50), outcomes([0, 0, 0] + [1] * 50)
    cfg = AccuracyConfig(focus=FocusConfig(min_discordant=4))
    assert round_plan(cfg, good, bad, "x") == [None] * cfg.max_rounds


def test_the_bad_end_must_score_lower_than_the_good_end() -> None:
    good = outcomes([1] * 25 + [0] * 5)
    same = judge_accuracy(AccuracyConfig(max_rounds=1), [observe(good)], [observe(good)], None, role="bad_end")
    assert same.kind == VerdictKind.GOOD and same.figures["forced_at_max_rounds"]
    worse = outcomes([0] * 12 + [1] * 13 + [0] * 5)
    verdict = judge_accuracy(AccuracyConfig(), [observe(worse)], [observe(good)], None, role="bad_end")
    assert verdict.kind == VerdictKind.BAD
    assert verdict.figures["only_good_right"] == 12
    assert len(verdict.figures["flipped"]) == 5


def test_the_good_end_below_its_baseline_is_bad() -> None:
    cfg = AccuracyConfig(reference="baseline", baseline=90.0, threshold=5.0, max_rounds=1)
    low = outcomes([1] * 60 + [0] * 40)
    verdict = judge_accuracy(cfg, [observe(low)], None, None, role="good_end")
    assert verdict.kind == VerdictKind.BAD
    assert verdict.figures["baseline_line"] == 85.0


def test_rounds_pool_into_rates() -> None:
    rounds = [observe(outcomes([1, 0])), observe(outcomes([1, 1]))]
    verdict = judge_accuracy(AccuracyConfig(), rounds, None, None, role="good_end")
    assert verdict.figures["accuracy"] == pytest.approx(75.0)
    assert verdict.figures["sample_runs"] == 4


def test_a_round_without_samples_is_skipped() -> None:
    verdict = judge_accuracy(AccuracyConfig(), [Observation(case_id="accuracy")], None, None, role="candidate")
    assert verdict.kind == VerdictKind.SKIP


def test_wald_bound() -> None:
    assert stats.wald_bound(0.99) == pytest.approx(math.log(99))


@given(st.integers(1, 60), st.data())
def test_clopper_pearson_bounds_hold_their_tails(n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, n))
    low, high = stats.clopper_pearson(k, n, 0.05)
    assert 0.0 <= low <= k / n <= high <= 1.0
    if k < n:
        assert stats.binomial_cdf(k, n, high) == pytest.approx(0.05, abs=1e-6)


def test_judge_on_its_own_pairs_against_the_reference_given() -> None:
    """`bisect-npu judge --recipe ACC --reference good.json obs.json`: bad when it scores lower."""
    from bisect_npu import oracle
    from bisect_npu.recipe.loader import parse_recipe

    recipe = parse_recipe("name: a\nmodel: {path: m}\noracle: {kinds: [accuracy]}\n"
                          "accuracy: {harness: command, dataset: d, command: {argv: [x]}}\n")
    good = observe(outcomes([1] * 40))
    worse = observe(outcomes([0] * 15 + [1] * 25))
    verdict = oracle.judge(recipe.oracle, [worse], [good], trials_per_case=1, accuracy=recipe.accuracy)
    assert verdict.kind == VerdictKind.BAD
    alone = oracle.judge(recipe.oracle, [worse], None, trials_per_case=1, accuracy=recipe.accuracy)
    assert alone.kind == VerdictKind.SKIP and "--reference" in alone.reason


@settings(max_examples=80, deadline=None)
@given(confidence=st.floats(0.6, 0.9999), rho=st.floats(0.01, 0.99), good=st.floats(0.05, 0.95),
       bad=st.floats(0.05, 0.95))
def test_a_step_stops_early_only_where_the_samples_repeat(confidence: float, rho: float, good: float,
                                                          bad: float) -> None:
    """Where the ends' fitted intraclass correlation is under STEER_MIN_RHO a candidate's step stops
    at the full step bound; above it at the steering bound, never beyond the full one."""
    prior = stats.JointPrior(good, bad, rho * good * (1 - good), rho * bad * (1 - bad), 0.0)
    assert prior.rho == pytest.approx(rho)
    full, stop = stats.step_bound(confidence), stats.stop_bound(confidence, prior)
    assert 0 < stop <= full
    if prior.rho < stats.STEER_MIN_RHO:
        assert stop == full
    else:
        assert stop == min(full, stats.wald_bound(1 - stats.STEER_ERROR))


@pytest.mark.parametrize(("error", "steers"), [(0.15, False), (0.02, True)])
def test_a_correlation_over_the_line_steers_only_when_its_error_keeps_it_there(error: float, steers: bool) -> None:
    """A fitted correlation of 0.45: one run a sample places it only to about 0.15 (about where
    the line lies, so steps stop at the full bound); from many repeats, to 0.02, it steers."""
    scale_g, scale_b = 0.82 * 0.18, 0.70 * 0.30
    prior = stats.JointPrior(0.82, 0.70, 0.45 * scale_g, 0.45 * scale_b, 0.0, error * scale_g, error * scale_b)
    assert prior.rho_error == pytest.approx(error)
    steering = min(stats.step_bound(0.99), stats.wald_bound(1 - stats.STEER_ERROR))
    assert stats.stop_bound(0.99, prior) == (steering if steers else stats.step_bound(0.99))


def test_one_run_an_end_takes_the_lower_ends_spread_at_the_least_the_covariance_allows() -> None:
    """Every rate scaled down at ICC 0.3, 82% -> 70%, one run a sample: the bad end's spread is the
    good end's times (70/82)^2, its true value (the one correlation at both ends put it at about
    twice that, and read the bad end's misses as broken samples)."""
    rng = np.random.default_rng(13)
    kappa = 1 / 0.3 - 1
    good_rates = rng.beta(0.82 * kappa, 0.18 * kappa, 8000)
    bad_rates = good_rates * (0.70 / 0.82)
    prior = stats.fit_joint(outcomes(rng.binomial(1, good_rates)), outcomes(rng.binomial(1, bad_rates)))
    assert prior.good_var == pytest.approx(float(np.var(good_rates)), abs=0.01)
    assert prior.bad_var == pytest.approx(float(np.var(bad_rates)), abs=0.006)
    assert prior.bad_var == pytest.approx(prior.good_var * (prior.bad_mean / prior.good_mean) ** 2)


def test_an_end_run_once_against_one_that_repeated_carries_the_correlations_error() -> None:
    """The bad end asked again (two runs a sample), the good end once: the good end's spread is
    the bad end's correlation at its own mean, so it comes with that correlation's error (it
    used to be taken as known, and the two spreads were never tied)."""
    rng = np.random.default_rng(11)
    good, bad = outcomes(rng.binomial(1, 0.82, 200)), outcomes(rng.binomial(2, 0.70, 200), 2)
    prior = stats.fit_joint(good, bad)
    assert prior.bad_var_error > 0
    assert prior.good_var_error == pytest.approx(
        min(prior.bad_var_error / (prior.bad_mean * (1 - prior.bad_mean)) * prior.good_mean * (1 - prior.good_mean),
            float(np.var([s.correct for s in good], ddof=1))))


def test_where_samples_repeat_a_step_stops_at_the_steering_bound_and_broken_elsewhere_weighs_the_full() -> None:
    """Greedy ends (temperature 0; every sample right or wrong at both, 10 broken): one broken
    sample run wrong settles a step at the steering bound, short of the answer's; a candidate
    broken elsewhere still weighs the full bound."""
    good = outcomes([1] * 10 + [1] * 90)
    bad = outcomes([0] * 10 + [1] * 90)
    cfg = AccuracySpec(harness="command", dataset="samples.jsonl", command=CommandHarnessSpec(argv=["harness"]),
                       sampling=SamplingSpec(temperature=0.0), focus=FocusConfig(control=60))
    mine = [SampleOutcome(id="s0", correct=0.0)]
    verdict = judge_accuracy(cfg, [observe(mine)], [observe(good)], [observe(bad)], role="candidate", final=False)
    full = stats.step_bound(cfg.confidence)
    assert verdict.figures["prior_rho"] >= stats.STEER_MIN_RHO
    assert verdict.figures["wald_bound"] == pytest.approx(stats.wald_bound(1 - stats.STEER_ERROR), abs=1e-4)
    assert verdict.figures["answer_bound"] == pytest.approx(full, abs=1e-4)
    assert verdict.kind == VerdictKind.BAD and not verdict.figures["more_rounds"]
    assert verdict.figures["wald_bound"] <= verdict.figures["log_likelihood_ratio"] < full
    ids = focus_ids(cfg, good, bad, "abc") or []
    elsewhere = [SampleOutcome(id=i, correct=1.0 if int(i[1:]) < 10 else 0.0) for i in ids]
    verdict = judge_accuracy(cfg, [observe(elsewhere)], [observe(good)], [observe(bad)], role="candidate", final=True)
    assert verdict.figures["broken_elsewhere"] and verdict.figures["log_likelihood_ratio"] >= full - 1e-4


def _fresh_draw_control(seed: int, candidate_rate: float) -> tuple[list[SampleOutcome], list[SampleOutcome],
                                                                    list[SampleOutcome]]:
    """Ends of two runs a sample where every answer is a fresh draw (intraclass correlation 0, 82%
    -> 70%, 400 samples; two runs measure that correlation), and a candidate's two runs of each
    sample the ends agreed on."""
    rng = np.random.default_rng(seed)
    good, bad = outcomes(rng.binomial(2, 0.82, 400), 2), outcomes(rng.binomial(2, 0.70, 400), 2)
    discordant = set(discordant_ids(good, bad))
    mine = [SampleOutcome(id=s.id, correct=rng.binomial(2, candidate_rate) / 2, runs=2) for s in good
            if s.id not in discordant]
    return good, bad, mine


def test_where_answers_are_fresh_draws_a_good_candidate_is_not_flagged_on_the_control_set() -> None:
    """The samples the ends agreed on are mostly ones the good end happened to get right: against
    the good end's own results a good commit scores points lower, against the good side's rates
    given both ends' runs it does not, and the control test flags none."""
    leans, flagged = [], 0
    for seed in range(8):
        good, bad, mine = _fresh_draw_control(seed, 0.82)
        leans.append(stats.paired_rate_p(mine, good)[0])
        diff, p = stats.control_p(mine, good, bad, stats.fit_joint(good, bad))
        flagged += diff < 0 and p <= 0.01 / 3
    assert sum(leans) / len(leans) < -0.03
    assert flagged == 0


def test_where_answers_are_fresh_draws_a_candidate_broken_elsewhere_is_flagged() -> None:
    for seed in range(4):
        good, bad, mine = _fresh_draw_control(seed, 0.6)
        diff, p = stats.control_p(mine, good, bad, stats.fit_joint(good, bad))
        assert diff < -0.1 and p <= 0.01 / 3


def test_greedy_ends_a_candidate_like_the_good_end_passes_the_control_test_and_one_failing_fails() -> None:
    """Where answers repeat the good side's rates are the good end's results: a candidate that
    repeats them passes, one failing as many control samples as exact McNemar needed is flagged."""
    good = outcomes([1] * 10 + [1] * 60 + [0] * 30)
    bad = outcomes([0] * 10 + [1] * 60 + [0] * 30)
    prior = stats.fit_joint(good, bad)
    control = good[10:]
    diff, p = stats.control_p(control, good, bad, prior)
    assert diff == pytest.approx(0.0, abs=0.01) and p > 0.25
    failing = [SampleOutcome(id=s.id, correct=0.0) if k < 9 else s for k, s in enumerate(control)]
    diff, p = stats.control_p(failing, good, bad, prior)
    assert diff == pytest.approx(-9 / 90, abs=0.01) and p <= 0.01 / 3



def test_ends_run_once_are_known_against_the_drop_s_lower_bound() -> None:
    """200 fresh draws a run: a good end read 87.5% against a bad end's 70% makes a 17.5-point
    drop whose fifth covers both means' errors, yet 2 errors of the difference below it, where a
    good end off by 2.4 of its errors puts the true drop, it does not: the ends run again. The
    same drop from two runs a sample is known as measured."""
    rng = np.random.default_rng(3)

    def fresh(right: int) -> np.ndarray:
        counts = np.zeros(200, dtype=int)
        counts[rng.permutation(200)[:right]] = 1
        return counts

    good, bad = outcomes(fresh(175)), outcomes(fresh(140))
    good_error, bad_error = stats.mean_errors(good, bad)
    assert max(good_error, bad_error) <= stats.ENDS_ERROR_SHARE * 0.175
    assert not stats.ends_known(good, bad)
    assert stats.ends_known(outcomes(rng.binomial(2, 0.875, 200), 2), outcomes(rng.binomial(2, 0.70, 200), 2))


def test_a_good_end_run_once_is_taken_at_the_low_end_of_its_error_in_the_control_test() -> None:
    """200 fresh draws a run, the good end read 89% where its commits score 82%: a good commit at
    78% on the control samples falls short of the good side's rates integrated over the good
    mean's error at a step's level, and would be broken elsewhere; at the low end of that error
    (shared by every step) it is not, while a candidate at 40% is broken either way."""
    rng = np.random.default_rng(0)

    def fresh(right: int, size: int = 200) -> np.ndarray:
        counts = np.zeros(size, dtype=int)
        counts[rng.permutation(size)[:right]] = 1
        return counts

    good, bad = outcomes(fresh(178)), outcomes(fresh(140))
    prior = stats.fit_joint(good, bad)
    discordant = set(discordant_ids(good, bad))
    control = [s for s in good if s.id not in discordant]

    def scoring(rate: float) -> list[SampleOutcome]:
        counts = fresh(round(rate * len(control)), len(control))
        return [SampleOutcome(id=s.id, correct=float(k), runs=1) for s, k in zip(control, counts, strict=True)]

    line = 0.01 / 3
    assert stats.control_p(scoring(0.78), good, bad, prior)[1] <= line
    assert stats.control_p(scoring(0.78), good, bad, prior, 0.99)[1] > line
    assert stats.control_p(scoring(0.4), good, bad, prior, 0.99)[1] <= line


def test_a_samples_run_noise_is_never_zero_at_the_ceiling() -> None:
    # The unbiased x(1 - x)/(R - 1) reads 4/4 as exact; the rate's posterior under the end's prior does not.
    noises = stats._run_noises(outcomes([4, 4, 2], runs=4), 0.9, 0.02)
    assert all(n > 0 for n in noises)
    assert noises[0] == noises[1] < noises[2]


def test_the_covariance_comes_with_its_error_where_both_ends_repeat_their_samples() -> None:
    rng = np.random.default_rng(5)
    good_rates, bad_rates = dataset(rng, 200, 0.9, 0.05, 0.7)
    good, bad = outcomes(rng.binomial(4, good_rates), 4), outcomes(rng.binomial(4, bad_rates), 4)
    prior = stats.fit_joint(good, bad)
    assert 0 < prior.cov_error < prior.cov
    once = stats.fit_joint(outcomes(rng.binomial(1, good_rates)), outcomes(rng.binomial(1, bad_rates)))
    assert once.cov_error == 0


def test_a_step_is_averaged_over_where_the_covariance_may_lie() -> None:
    prior = stats.JointPrior(0.95, 0.9, 0.03, 0.03, 0.025, 0.003, 0.003, 200, cov_error=0.004)
    nodes = stats._spread_nodes(prior)
    assert len(nodes) == 9
    assert stats._log_sum_exp([w for w, _ in nodes]) == pytest.approx(0.0)
    assert all(0 <= p.cov <= 0.999 * math.sqrt(p.good_var * p.bad_var) + 1e-12 for _, p in nodes)
    assert any(p.cov == pytest.approx(0.999 * math.sqrt(p.good_var * p.bad_var)) for _, p in nodes)
    # A sample the ends disagree on (4/4 at the good end, 2/4 at the bad): below the tie it reads as
    # broken, so a candidate's 4/4 there says good; the covariance's error (up to the tie) says less.
    good, bad, candidate = outcomes([4], 4), outcomes([2], 4), outcomes([4], 4)
    known = stats.step_evidence(candidate, good, bad, replace(prior, cov_error=0.0)).log_lr
    loose = stats.step_evidence(candidate, good, bad, prior).log_lr
    assert known < loose < 0
