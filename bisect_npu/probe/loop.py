"""Streaming loop detector with vLLM's `repetition_detection` rule (standard library only).

The rule, as vLLM's scheduler applies it after every generated token: the output *ends* with a
pattern of L tokens (min_pattern_size <= L <= max_pattern_size) repeated min_count times in a
row, i.e. its last L*min_count tokens are L-periodic. The smallest such L wins.

We add one optional knob, `min_covered_tokens` (0 = vLLM exactly): the periodic tail must also
span at least that many tokens, so "the the the" does not stop a 32K answer while a repeated
sentence still does. In general: for an output of n tokens, period L fires when
out[j] == out[j - L] for every j in [n - need(L), n), where
need(L) = max((min_count - 1) * L, min_covered_tokens - L).

Why incremental: the probe calls `push` once per token for 32K tokens; re-checking every L against
the previous blocks costs O(max_pattern_size) calls per token. Here a period L can only continue
its periodic run when the new token equals the token L back, so we visit only the recent
occurrences of the new token's value (a per-value deque of positions inside the window) and keep
the run start of each live period. Per token that is O(occurrences of this token in the last
max_pattern_size tokens): small for text, and bounded by the window in a loop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class LoopHit:
    """A loop: tokens [start, end) are `period`-periodic and span `covered_tokens` tokens.

    `count` is the number of whole repetitions (covered_tokens // period). `end` is the output
    length at which the rule first fired (the loop's detection point); the streaming detector
    sees only that far, the offline judge extends `covered_tokens` to the loop's real end.
    """

    start: int
    period: int
    count: int
    covered_tokens: int
    end: int

    def to_dict(self) -> dict[str, int]:
        return {"start": self.start, "period": self.period, "count": self.count,
                "covered_tokens": self.covered_tokens, "end": self.end}


def needed_run(period: int, min_count: int, min_covered_tokens: int) -> int:
    """How many trailing positions j must satisfy out[j] == out[j - period] for a hit."""
    return max((min_count - 1) * period, min_covered_tokens - period)


class StreamingLoopDetector:
    """Feed tokens one by one; `push` returns a LoopHit whenever the rule holds at that length."""

    def __init__(self, min_pattern_size: int = 1, max_pattern_size: int = 20, min_count: int = 3,
                 min_covered_tokens: int = 0) -> None:
        if min_pattern_size < 1 or max_pattern_size < min_pattern_size or min_count < 2:
            raise ValueError("need 1 <= min_pattern_size <= max_pattern_size and min_count >= 2")
        self.min_pattern_size = min_pattern_size
        self.max_pattern_size = max_pattern_size
        self.min_count = min_count
        self.min_covered_tokens = min_covered_tokens
        self._need = {p: needed_run(p, min_count, min_covered_tokens)
                      for p in range(min_pattern_size, max_pattern_size + 1)}
        self._window: deque[int] = deque()
        self._positions: dict[int, deque[int]] = {}
        # period -> index of the first j of the current run where out[j] == out[j - period]
        self._run_start: dict[int, int] = {}
        self.length = 0
        self.first_hit: LoopHit | None = None

    def push(self, token: int) -> LoopHit | None:
        i = self.length
        self.length = i + 1
        lo = self.min_pattern_size
        positions = self._positions.get(token)
        live: dict[int, int] = {}
        hit_period = 0
        if positions is None:
            positions = self._positions[token] = deque()
        else:
            runs = self._run_start
            need = self._need
            for q in reversed(positions):
                period = i - q
                if period < lo:
                    continue
                start = runs.get(period, i)
                live[period] = start
                if not hit_period and i - start + 1 >= need[period]:
                    hit_period = period
        positions.append(i)
        self._run_start = live
        window = self._window
        window.append(token)
        if len(window) > self.max_pattern_size:
            old = window.popleft()
            old_positions = self._positions[old]
            old_positions.popleft()
            if not old_positions:
                del self._positions[old]
        if not hit_period:
            return None
        covered = i - live[hit_period] + 1 + hit_period
        hit = LoopHit(start=self.length - covered, period=hit_period, count=covered // hit_period,
                      covered_tokens=covered, end=self.length)
        if self.first_hit is None:
            self.first_hit = hit
        return hit

    def feed(self, tokens: list[int]) -> LoopHit | None:
        """Push many tokens; return the first hit (and stop there), or None."""
        for token in tokens:
            hit = self.push(token)
            if hit is not None:
                return hit
        return None
