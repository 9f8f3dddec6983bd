"""The one tie rule: is a first token mismatch between two greedy outputs a numerical tie, or a
real divergence? Used by the `tokens` oracle, the `stages` oracle's text stage and so by `align`.

At the first mismatch the *flip* is how far the two tokens' logprob difference moved between the
runs (the reference's preference for its token plus the candidate's for its own). A logprob
difference is a logit difference, so the flip is one draw of the pair's logit error between two
tokens; where both outputs agree on the token, every other shared candidate gives another draw of
the same error (the pair's *noise*). The margin is taken from those draws, bounded by what the two
precisions can explain:

- *noise margin*: the largest draw one expects among the tokens compared, an extreme-value bound:
  an exponential tail through the draws' 75th and 95th percentiles, read at the exceedance
  `FALSE_ALARM_RATE / tokens compared` (a clean output's chance of a flip beyond it);
- *bound*: what rounding can move a logit difference by: `AMPLIFICATION` x machine epsilon of the
  coarser precision x the reference's top-k logprob spread (the upper quartile over its steps:
  the logit magnitude the logprobs show). Noise beyond it is no excuse: a faulty module moves the
  agreed tokens too;
- margin = the smaller of the two, never below the config's `tie_margin` (the gap under which two
  candidates are a tie in any run); the bound alone where too few agreed draws were measured; the
  `tie_margin` alone where the draws' 95th percentile itself is beyond the bound (the agreed tokens
  moved more than rounding explains: the pair's numerics differ, and no flip is excused as a tie).

The pair's *amplification* (its measured 95th-percentile noise over machine epsilon x spread) is in
the verdict: how much more than one rounding at the coarser precision the pair shows. Clean pairs
of the bench's families show 1 to 5, faulty ones tens and more; `AMPLIFICATION` sits between them,
fitted on the families of bench/token_tie_bench.py (depths 2 to 8, several widths and logit
scales), each judged with the constant fitted without it (docs/benchmarks.md). An unknown
precision counts as bfloat16, the coarsest a model is served in. Without the candidate's logprobs only the
reference's own gap can be read: a tie where it is within the config's `tie_margin` or the bound.
Where a side's top-k lacks the other's token, its last listed logprob bounds that token's, so the
flip is at least a known amount: beyond the margin, no tie; within it, the reference's gap decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bisect_npu.observations import Observation

# Machine epsilon of each precision a probe reports (`extra.engine_args.dtype` or `extra.dtype`).
EPSILON = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
UNKNOWN_PRECISION = "bfloat16"
# A design choice, not fitted: the chance a clean output's flip is beyond the noise margin.
FALSE_ALARM_RATE = 0.01
# The geometric midpoint between the largest clean flip and the smallest faulty one (in machine
# epsilon x spread) on the eight families of bench/token_tie_bench.py, rounded up to one significant
# digit (its leave-one-family-out run is the held-out figure).
AMPLIFICATION = 6.0
MIN_NOISE_SAMPLES = 8
PROVENANCE = "bench/token_tie_bench.py families, leave-one-family-out"


@dataclass(frozen=True)
class Factors:
    """The rule's constants (the bench fits `amplification` on its tune families and prints it)."""

    amplification: float = AMPLIFICATION
    false_alarm_rate: float = FALSE_ALARM_RATE


SHIPPED = Factors()
Step = list[tuple[int, float]] | list[list[Any]] | None


def _logprob(step: Step, token: int) -> float | None:
    return next((float(lp) for tok, lp in step or [] if int(tok) == token), None)


