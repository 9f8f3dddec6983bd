"""The range a search's decisive steps agree on: an answer its neighbours' own steps contradict.

A search that weighs every step together can still name a culprit whose parent's own steps put
the parent on the bad side by the full answer ratio (or the culprit's own, the culprit on the good
side): the rest of the evidence outweighs them. The posterior and those steps then disagree, and
the search does not pick one; it names the range no position's own steps contradict by that much.
Likelihood mode (a step's ratio its own) and levels mode (a position's runs against the answer's
two levels) share the rule; each says what a position's own ratio is.
"""

from __future__ import annotations

from collections.abc import Mapping


def contradicted(own: Mapping[int, float], bound: float, lo: int, hi: int) -> bool:
    """Whether the answer (lo, hi]'s parent lo is judged bad by at least ``bound`` or its culprit hi
    good by that much (``own``: each position's own log likelihood ratio, bad side over good)."""
    return bound > 0 and (own.get(lo, 0.0) >= bound or own.get(hi, 0.0) <= -bound)


def agreed_range(own: Mapping[int, float], bound: float, lo: int, hi: int, n: int) -> tuple[int, int]:
    """The answer (lo, hi], or, where it is ``contradicted``, the range no position's own ratio
    contradicts by ``bound``: from the nearest position judged good by that much below every one
    judged bad by it at or under lo (the good end 0 if none), to the nearest judged bad by that
    much above every one judged good at or over hi (the bad end ``n`` if none)."""
    if not contradicted(own, bound, lo, hi):
        return lo, hi
    judged_bad = [p for p, v in own.items() if p <= lo and v >= bound]
    judged_good = [p for p, v in own.items() if p >= hi and v <= -bound]
    if judged_bad:
        lo = max((p for p, v in own.items() if p < min(judged_bad) and v <= -bound), default=0)
    if judged_good:
        hi = min((p for p, v in own.items() if p > max(judged_good) and v >= bound), default=n)
    return lo, hi
