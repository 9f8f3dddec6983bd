"""Token match with near ties, trials statistics, acceptance, effective parameters, and stages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bisect_npu.intervals import wilson_interval
from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.acceptance import judge_acceptance
from bisect_npu.oracle.config import (
    AcceptanceConfig,
    LogitsConfig,
    PenaltyConfig,
    StagesConfig,
    StatsConfig,
    TokenMatchConfig,
)
from bisect_npu.oracle.dumps.compare import write_dump
from bisect_npu.oracle.penalty import judge_penalty
from bisect_npu.oracle.stages import judge_stages
from bisect_npu.oracle.stats import Undecided, judge_trials
from bisect_npu.oracle.tokens import judge_tokens


def steps(*rows: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    return list(rows)


REF_TOKENS = [5, 6, 7, 8, 9]
REF_LOGPROBS = steps([(5, -0.1)], [(6, -0.2)], [(7, -0.69), (70, -0.70)], [(8, -0.1)], [(9, -0.1)])


def test_exact_match_and_real_mismatch() -> None:
    ref = Observation(output_token_ids=REF_TOKENS, top_logprobs=REF_LOGPROBS)
    same = judge_tokens(Observation(output_token_ids=REF_TOKENS), ref, TokenMatchConfig())
    assert same.kind == VerdictKind.GOOD and same.figures["match_rate"] == 1.0
    wrong = judge_tokens(Observation(output_token_ids=[5, 99, 7, 8, 9]), ref, TokenMatchConfig())
    assert wrong.kind == VerdictKind.BAD
    assert (wrong.figures["first_mismatch"], wrong.figures["shared_prefix"]) == (1, 1)
    assert wrong.figures["match_rate"] == 0.2
    longer = judge_tokens(Observation(output_token_ids=[*REF_TOKENS, 1]), ref, TokenMatchConfig())
    assert longer.kind == VerdictKind.BAD and longer.figures["first_mismatch"] == 5


def test_near_tie_first_mismatch_is_not_a_regression() -> None:
    ref = Observation(output_token_ids=REF_TOKENS, top_logprobs=REF_LOGPROBS)
    cand = Observation(output_token_ids=[5, 6, 70, 1, 2])
    verdict = judge_tokens(cand, ref, TokenMatchConfig(tie_margin=0.05))
    assert verdict.kind == VerdictKind.GOOD and verdict.figures["tie_at"] == 2
    assert verdict.figures["after_tie_checked"] is False
    # Outside the margin it is a regression.
    assert judge_tokens(cand, ref, TokenMatchConfig(tie_margin=0.001)).kind == VerdictKind.BAD


def test_real_divergence_after_a_tie_still_counts() -> None:
    ref = Observation(output_token_ids=REF_TOKENS, top_logprobs=REF_LOGPROBS)
    own = steps([(5, -0.1)], [(6, -0.2)], [(70, -0.69), (7, -0.70)], [(1, -0.1), (3, -2.0)], [(4, -0.1), (2, -3.0)])
    consistent = Observation(output_token_ids=[5, 6, 70, 1, 4], top_logprobs=own)
    assert judge_tokens(consistent, ref, TokenMatchConfig()).kind == VerdictKind.GOOD
    drifted = Observation(output_token_ids=[5, 6, 70, 1, 2], top_logprobs=own)
    verdict = judge_tokens(drifted, ref, TokenMatchConfig())
    assert verdict.kind == VerdictKind.BAD and verdict.figures["real_divergence_at"] == 4


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson_interval(1, 5, 0.95)
    assert round(low, 3) == 0.036 and round(high, 3) == 0.624
    assert wilson_interval(0, 20, 0.95)[0] == 0.0


def test_trials_one_in_five_bad_against_zero_in_twenty() -> None:
    cfg = StatsConfig(confidence=0.95, good_rate=0.0, bad_rate=0.2)
    bad = judge_trials([False, False, True, False, False], cfg, reference_rate=0 / 20)
    assert isinstance(bad, Verdict) and bad.kind == VerdictKind.BAD
    assert bad.figures["bad_trials"] == 1 and bad.figures["rate"] == 0.2 and bad.trials == 5
    good = judge_trials([False] * 20, cfg, reference_rate=0.0)
    assert isinstance(good, Verdict) and good.kind == VerdictKind.GOOD
    early = judge_trials([False] * 5, cfg, reference_rate=0.0)
    assert isinstance(early, Undecided) and early.more_trials > 0
    doubling = StatsConfig(method="doubling", good_rate=0.0, bad_rate=0.5)
    assert judge_trials([True, True, False, True], doubling).kind == VerdictKind.BAD  # type: ignore[union-attr]
    forced = judge_trials([False] * 40, StatsConfig(good_rate=0.1, bad_rate=0.12, max_trials=40))
    assert isinstance(forced, Verdict) and forced.figures["forced_at_max_trials"]


def test_acceptance_rate_and_agreement() -> None:
    cfg = AcceptanceConfig(min_acceptance_rate=0.3, min_token_agreement=1.0)
    broken = Observation(output_token_ids=[1, 2], extra={"spec_decode": {"proposed": 200, "accepted": 0}})
    verdict = judge_acceptance(broken, None, cfg)
    assert verdict.kind == VerdictKind.BAD and verdict.figures["acceptance_rate"] == 0.0
    fine = Observation(output_token_ids=[1, 2], extra={"spec_decode": {"proposed": 200, "accepted": 150}})
    assert judge_acceptance(fine, Observation(output_token_ids=[1, 2]), cfg).kind == VerdictKind.GOOD
    assert judge_acceptance(fine, Observation(output_token_ids=[1, 3]), cfg).kind == VerdictKind.BAD
    assert judge_acceptance(Observation(), None, cfg).kind == VerdictKind.SKIP


def test_effective_presence_penalty_silently_dropped() -> None:
    cfg = PenaltyConfig(expected={"presence_penalty": 1.5})
    dropped = judge_penalty(Observation(sampling={"presence_penalty": 0.0, "temperature": 0.7}), cfg)
    assert dropped.kind == VerdictKind.BAD
    assert dropped.figures["differing"] == {"presence_penalty": {"expected": 1.5, "effective": 0.0}}
    assert judge_penalty(Observation(sampling={"presence_penalty": 1.5}), cfg).kind == VerdictKind.GOOD
    assert judge_penalty(Observation(), cfg).kind == VerdictKind.SKIP


def test_stages_name_the_first_differing_stage(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tensors = [(f"model.layers.{i}.output", rng.standard_normal((4, 8)).astype(np.float32)) for i in range(3)]
    write_dump(tmp_path / "ref", tensors)
    write_dump(tmp_path / "cand", [(n, a * (1 if i < 2 else -1)) for i, (n, a) in enumerate(tensors)])
    base = {"chat_template": "<|user|>hi<|assistant|>", "prompt_token_ids": [1, 2, 3],
            "sampler": {"temperature": 0.0, "top_p": 1.0}, "text": "hello"}
    ref = Observation(extra={"stages": {**base, "forward": str(tmp_path / "ref")}})
    cand = Observation(extra={"stages": {**base, "forward": str(tmp_path / "cand"), "text": "help"}})
    verdict = judge_stages(cand, ref, StagesConfig(), LogitsConfig())
    assert verdict.kind == VerdictKind.BAD and verdict.figures["first_differing_stage"] == "forward"
    assert verdict.figures["stages"]["forward"]["first_divergent"]["name"] == "model.layers.2.output"
    assert verdict.figures["stages"]["text"]["first_difference"] == 3
    templ = Observation(extra={"stages": {**base, "chat_template": "<|user|> hi<|assistant|>"}})
    verdict = judge_stages(templ, Observation(extra={"stages": base}), StagesConfig(), LogitsConfig())
    assert verdict.figures["first_differing_stage"] == "chat_template"
    assert verdict.figures["skipped_stages"] == ["forward"]


def test_a_flip_beyond_the_margin_is_a_real_divergence_even_at_a_small_reference_gap() -> None:
    """With logprobs on both sides the tie is judged on what moved between the runs, not on the reference alone."""
    ref = Observation(output_token_ids=REF_TOKENS, top_logprobs=REF_LOGPROBS)  # 7 over 70 by 0.01 at token 2
    rounding = steps([(5, -0.1)], [(6, -0.2)], [(70, -0.60), (7, -0.75)], [(1, -0.1)], [(4, -0.1)])
    clean = judge_tokens(Observation(output_token_ids=[5, 6, 70, 1, 4], top_logprobs=rounding), ref,
                         TokenMatchConfig(flip_margin=0.5))
    assert clean.kind == VerdictKind.GOOD and clean.figures["tie_at"] == 2
    assert clean.figures["flip"] == pytest.approx(0.16)
    faulty = steps([(5, -0.1)], [(6, -0.2)], [(70, -0.1), (7, -2.5)], [(1, -0.1)], [(4, -0.1)])
    verdict = judge_tokens(Observation(output_token_ids=[5, 6, 70, 1, 4], top_logprobs=faulty), ref,
                           TokenMatchConfig(flip_margin=0.5))
    assert verdict.kind == VerdictKind.BAD and verdict.figures["flip"] == pytest.approx(2.41)
    assert "moved 2.41" in verdict.reason
    # The measured margin (flip_margin unset) calls it bad too; without the candidate's logprobs only the
    # reference's own gap can be read, and it calls the same output a tie.
    assert judge_tokens(Observation(output_token_ids=[5, 6, 70, 1, 4], top_logprobs=faulty), ref,
                        TokenMatchConfig()).kind == VerdictKind.BAD
    assert judge_tokens(Observation(output_token_ids=[5, 6, 70, 1, 4]), ref, TokenMatchConfig()).kind == \
        VerdictKind.GOOD
