"""Focusing: which samples a candidate runs once both ends ran the whole dataset.

The samples whose results differ between the ends carry all the evidence about which side a
candidate is on (where the ends agree both sides predict the same); a random control set of the
agreeing samples, when large enough to flag anything, catches a candidate broken in some other
way. The control set is drawn from a hash of the commit and the sample id: random across
commits, the same for one commit every time (a resumed session asks for the same samples).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Sequence

from bisect_npu.observations import SampleOutcome
from bisect_npu.oracle.accuracy.stats import JointPrior, fit_joint, side_rates
from bisect_npu.oracle.config import AccuracyConfig


def telling(good: SampleOutcome, bad: SampleOutcome, prior: JointPrior) -> float:
    """How much one run of a sample tells the sides apart: the Jeffreys divergence of its one-run
    rates at the two sides (the expected log likelihood ratio under the bad side minus that under
    the good side), each rate the sample's posterior given both ends' runs (`stats.side_rates`):
    where the ends' rates go together, a disagreement between them tells little."""
    rates = side_rates(prior, good, bad)
    pg, pb = rates.good[0], rates.bad[0]
    return (pb - pg) * (math.log(pb / pg) - math.log((1 - pb) / (1 - pg)))


def discordant_ids(good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome]) -> list[str]:
    """Samples both ends ran whose correctness rates differ, the most telling first (`telling`;
    ties in the dataset's order)."""
    b = {s.id: s for s in bad}
    pairs = [(s, b[s.id]) for s in good if s.id in b and s.correct != b[s.id].correct]
    if not pairs:
        return []
    prior = fit_joint(good, bad)
    return [g.id for g, _ in sorted(pairs, key=lambda pair: -telling(pair[0], pair[1], prior))]


def _draw(commit: str, sample_id: str) -> str:
    return hashlib.sha256(f"{commit}\0{sample_id}".encode()).hexdigest()


def smallest_control(cfg: AccuracyConfig) -> int:
    """The fewest control samples worth running: the judge's control test (`stats.control_p`)
    reaches its level (1 - confidence over ``max_rounds`` looks) on a set this size all failing
    whenever a good commit would get each right at least half the time (2^-n <= alpha), and a
    smaller set cannot reach it at even odds. Where the good side's rates are surer (answers that
    repeat) fewer failures flag; a set too small for even odds is still left out (its runs would
    tell nothing where answers are fresh draws)."""
    return math.ceil(math.log2(cfg.max_rounds / (1.0 - cfg.confidence)))


def control_ids(cfg: AccuracyConfig, good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
                commit: str, ran: Collection[str] = ()) -> list[str]:
    """The control set: agreeing samples (none of those in `ran`) in the commit's own random
    order; none when the set ``focus.control`` asks for is too small ever to flag a candidate
    (`smallest_control`): such a set costs runs and cannot tell anything, and its few rates only
    blur the candidate's."""
    discordant = set(discordant_ids(good, bad))
    shared = {s.id for s in bad}
    agreeing = [s.id for s in good if s.id in shared and s.id not in discordant and s.id not in ran]
    count = cfg.focus.control_count(len(agreeing))
    if count < smallest_control(cfg):
        return []
    return sorted(agreeing, key=lambda i: _draw(commit, i))[:count]


def focus_ids(cfg: AccuracyConfig, good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
              commit: str, ran: Collection[str] = ()) -> list[str] | None:
    """Every id a focused candidate may run (discordant, most telling first, then the control
    set; none of those in `ran`), or None for the whole dataset: focusing off, or fewer
    discordant samples left than ``focus.min_discordant`` (too few to decide)."""
    if not cfg.focus.enabled:
        return None
    discordant = [i for i in discordant_ids(good, bad) if i not in ran]
    if len(discordant) < cfg.focus.min_discordant:
        return None
    return [*discordant, *control_ids(cfg, good, bad, commit, ran)]


def round_plan(cfg: AccuracyConfig, good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
               commit: str, ran: Collection[str] = ()) -> list[list[str] | None]:
    """The samples of each round a candidate may run, in order (None: the whole dataset); the
    caller runs rounds until the verdict is clear or the plan ends.

    Focused: the discordant samples, most telling first, in batches that start at ``focus.batch``
    and grow by ``focus.growth`` each round (a clear step stops after a few samples, an unclear
    one soon runs the rest), the control set riding along in proportion; then the whole focus
    set again (``max_rounds`` - 1 times: a sampled evaluation's rates sharpen with repeats);
    then, as the fallback, the whole dataset once. Unfocused: the whole dataset ``max_rounds``
    times.

    `ran`: the samples an earlier step of this commit ran (the search asked it again). They are
    left out, so the new step's evidence is independent of the earlier one's given the side: a
    sample run again at one commit repeats what its rate there already said, and counting it
    twice would count that rate twice."""
    focused = focus_ids(cfg, good, bad, commit, ran)
    if focused is None:
        return [None] * cfg.max_rounds
    discordant = [i for i in discordant_ids(good, bad) if i not in ran]
    control = focused[len(discordant):]
    plan: list[list[str] | None] = []
    size = float(cfg.focus.batch or len(discordant))
    start = ridden = 0
    while start < len(discordant):
        end = min(len(discordant), start + max(1, round(size)))
        riding = math.ceil(len(control) * end / len(discordant))  # control run once `end` discordant have
        plan.append([*discordant[start:end], *control[ridden:riding]])
        start, ridden, size = end, riding, size * cfg.focus.growth
    plan += [focused] * (cfg.max_rounds - 1)
    plan.append(None)
    return plan