def precision(obs: Observation) -> str:
    """The observation's precision as a torch dtype name (an unknown one counts as bfloat16)."""
    engine = obs.extra.get("engine_args")
    given = (engine.get("dtype") if isinstance(engine, dict) else None) or obs.extra.get("dtype")
    name = str(given or "").removeprefix("torch.")
    aliases = {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32"}
    name = aliases.get(name, name)
    return name if name in EPSILON else UNKNOWN_PRECISION


def flip(cand_step: Step, ref_step: Step, cand_token: int, ref_token: int) -> float | None:
    """How far the two tokens' logprob difference moved between the runs (None: a side lacks one of them)."""
    values = (_logprob(ref_step, ref_token), _logprob(ref_step, cand_token), _logprob(cand_step, cand_token),
              _logprob(cand_step, ref_token))
    if any(v is None for v in values):
        return None
    ref_want, ref_got, cand_got, cand_want = (float(v) for v in values if v is not None)
    return (ref_want - ref_got) + (cand_got - cand_want)


def agreed_flips(cand: Observation, ref: Observation, upto: int) -> list[float]:
    """|flip| of the chosen token against each other shared candidate, on the steps before `upto` where both
    outputs chose the same token: what rounding alone moves in this pair."""
    ref_steps, cand_steps = ref.top_logprobs or [], cand.top_logprobs or []
    out: list[float] = []
    for j in range(min(upto, len(ref_steps), len(cand_steps), len(ref.output_token_ids),
                       len(cand.output_token_ids))):
        chosen = ref.output_token_ids[j]
        if cand.output_token_ids[j] != chosen:
            continue
        for tok, _ in ref_steps[j] or []:
            if int(tok) != chosen:
                moved = flip(cand_steps[j], ref_steps[j], int(tok), chosen)
                if moved is not None:
                    out.append(abs(moved))
    return out


def logit_spread(obs: Observation) -> float:
    """The upper quartile of the steps' gaps between the best and the last of the top-k logprobs: the logit
    magnitude the logprobs show (rounding error grows with it). Not the median: a flat output's typical
    step understates the magnitude its peaked steps show, and rounding moves those as much."""
    gaps = [float(step[0][1]) - float(step[-1][1]) for step in obs.top_logprobs or [] if step and len(step) >= 2]
    return _quantile(gaps, 0.75) if gaps else 0.0


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * (len(ordered) - 1)))]


def tail_margin(samples: list[float], compared: int, false_alarm_rate: float) -> float:
    """The largest |flip| one expects among `compared` tokens: an exponential tail through the draws' 75th and
    95th percentiles, read at the exceedance `false_alarm_rate / compared` (never below the largest draw)."""
    q75, q95 = _quantile(samples, 0.75), _quantile(samples, 0.95)
    scale = (q95 - q75) / math.log(5.0)  # an exponential's 95th and 75th percentiles lie ln(5) scales apart
    exceedance = false_alarm_rate / max(1, compared)
    return max(q95 + scale * math.log(0.05 / exceedance), max(samples))


@dataclass(frozen=True)
class TieMargin:
    """The margin one pair is judged with, and what it came from (a verdict's figures)."""

    margin: float
    noise: float | None  # the agreed draws' 95th percentile
    noise_margin: float | None  # their tail bound at the tokens compared
    noise_samples: int
    bound: float
    precisions: tuple[str, str]
    spread: float
    epsilon: float
    source: str  # "measured noise", "precision bound ...", "tie_margin floor", "fixed"

    @property
    def amplification(self) -> float | None:
        """The pair's noise in machine epsilons x spread: how much more than one rounding it shows."""
        unit = self.epsilon * self.spread
        return None if self.noise is None or unit <= 0 else self.noise / unit

    def figures(self) -> dict[str, Any]:
        amplification = self.amplification
        return {"tie_margin_used": round(self.margin, 6), "tie_margin_source": self.source,
                "tie_noise": None if self.noise is None else round(self.noise, 6),
                "tie_noise_margin": None if self.noise_margin is None else round(self.noise_margin, 6),
                "tie_noise_samples": self.noise_samples, "tie_precision_bound": round(self.bound, 6),
                "tie_amplification": None if amplification is None else round(amplification, 3),
                "precisions": {"candidate": self.precisions[0], "reference": self.precisions[1]},
                "logit_spread": round(self.spread, 4), "tie_rule_provenance": PROVENANCE}

    def words(self) -> str:
        amplification = self.amplification
        if self.noise is not None and self.noise_margin is not None and amplification is not None:
            noise = (f"noise {self.noise:.3g} (95th percentile of {self.noise_samples} agreed candidates, "
                     f"{amplification:.3g}x one rounding), tail bound {self.noise_margin:.3g}")
        else:
            noise = f"too few agreed candidates to measure noise ({self.noise_samples})"
        return (f"margin {self.margin:.3g} ({self.source}; {noise}; {self.precisions[0]} vs {self.precisions[1]} "
                f"explain up to {self.bound:.3g} at logit spread {self.spread:.3g})")


def precision_bound(cand: Observation, ref: Observation, factors: Factors = SHIPPED) -> tuple[float, float, float]:
    """(bound, spread, epsilon): what rounding at the coarser precision can move at the reference's logit
    magnitude."""
    spread = logit_spread(ref)
    eps = max(EPSILON[precision(cand)], EPSILON[precision(ref)])
    return factors.amplification * eps * spread, spread, eps


