"""Focusing's choices: growing batches of what teaches most per sample run, a control set only when it can tell."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bisect_npu.observations import Observation, SampleOutcome, VerdictKind
from bisect_npu.oracle.accuracy import stats
from bisect_npu.oracle.accuracy.focus import by_evidence, discordant_ids, divergence, round_plan, smallest_control
from bisect_npu.oracle.accuracy.judge import judge_accuracy
from bisect_npu.oracle.config import AccuracyConfig, FocusConfig


def ends(discordant: int, agreeing: int) -> tuple[list[SampleOutcome], list[SampleOutcome]]:
    """Good and bad ends (one run each) that differ on the first `discordant` samples."""
    good = [SampleOutcome(id=f"s{i}", correct=1.0) for i in range(discordant + agreeing)]
    bad = [SampleOutcome(id=f"s{i}", correct=0.0 if i < discordant else 1.0) for i in range(discordant + agreeing)]
    return good, bad


@settings(max_examples=60, deadline=None)
@given(st.integers(4, 60), st.integers(0, 300), st.integers(1, 9), st.sampled_from([1.0, 1.5, 2.0, 4.0]))
def test_batches_grow_and_alike_samples_each_run_once_before_the_repeats(discordant: int, agreeing: int, batch: int,
                                                                        growth: float) -> None:
    """Samples the ends read alike tell alike: each runs once before any runs again (a second
    round tells less than a first), max_rounds rounds each in all, then the whole dataset."""
    good, bad = ends(discordant, agreeing)
    cfg = AccuracyConfig(focus=FocusConfig(batch=batch, growth=growth, control=0.1))
    plan = round_plan(cfg, good, bad, "c0ffee")
    wanted = set(discordant_ids(good, bad))
    rounds = [[i for i in r or [] if i in wanted] for r in plan[:-1]]
    assert len(rounds[0]) == min(batch, discordant)
    ran = [i for r in rounds for i in r]
    assert len(set(ran[:discordant])) == discordant  # every sample once before the repeats
    assert all(ran.count(i) == cfg.max_rounds for i in wanted)
    assert all(len(r) == len(set(r)) for r in plan[:-1] if r is not None)  # a sample once a round
    assert plan[-1] is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=4, max_size=14),
       st.sampled_from([1, 2, 4]), st.integers(1, 8))
def test_each_round_is_the_one_that_teaches_most(counts: list[tuple[int, int]], repeats: int, batch: int) -> None:
    """Ends of four runs a sample: one sample round after another, the sample whose next round
    adds most to the step's expected evidence (`divergence` of its runs so far and one round
    more), max_rounds rounds a discordant sample on average; the plan's rounds run them so, a
    sample once a round (its next round in a later one), then the whole dataset."""
    good = [SampleOutcome(id=f"s{i}", correct=g / 4, runs=4) for i, (g, _) in enumerate(counts)]
    bad = [SampleOutcome(id=f"s{i}", correct=b / 4, runs=4) for i, (_, b) in enumerate(counts)]
    good += [SampleOutcome(id=f"a{i}", correct=1.0, runs=4) for i in range(20)]
    bad += [SampleOutcome(id=f"a{i}", correct=1.0, runs=4) for i in range(20)]
    cfg = AccuracyConfig(repeats=repeats, focus=FocusConfig(batch=batch))
    discordant = discordant_ids(good, bad)
    assume(len(discordant) >= cfg.focus.min_discordant)
    order = by_evidence(cfg, good, bad, discordant)
    assert len(order) == cfg.max_rounds * len(discordant)
    prior = stats.fit_joint(good, bad)
    rates = {i: stats.side_rates(prior, stats.by_id(good)[i], stats.by_id(bad)[i]) for i in discordant}
    done = dict.fromkeys(discordant, 0)

    def gain(sample: str) -> float:
        runs = done[sample] * repeats
        return divergence(rates[sample], runs + repeats) - divergence(rates[sample], runs)

    for sample in order:
        assert gain(sample) >= max(map(gain, discordant)) - 1e-9
        done[sample] += 1
    plan = round_plan(cfg, good, bad, "c0ffee")
    assert sorted(i for r in plan[:-1] for i in r or [] if i in discordant) == sorted(order)
    assert all(len(r) == len(set(r)) for r in plan[:-1] if r is not None)
    assert plan[-1] is None


def test_a_telling_sample_runs_again_before_one_whose_ends_barely_differ() -> None:
    """Three samples the ends' four runs each put at 4 of 4 and 0 of 4, one at 3 and 2: more
    runs of the three tell more than a first of the fourth, which the focused rounds leave to
    the whole dataset."""
    good = [SampleOutcome(id=f"sure{i}", correct=1.0, runs=4) for i in range(3)]
    bad = [SampleOutcome(id=f"sure{i}", correct=0.0, runs=4) for i in range(3)]
    good += [SampleOutcome(id="small", correct=0.75, runs=4), *(SampleOutcome(id=f"a{i}", correct=1.0, runs=4)
                                                                 for i in range(20))]
    bad += [SampleOutcome(id="small", correct=0.5, runs=4), *(SampleOutcome(id=f"a{i}", correct=1.0, runs=4)
                                                               for i in range(20))]
    cfg = AccuracyConfig(repeats=2, focus=FocusConfig(batch=1, growth=1.0))
    plan = round_plan(cfg, good, bad, "c0ffee")
    assert plan[:-1] == [[f"sure{i}"] for _ in range(4) for i in range(3)]
    assert plan[-1] is None


def test_the_most_telling_samples_come_first() -> None:
    """Where the ends' many runs are sure the sample changed, it goes before one a single run
    each says changed, and that before a small difference in rates."""
    good = [SampleOutcome(id="small", correct=0.75, runs=4), SampleOutcome(id="once", correct=1.0, runs=1),
            SampleOutcome(id="sure", correct=1.0, runs=4), *(SampleOutcome(id=f"a{i}", correct=1.0, runs=4)
                                                                for i in range(20))]
    bad = [SampleOutcome(id="small", correct=0.5, runs=4), SampleOutcome(id="once", correct=0.0, runs=1),
           SampleOutcome(id="sure", correct=0.0, runs=4), *(SampleOutcome(id=f"a{i}", correct=1.0, runs=4)
                                                              for i in range(20))]
    assert discordant_ids(good, bad) == ["sure", "once", "small"]


def _candidate_failing(control: int, cfg: AccuracyConfig) -> bool:
    """Whether a candidate that fails `control` samples both ends got right is flagged broken elsewhere."""
    good, bad = ends(6, 200)
    mine = [SampleOutcome(id=f"s{i}", correct=1.0) for i in range(6)]
    mine += [SampleOutcome(id=f"s{6 + i}", correct=0.0) for i in range(control)]
    verdict = judge_accuracy(cfg, [Observation(case_id="accuracy", samples=mine)],
                             [Observation(case_id="accuracy", samples=good)],
                             [Observation(case_id="accuracy", samples=bad)], role="candidate", final=True)
    return bool(verdict.figures["broken_elsewhere"]) and verdict.kind == VerdictKind.BAD


@settings(deadline=None)  # judges 200-sample ends each example: slow on a loaded machine
@given(st.sampled_from([0.9, 0.95, 0.99, 0.999]), st.integers(1, 5))
def test_the_smallest_control_set_all_failing_is_flagged_and_all_passing_is_not(confidence: float,
                                                                                rounds: int) -> None:
    """Greedy ends (each sample right or wrong at both): a set of the smallest size the judge's
    control test can flag at even odds is flagged when all fail; a good candidate never is."""
    cfg = AccuracyConfig(confidence=confidence, max_rounds=rounds)
    least = smallest_control(cfg)
    assert _candidate_failing(least, cfg)
    assert not _candidate_failing(0, cfg)


@given(st.sampled_from([0.9, 0.95, 0.99, 0.999]), st.integers(1, 5))
def test_at_even_odds_a_set_under_the_smallest_cannot_reach_the_level(confidence: float, rounds: int) -> None:
    """Where a good commit gets each control sample right half the time, all of a set one short of
    `smallest_control` failing stays above the level, so such a set is not worth its runs."""
    cfg = AccuracyConfig(confidence=confidence, max_rounds=rounds)
    even = stats.JointPrior(0.5, 0.5, stats.MIN_VAR, stats.MIN_VAR, 0.0)
    level = (1 - confidence) / rounds

    def p_all_failing(n: int) -> float:
        return stats.control_p([SampleOutcome(id=f"c{i}", correct=0.0) for i in range(n)], [], [], even)[1]

    assert p_all_failing(smallest_control(cfg)) <= level < p_all_failing(smallest_control(cfg) - 1)


def test_a_control_set_too_small_to_flag_anything_is_not_run() -> None:
    good, bad = ends(6, 24)  # 5% of 24 agreeing: 2 control samples, fewer than can ever flag a candidate
    small = AccuracyConfig(focus=FocusConfig(control=0.05))
    assert smallest_control(small) == 9  # 0.99 over 3 rounds: 2^-9 <= 0.01 / 3
    plan = round_plan(small, good, bad, "abc")
    assert all(i in discordant_ids(good, bad) for r in plan[:-1] for i in r or [])
    enough = AccuracyConfig(focus=FocusConfig(control=9))
    controls = [i for i in (round_plan(enough, good, bad, "abc")[-2] or []) if i not in discordant_ids(good, bad)]
    assert len(controls) == 9


@settings(max_examples=60, deadline=None)
@given(st.integers(4, 40), st.integers(0, 200), st.data())
def test_a_commit_asked_again_plans_none_of_the_samples_it_ran(discordant: int, agreeing: int,
                                                               data: st.DataObject) -> None:
    """The samples an earlier step of the commit ran are left out of every focused round; once
    fewer than min_discordant discordant samples are left, the whole dataset runs."""
    good, bad = ends(discordant, agreeing)
    cfg = AccuracyConfig(focus=FocusConfig(batch=4, control=0.2))
    ran = set(data.draw(st.lists(st.sampled_from([s.id for s in good]), unique=True)))
    plan = round_plan(cfg, good, bad, "c0ffee", ran)
    left = [i for i in discordant_ids(good, bad) if i not in ran]
    if len(left) < cfg.focus.min_discordant:
        assert plan == [None] * cfg.max_rounds
        return
    focused = [i for r in plan if r is not None for i in r]
    assert not set(focused) & ran
    assert [i for i in (plan[0] or []) if i in left] == left[:4]  # the most telling of those left first
    assert plan[-1] is None
