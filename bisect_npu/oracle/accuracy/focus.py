"""Focusing: which samples a candidate runs once both ends ran the whole dataset.

The samples whose results differ between the ends carry all the evidence about which side a
candidate is on (where the ends agree both sides predict the same); a random control set of the
agreeing samples catches a candidate broken in some other way. The control set is drawn from a
hash of the commit and the sample id: random across commits, the same for one commit every time
(a resumed session asks for the same samples).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from bisect_npu.contracts import SampleOutcome
from bisect_npu.oracle.config import AccuracyConfig, FocusConfig


def discordant_ids(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome]) -> list[str]:
    """Samples both ends ran whose correctness rates differ, largest difference first (ties in
    the dataset's order)."""
    b = {s.id: s for s in bad}
    diffs = [(abs(s.correct - b[s.id].correct), s.id) for s in good if s.id in b and s.correct != b[s.id].correct]
    return [i for _, i in sorted(diffs, key=lambda t: -t[0])]


def _draw(commit: str, sample_id: str) -> str:
    return hashlib.sha256(f"{commit}\0{sample_id}".encode()).hexdigest()


def control_ids(cfg: FocusConfig, good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
                commit: str) -> list[str]:
    """The control set: agreeing samples in the commit's own random order."""
    discordant = set(discordant_ids(good, bad))
    shared = {s.id for s in bad}
    agreeing = [s.id for s in good if s.id in shared and s.id not in discordant]
    return sorted(agreeing, key=lambda i: _draw(commit, i))[: cfg.control_count(len(agreeing))]


def focus_ids(cfg: FocusConfig, good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
              commit: str) -> list[str] | None:
    """Every id a focused candidate may run (discordant, most telling first, then the control
    set), or None for the whole dataset: focusing off, or fewer discordant samples than
    ``min_discordant`` (too few to decide)."""
    if not cfg.enabled:
        return None
    discordant = discordant_ids(good, bad)
    if len(discordant) < cfg.min_discordant:
        return None
    return [*discordant, *control_ids(cfg, good, bad, commit)]


def round_plan(cfg: AccuracyConfig, good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
               commit: str) -> list[list[str] | None]:
    """The samples of each round a candidate may run, in order (None: the whole dataset); the
    caller runs rounds until the verdict is clear or the plan ends.

    Focused: the discordant samples in batches of ``focus.batch``, each batch with its share of
    the control set; then the whole focus set again (``max_rounds`` - 1 times: a sampled
    evaluation's rates sharpen with repeats); then, as the fallback, the whole dataset once.
    Unfocused: the whole dataset ``max_rounds`` times."""
    focused = focus_ids(cfg.focus, good, bad, commit)
    if focused is None:
        return [None] * cfg.max_rounds
    discordant = discordant_ids(good, bad)
    control = focused[len(discordant):]
    size = cfg.focus.batch or len(discordant)
    chunks = max(1, -(-len(discordant) // size))
    per_chunk = -(-len(control) // chunks) if control else 0
    plan: list[list[str] | None] = [
        [*discordant[k * size:(k + 1) * size], *control[k * per_chunk:(k + 1) * per_chunk]] for k in range(chunks)]
    plan += [focused] * (cfg.max_rounds - 1)
    plan.append(None)
    return plan
