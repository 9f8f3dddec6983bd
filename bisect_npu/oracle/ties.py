"""The one tie rule: is a first token mismatch between two greedy outputs a numerical tie, or a
real divergence? Used by the `tokens` oracle, the `stages` oracle's text stage and so by `align`.

At the first mismatch the *flip* is how far the two tokens' logprob difference moved between the
runs (the reference's preference for its token plus the candidate's for its own). Rounding moves
it; a faulty module moves it more. How much rounding moves it depends on the pair, so the margin is
taken from the pair itself, bounded by what its precisions can explain:

- *noise*: where both outputs agree on the token, the same statistic (how far the chosen token's
  logprob moved against each other shared candidate's), a high quantile over those steps;
- *bound*: what rounding at the coarser of the two precisions can move at this logit magnitude
  (machine epsilon times the reference's typical top-k logprob spread, times a factor);
- margin = the measured noise times a factor, never above the bound (noise beyond what the
  precisions explain is no excuse: a faulty module moves the agreed tokens too) nor below the
  config's `tie_margin` (the gap under which two candidates are a tie in any run); the bound alone
  where too few agreed steps were measured.

Both factors and the quantile are set on the tune split of bench/token_tie_bench.py (families made
there; docs/benchmarks.md has the report split). An unknown precision counts as bfloat16, the
coarsest a model is served in. Without the candidate's logprobs only the reference's own gap can
be read: a tie where it is within the config's `tie_margin` or the precision bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bisect_npu.observations import Observation

# Machine epsilon of each precision a probe reports (`extra.engine_args.dtype` or `extra.dtype`).
EPSILON = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
UNKNOWN_PRECISION = "bfloat16"
# The tune split of bench/token_tie_bench.py (Qwen3 at logit scale x10, seeds 0 and 1): the smallest
# factors under which no clean first mismatch there is a false alarm, rounded up to one significant
# digit (the bench prints the fit beside these; docs/benchmarks.md has the report split).
NOISE_QUANTILE = 0.95
NOISE_FACTOR = 2.0
PRECISION_FACTOR = 3.0
MIN_NOISE_SAMPLES = 8



@dataclass(frozen=True)
class Factors:
    """The rule's tuned constants (the bench fits them on its tune split and prints them)."""

    noise_quantile: float = NOISE_QUANTILE
    noise_factor: float = NOISE_FACTOR
    precision_factor: float = PRECISION_FACTOR


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
    for j in range(min(upto, len(ref_steps), len(cand_steps), len(ref.output_token_ids))):
        chosen = ref.output_token_ids[j]
        for tok, _ in ref_steps[j] or []:
            if int(tok) != chosen:
                moved = flip(cand_steps[j], ref_steps[j], int(tok), chosen)
                if moved is not None:
                    out.append(abs(moved))
    return out