def tie_margin(cand: Observation, ref: Observation, upto: int, floor: float, fixed: float | None = None,
               factors: Factors = SHIPPED, compared: int | None = None) -> TieMargin:
    """The flip margin for the first mismatch at `upto`: the pair's noise tail at the `compared` tokens (unset:
    the reference's length), bounded by its precisions, at least `floor` (`fixed`: a margin the recipe sets,
    used as it is)."""
    bound, spread, eps = precision_bound(cand, ref, factors)
    samples = agreed_flips(cand, ref, upto)
    measured = len(samples) >= MIN_NOISE_SAMPLES
    noise = _quantile(samples, 0.95) if measured else None
    tail = tail_margin(samples, compared or len(ref.output_token_ids), factors.false_alarm_rate) if measured else None
    precisions = (precision(cand), precision(ref))
    if fixed is not None:
        margin, source = fixed, "fixed"
    elif tail is None:
        margin, source = bound, "precision bound"
    elif noise is not None and noise > bound:
        margin, source = floor, "tie_margin floor (the pair's agreed tokens moved beyond what rounding explains)"
    elif tail > bound:
        margin, source = bound, "precision bound (the pair's noise tail reaches beyond it)"
    else:
        margin, source = tail, "measured noise"
    if fixed is None and margin < floor:
        margin, source = floor, "tie_margin floor"
    return TieMargin(margin, noise, tail, len(samples), bound, precisions, spread, eps, source)


@dataclass(frozen=True)
class Tie:
    """The rule's answer at one first mismatch."""

    tied: bool
    flip: float | None  # None: judged on the reference's own gap (the candidate has no logprobs there)
    margin: TieMargin | None
    reference_gap_margin: float | None = None
    at_least: bool = False  # the flip is a lower bound: a side's top-k lacks the other's token

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.flip is None else {"flip": round(self.flip, 6)}
        if self.at_least:
            out["flip_is_lower_bound"] = True
        if self.margin is not None:
            out.update(self.margin.figures())
        if self.reference_gap_margin is not None:
            out["reference_gap_margin"] = round(self.reference_gap_margin, 6)
        return out

    def words(self) -> str:
        if self.flip is not None and self.margin is not None:
            moved = "at least " if self.at_least else ""
            return f"the two tokens' logprob difference moved {moved}{self.flip:.3g}; {self.margin.words()}"
        return f"the reference's top candidates within {self.reference_gap_margin:.3g}"


def least_flip(cand_step: Step, ref_step: Step, cand_token: int, ref_token: int) -> float | None:
    """Where a side's top-k lacks the other's token, the least the flip can be: that token's logprob is at most
    the side's last listed one (None: a side lacks its own token or has no logprobs)."""
    if not cand_step or not ref_step:
        return None
    ref_want, cand_got = _logprob(ref_step, ref_token), _logprob(cand_step, cand_token)
    if ref_want is None or cand_got is None:
        return None
    ref_got = _logprob(ref_step, cand_token)
    cand_want = _logprob(cand_step, ref_token)
    ref_got = min(float(lp) for _, lp in ref_step) if ref_got is None else ref_got
    cand_want = min(float(lp) for _, lp in cand_step) if cand_want is None else cand_want
    return (ref_want - ref_got) + (cand_got - cand_want)


def judge_tie(cand: Observation, ref: Observation, index: int, tie_margin_cfg: float,
              fixed: float | None = None, factors: Factors = SHIPPED, compared: int | None = None) -> Tie:
    """Is the first mismatch at `index` (both outputs have a token there) a numerical tie? `compared`: how many
    tokens the outputs were compared over (unset: the reference's length)."""
    cand_token, ref_token = cand.output_token_ids[index], ref.output_token_ids[index]
    ref_steps, cand_steps = ref.top_logprobs or [], cand.top_logprobs or []
    ref_step = ref_steps[index] if index < len(ref_steps) else None
    cand_step = cand_steps[index] if index < len(cand_steps) else None
    moved = flip(cand_step, ref_step, cand_token, ref_token)
    if moved is not None:
        margin = tie_margin(cand, ref, index, tie_margin_cfg, fixed, factors, compared)
        return Tie(moved <= margin.margin, moved, margin)
    least = least_flip(cand_step, ref_step, cand_token, ref_token)
    if least is not None:
        margin = tie_margin(cand, ref, index, tie_margin_cfg, fixed, factors, compared)
        if least > margin.margin:
            return Tie(False, least, margin, at_least=True)
    gap_margin = max(tie_margin_cfg, precision_bound(cand, ref, factors)[0])
    best = max((float(lp) for _, lp in ref_step or []), default=None)
    tied = {int(tok) for tok, lp in ref_step or [] if best is not None and best - float(lp) <= gap_margin}
    return Tie(len(tied) >= 2 and {cand_token, ref_token} <= tied, None, None, gap_margin)
