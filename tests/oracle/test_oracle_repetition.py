"""Loop detection: streaming and offline detectors against a straightforward implementation of the rule."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle import repetition
from bisect_npu.oracle.config import RepetitionConfig
from bisect_npu.oracle.repetition import find_loop, find_near_loop, judge_repetition
from bisect_npu.probe.loop import StreamingLoopDetector


def rule_first_hit(tokens: list[int], lo: int, hi: int, count: int, covered: int) -> tuple[int, int] | None:
    """(n, L): the first output length n where some period L in [lo, hi] has its tail periodic, smallest L."""
    for n in range(1, len(tokens) + 1):
        for period in range(lo, hi + 1):
            need = max((count - 1) * period, covered - period)
            if period + need <= n and all(tokens[j] == tokens[j - period] for j in range(n - need, n)):
                return n, period
    return None


def periodic_extent(tokens: list[int], start: int, period: int) -> int:
    end = start + period
    while end < len(tokens) and tokens[end] == tokens[end - period]:
        end += 1
    return end - start


@st.composite
def sequences(draw: st.DrawFn) -> list[int]:
    """Random tokens over small alphabets, with planted (and spoiled) repeats: the adversarial cases."""
    alphabet = draw(st.integers(1, 4))
    parts: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            parts += draw(st.lists(st.integers(0, alphabet - 1), max_size=40))
        else:
            pattern = draw(st.lists(st.integers(0, alphabet + 2), min_size=1, max_size=30))
            repeated = pattern * draw(st.integers(1, 6))
            if repeated and draw(st.booleans()):  # one changed token: an almost-loop
                repeated[draw(st.integers(0, len(repeated) - 1))] = alphabet + 7
            parts += repeated
    return parts[:220]


@settings(max_examples=300, deadline=None)
@given(tokens=sequences(), lo=st.integers(1, 4), span=st.integers(0, 60), count=st.integers(2, 4),
       covered=st.sampled_from([0, 0, 12, 45]))
def test_streaming_and_offline_agree_with_the_rule(tokens: list[int], lo: int, span: int, count: int,
                                                   covered: int) -> None:
    hi = lo + span
    expected = rule_first_hit(tokens, lo, hi, count, covered)
    stream = StreamingLoopDetector(lo, hi, count, min_covered_tokens=covered).feed(tokens)
    cfg = RepetitionConfig(min_pattern_size=lo, max_pattern_size=hi, min_count=count, offline_max_period=hi)
    offline = find_loop(tokens, cfg, min_covered=covered)
    saved = repetition.SCAN_OVER_SURVIVORS
    try:  # the other verification path: every surviving sample checked one by one / every period scanned
        repetition.SCAN_OVER_SURVIVORS = 0 if saved else 10**9
        assert find_loop(tokens, cfg, min_covered=covered) == offline
    finally:
        repetition.SCAN_OVER_SURVIVORS = saved
    if expected is None:
        assert stream is None and offline is None
        return
    n, period = expected
    assert stream is not None and offline is not None
    assert (stream.end, stream.period) == (offline.end, offline.period) == (n, period)
    assert stream.start == offline.start
    assert offline.covered_tokens == periodic_extent(tokens, offline.start, period)
    assert stream.covered_tokens == n - stream.start <= offline.covered_tokens
    assert offline.count == offline.covered_tokens // period


def test_vllm_rule_fires_at_exactly_count_repetitions() -> None:
    detector = StreamingLoopDetector(min_pattern_size=2, max_pattern_size=4, min_count=3)
    hits = [detector.push(t) for t in [9, 1, 2, 1, 2, 1]]
    assert hits[:-1] == [None] * 5
    assert hits[-1] is None  # [1, 2] twice plus one token is not three repetitions
    hit = detector.push(2)
    assert hit is not None and (hit.start, hit.period, hit.count, hit.end) == (1, 2, 3, 7)


def test_long_period_loop_far_into_the_output() -> None:
    rng = random.Random(3)
    text = [rng.randrange(5000) for _ in range(30_000)]
    pattern = [rng.randrange(5000) for _ in range(13)]
    tokens = text + pattern * 200
    cfg = RepetitionConfig()
    hit = find_loop(tokens, cfg)
    assert hit is not None
    assert (hit.start, hit.period, hit.covered_tokens) == (30_000, 13, 2600)
    verdict = judge_repetition(Observation(output_token_ids=tokens, finish_reason="length"), cfg)
    assert verdict.kind == VerdictKind.BAD
    assert verdict.figures["loop_start"] == 30_000 and verdict.figures["loop_period"] == 13
    assert "finish_reason=length" in verdict.reason


def test_repeated_200_token_sentence_beyond_vllm_max_pattern_size() -> None:
    rng = random.Random(4)
    sentence = [rng.randrange(5000) for _ in range(200)]
    tokens = [rng.randrange(5000) for _ in range(1000)] + sentence * 5
    cfg = RepetitionConfig(max_pattern_size=20)
    assert StreamingLoopDetector(1, 20, 3).feed(tokens) is None
    hit = find_loop(tokens, cfg)
    assert hit is not None and (hit.start, hit.period, hit.count) == (1000, 200, 5)


def test_counter_loop_is_a_near_loop() -> None:
    # "item 1 , item 2 , ..." : the number token changes each round, so no exact period exists.
    item, comma = 100_000, 100_001
    tokens = [t for i in range(1, 700) for t in (item, i, comma)]
    rng = random.Random(5)
    tokens = [rng.randrange(5000) for _ in range(600)] + tokens
    cfg = RepetitionConfig()
    assert find_loop(tokens, cfg) is None
    near = find_near_loop(tokens, cfg)
    assert near is not None and near.period == 3 and near.start >= 384
    verdict = judge_repetition(Observation(output_token_ids=tokens, finish_reason="length"), cfg)
    assert verdict.kind == VerdictKind.BAD and "near-loop" in verdict.reason


def test_text_without_loops_is_good_and_short_repeats_are_tolerated() -> None:
    rng = np.random.default_rng(6)
    weights = 1 / np.arange(1, 20_001) ** 1.1
    tokens = rng.choice(20_000, size=8000, p=weights / weights.sum()).tolist()
    tokens[100:106] = [7, 7, 7, 7, 7, 7]  # "!!!!!!": shorter than min_loop_tokens
    verdict = judge_repetition(Observation(output_token_ids=tokens, finish_reason="stop"), RepetitionConfig())
    assert verdict.kind == VerdictKind.GOOD, verdict.reason
    assert verdict.figures["output_tokens"] == 8000


def test_engine_repetition_stop_counts_and_empty_output_skips() -> None:
    cfg = RepetitionConfig()
    stopped = Observation(output_token_ids=[1, 2, 3], stop_reason="repetition_detected", finish_reason="stop")
    assert judge_repetition(stopped, cfg).kind == VerdictKind.BAD
    assert judge_repetition(Observation(), cfg).kind == VerdictKind.SKIP
