"""Focusing: which samples a candidate runs once both ends ran the whole dataset.

The samples whose results differ between the ends carry all the evidence about which side a
candidate is on (where the ends agree both sides predict the same); a random control set of the
agreeing samples, when large enough to flag anything, catches a candidate broken in some other
way. The control set is drawn from a hash of the commit and the sample id: random across
commits, the same for one commit every time (a resumed session asks for the same samples).
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections import deque
from collections.abc import Collection, Sequence

from bisect_npu.observations import SampleOutcome
from bisect_npu.oracle.accuracy.stats import JointPrior, SideRates, by_id, fit_joint, log_predictive, side_rates
from bisect_npu.oracle.config import AccuracyConfig


def divergence(rates: SideRates, runs: int) -> float:
    """What `runs` runs of one sample at a commit tell its sides apart: the Jeffreys divergence
    of their counts (beta-binomial in each side's rate, `stats.side_rates`), the expected log
    likelihood ratio under the bad side minus that under the good side. It grows with the runs
    but slower and slower: once a commit's runs have placed its rate, more of them add little."""
    total = 0.0
    for k in range(runs + 1):
        choose = math.lgamma(runs + 1) - math.lgamma(k + 1) - math.lgamma(runs - k + 1)
        good, bad = (choose + log_predictive(k, runs, rate) for rate in (rates.good, rates.bad))
        total += (math.exp(bad) - math.exp(good)) * (bad - good)
    return total


def telling(good: SampleOutcome, bad: SampleOutcome, prior: JointPrior) -> float:
    """How much one run of a sample tells the sides apart (`divergence` of one run), each rate
    the sample's posterior given both ends' runs (`stats.side_rates`): where the ends' rates go
    together, a disagreement between them tells little."""
    return divergence(side_rates(prior, good, bad), 1)


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

    Focused: ``max_rounds`` rounds a discordant sample in all, the round that tells the sides
    apart most per sample run next (`by_evidence`): the most telling samples first, and another
    round of one of them before a first run of a sample whose ends barely differ. Rounds start at
    ``focus.batch`` sample runs and grow by ``focus.growth`` each round (a clear step stops after
    a few, an unclear one soon runs the rest; a sample runs once a round, its next round waits for
    the round after), the control set
    (``max_rounds`` runs of each) riding along in proportion; then, as the fallback, the whole
    dataset once. Unfocused: the whole dataset ``max_rounds`` times.

    `ran`: the samples an earlier step of this commit ran (the search asked it again). They are
    left out, so the new step's evidence is independent of the earlier one's given the side: a
    sample run again at one commit repeats what its rate there already said, and counting it
    twice would count that rate twice."""
    focused = focus_ids(cfg, good, bad, commit, ran)
    if focused is None:
        return [None] * cfg.max_rounds
    discordant = [i for i in discordant_ids(good, bad) if i not in ran]
    order = by_evidence(cfg, good, bad, discordant)
    waiting = deque(order)
    riding = focused[len(discordant):] * cfg.max_rounds
    plan: list[list[str] | None] = []
    size = float(cfg.focus.batch or len(discordant))
    ridden = 0
    while waiting or ridden < len(riding):
        chosen: list[str] = []
        again: list[str] = []  # a sample's next round, left for the round after: a round runs a sample once
        while waiting and len(chosen) < max(1, round(size)):
            sample = waiting.popleft()
            (again if sample in chosen else chosen).append(sample)
        waiting.extendleft(reversed(again))
        due = math.ceil(len(riding) * (len(order) - len(waiting)) / len(order))  # control in proportion
        while ridden < due and riding[ridden] not in chosen:
            chosen.append(riding[ridden])
            ridden += 1
        plan.append(chosen)
        size *= cfg.focus.growth
    plan.append(None)
    return plan


def by_evidence(cfg: AccuracyConfig, good: Sequence[SampleOutcome], bad: Sequence[SampleOutcome],
                discordant: Sequence[str]) -> list[str]:
    """``max_rounds`` rounds per discordant sample in all, each the round that adds most to the
    step's expected evidence (`divergence` of the sample's runs so far and one round more),
    largest first; ties keep the samples' order. Every round of a sample costs the same runs, so
    this is the order of what a round teaches per sample run: another round of a telling sample
    goes before a first round of one whose ends barely differ.

    What a sample's further runs add rests on how far its runs repeat one another, which the
    ends measure only where both ran every sample more than once; where one did not
    (`JointPrior.borrowed`), every sample runs once before any runs again, and each pass over
    them in the order of what it adds."""
    prior = fit_joint(good, bad, cfg.greedy)
    g, b = by_id(good), by_id(bad)
    rates = [side_rates(prior, g[sample], b[sample]) for sample in discordant]
    measured = prior.borrowed is None

    def gain(place: int, rounds: int) -> tuple[int, float, int, int]:
        told = divergence(rates[place], cfg.repeats * (rounds + 1)) - divergence(rates[place], cfg.repeats * rounds)
        return 0 if measured else rounds, -told, place, rounds

    heads = [gain(place, 0) for place in range(len(discordant))]
    heapq.heapify(heads)
    order: list[str] = []
    while len(order) < cfg.max_rounds * len(discordant):
        *_, place, rounds = heapq.heappop(heads)
        order.append(discordant[place])
        heapq.heappush(heads, gain(place, rounds + 1))
    return order
