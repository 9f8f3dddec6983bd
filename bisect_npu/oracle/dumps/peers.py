"""Noise lines from a pair's own peers: a module judged against the same module kind in the other layers.

Why: two correct kernels, precisions or thread counts leave rounding noise whose size depends on
the model, the dtype, the kernel and the depth. A fixed floor either misses real faults or calls
a clean pair bad (the first layer, whose input is bit-identical on both sides, turns "no error"
into rounding noise). Modules of one kind (every layer's MLP, every layer's attention) run the
same code on the same kind of data, so their spread is the pair's noise, and a module far
outside it is where an error enters.

Two statistics per module output, each a logarithm so that one layer's ratio compares with another's:
* amplification: the output's cosine distance over its worst input's (of the inputs shaped like
  it: the hidden state, not the rotary tables), both floored at the dtype's rounding
  (`rounding_distance`: a bit-identical input counts as one rounding of it);
* norm change: how far the output's norm ratio (candidate / reference) moved from 1, beyond its
  inputs' (a gain cosine cannot see: a wrong dequant or norm scale).
A statistic stands out when it is above its peers' median by more than `peer_mads` robust
standard deviations (1.4826 MAD) and by more than a spread floor (`peer_min_factor` for the
amplification; for the norm the dtype's half tolerance), so that peers which agree too well to
have a spread do not make every difference a fault. Peers are the other modules of the kind;
a kind needs `min_peers` of them for a spread. A module without enough peers is judged against the
highest line of the kinds that have them (the final norm, which has none) or, where its kind has
a few, the line its few peers' worst draws, whichever is higher.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

_LAYER_INDEX = re.compile(r"(?<=\.layers\.)\d+(?=\.)|(?<=\.layer\.)\d+(?=\.)|(?<=^layers\.)\d+(?=\.)")
_CALL_COUNT = re.compile(r"\.forward\.\d+")
MAD_TO_SIGMA = 1.4826


def module_kind(module: str | None, name: str) -> str:
    """The tensor's name with its layer index and call count taken out: what it shares with its peers."""
    head = module or name
    tail = name[len(head):] if name.startswith(head) else ""
    return _CALL_COUNT.sub(".forward", _LAYER_INDEX.sub("*", head)) + tail


def rounding_distance(tolerance: float) -> float:
    """Cosine distance that rounding to a dtype of relative precision `tolerance` can leave: half of it, squared."""
    return (tolerance / 2) ** 2


@dataclass(frozen=True)
class Line:
    """Where a statistic stands out: its peers' median, the robust spread, the line, and how many peers."""

    median: float
    spread: float
    line: float
    peers: int


def peer_line(values: list[float], mads: float, min_spread: float) -> Line:
    """median + max(mads * 1.4826 * MAD, min_spread) of `values` (the peers' statistics)."""
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    spread = MAD_TO_SIGMA * mad
    return Line(median, spread, median + max(mads * spread, min_spread), len(values))


def leave_one_out_lines(stats: dict[str, list[tuple[int, float]]], mads: float, min_peers: int,
                        min_spread: Callable[[int], float]) -> dict[int, Line]:
    """For each member (id, value) of each kind, the line drawn from the other members of its kind."""
    lines: dict[int, Line] = {}
    for members in stats.values():
        if len(members) - 1 < min_peers:
            continue
        for i, (member, _) in enumerate(members):
            others = [value for j, (_, value) in enumerate(members) if j != i]
            lines[member] = peer_line(others, mads, min_spread(member))
    return lines


def few_peer_lines(stats: dict[str, list[tuple[int, float]]], min_peers: int,
                   min_spread: Callable[[int], float]) -> dict[int, Line]:
    """For each member of a kind with some peers but fewer than `min_peers` (too few for a spread), the line its
    peers' worst draws: their highest value plus the spread floor. Why: a module kind of its own noise (the MoE
    experts of a shallow model, fewer layers than peers needed) is still measured against its own kind."""
    lines: dict[int, Line] = {}
    for members in stats.values():
        if not 1 <= len(members) - 1 < min_peers:
            continue
        for i, (member, _) in enumerate(members):
            others = [value for j, (_, value) in enumerate(members) if j != i]
            worst = max(others)
            lines[member] = Line(statistics.median(others), 0.0, worst + min_spread(member), len(others))
    return lines


def log_ratio(value: float) -> float:
    """|log value| for a positive ratio; infinite when one side is zero and the other is not."""
    if value > 0 and math.isfinite(value):
        return abs(math.log(value))
    return math.inf