def logit_spread(obs: Observation) -> float:
    """The median gap between the best and the last of the top-k logprobs: the logit magnitude logprobs
    show (rounding error grows with it)."""
    gaps = sorted(float(step[0][1]) - float(step[-1][1]) for step in obs.top_logprobs or [] if step and len(step) >= 2)
    return gaps[len(gaps) // 2] if gaps else 0.0


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class TieMargin:
    """The margin one pair is judged with, and what it came from (a verdict's figures)."""

    margin: float
    noise: float | None
    noise_samples: int
    bound: float
    precisions: tuple[str, str]
    spread: float
    source: str  # "measured", "precision bound", "floor", "fixed"

    def figures(self) -> dict[str, Any]:
        return {"tie_margin_used": round(self.margin, 6), "tie_margin_source": self.source,
                "tie_noise": None if self.noise is None else round(self.noise, 6),
                "tie_noise_samples": self.noise_samples, "tie_precision_bound": round(self.bound, 6),
                "precisions": {"candidate": self.precisions[0], "reference": self.precisions[1]},
                "logit_spread": round(self.spread, 4)}

    def words(self) -> str:
        noise = f"noise {self.noise:.3g} over {self.noise_samples} agreed candidates" if self.noise is not None \
            else f"too few agreed steps to measure noise ({self.noise_samples})"
        return (f"margin {self.margin:.3g} ({self.source}; {noise}; {self.precisions[0]} vs {self.precisions[1]} "
                f"explain up to {self.bound:.3g} at logit spread {self.spread:.3g})")


def precision_bound(cand: Observation, ref: Observation, factors: Factors = Factors()) -> tuple[float, float]:
    """(bound, spread): what rounding at the coarser precision can move at the reference's logit magnitude."""
    spread = logit_spread(ref)
    eps = max(EPSILON[precision(cand)], EPSILON[precision(ref)])
    return factors.precision_factor * eps * spread, spread


def tie_margin(cand: Observation, ref: Observation, upto: int, floor: float, fixed: float | None = None,
               factors: Factors = Factors()) -> TieMargin:
    """The flip margin for the first mismatch at `upto`: measured on the pair, bounded by its precisions,
    at least `floor` (`fixed`: a margin the recipe sets, used as it is)."""
    bound, spread = precision_bound(cand, ref, factors)
    samples = agreed_flips(cand, ref, upto)
    noise = _quantile(samples, factors.noise_quantile) if len(samples) >= MIN_NOISE_SAMPLES else None
    precisions = (precision(cand), precision(ref))
    if fixed is not None:
        return TieMargin(fixed, noise, len(samples), bound, precisions, spread, "fixed")
    if noise is None:
        margin, source = bound, "precision bound"
    elif factors.noise_factor * noise > bound:
        margin, source = bound, "precision bound (the pair's noise is beyond it)"
    else:
        margin, source = factors.noise_factor * noise, "measured"
    if margin < floor:
        margin, source = floor, "tie_margin floor"
    return TieMargin(margin, noise, len(samples), bound, precisions, spread, source)


@dataclass(frozen=True)
class Tie:
    """The rule's answer at one first mismatch."""

    tied: bool
    flip: float | None  # None: judged on the reference's own gap (the candidate has no logprobs there)
    margin: TieMargin | None
    reference_gap_margin: float | None = None

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.flip is None else {"flip": round(self.flip, 6)}
        if self.margin is not None:
            out.update(self.margin.figures())
        if self.reference_gap_margin is not None:
            out["reference_gap_margin"] = round(self.reference_gap_margin, 6)
        return out

    def words(self) -> str:
        if self.flip is not None and self.margin is not None:
            return f"the two tokens' logprob difference moved {self.flip:.3g}; {self.margin.words()}"
        return f"the reference's top candidates within {self.reference_gap_margin:.3g}"


def judge_tie(cand: Observation, ref: Observation, index: int, tie_margin_cfg: float,
              fixed: float | None = None, factors: Factors = Factors()) -> Tie:
    """Is the first mismatch at `index` (both outputs have a token there) a numerical tie?"""
    cand_token, ref_token = cand.output_token_ids[index], ref.output_token_ids[index]
    ref_steps, cand_steps = ref.top_logprobs or [], cand.top_logprobs or []
    ref_step = ref_steps[index] if index < len(ref_steps) else None
    cand_step = cand_steps[index] if index < len(cand_steps) else None
    moved = flip(cand_step, ref_step, cand_token, ref_token)
    if moved is not None:
        margin = tie_margin(cand, ref, index, tie_margin_cfg, fixed, factors)
        return Tie(moved <= margin.margin, moved, margin)
    gap_margin = max(tie_margin_cfg, precision_bound(cand, ref, factors)[0])
    best = max((float(lp) for _, lp in ref_step or []), default=None)
    tied = {int(tok) for tok, lp in ref_step or [] if best is not None and best - float(lp) <= gap_margin}
    return Tie(len(tied) >= 2 and {cand_token, ref_token} <= tied, None, None, gap_margin)
