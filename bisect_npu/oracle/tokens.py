"""Deterministic token match against a reference observation (greedy decoding, same prompt).

Figures: first mismatch index, shared prefix, match rate = shared prefix / longer output.

Near ties: NPU and GPU kernels round differently, so where the reference's two best candidates are
within `tie_margin` (logprob difference), either token is a correct greedy choice. A first
mismatch there is a *numerical tie*, not a regression.

With top logprobs on both sides the tie is judged on what moved between the runs: the *flip*,
the reference's preference for its token plus the candidate's for its own, is the change of the
two tokens' logprob difference. Correct kernels and precisions move it by rounding alone; a
faulty module moves it by more, even where the reference's own gap was small. The flip margin is
measured on clean pairs (bench/token_tie_bench.py), not chosen; without the candidate's logprobs
the reference's gap and `tie_margin` decide.

After a tie the two outputs continue from different contexts, so the reference's later tokens say
nothing about the candidate's. A *later real divergence* is then defined on the candidate alone:
with its own top_logprobs, every later token must be (within `tie_margin`) the top candidate of
its own distribution, as greedy decoding requires; a token that is not marks a real divergence
(a broken sampler, penalty or logits path). Without the candidate's logprobs the continuation is
reported as unchecked and the verdict rests on the tie.
"""

from __future__ import annotations

from typing import Any

from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.config import TokenMatchConfig


def first_mismatch(candidate: list[int], reference: list[int]) -> int | None:
    """Index of the first differing position (a length difference counts), or None if equal."""
    for i, (a, b) in enumerate(zip(candidate, reference, strict=False)):
        if a != b:
            return i
    return None if len(candidate) == len(reference) else min(len(candidate), len(reference))


def _tied_tokens(step: list[tuple[int, float]] | list[list[Any]] | None, margin: float) -> set[int]:
    """Tokens within `margin` of the best logprob at one step ({} when the step has < 2 candidates)."""
    if not step or len(step) < 2:
        return set()
    best = max(float(lp) for _, lp in step)
    tied = {int(tok) for tok, lp in step if best - float(lp) <= margin}
    return tied if len(tied) >= 2 else set()


def _logprob(step: list[tuple[int, float]] | list[list[Any]] | None, token: int) -> float | None:
    return next((float(lp) for tok, lp in step or [] if int(tok) == token), None)


def flip(cand_step: list[tuple[int, float]] | list[list[Any]] | None,
         ref_step: list[tuple[int, float]] | list[list[Any]] | None, cand_token: int, ref_token: int) -> float | None:
    """How far the two tokens' logprob difference moved between the runs (None: a side lacks one of them)."""
    values = (_logprob(ref_step, ref_token), _logprob(ref_step, cand_token), _logprob(cand_step, cand_token),
              _logprob(cand_step, ref_token))
    if any(v is None for v in values):
        return None
    ref_want, ref_got, cand_got, cand_want = (float(v) for v in values if v is not None)
    return (ref_want - ref_got) + (cand_got - cand_want)


def _self_divergence(obs: Observation, start: int, margin: float) -> int | None:
    """First index >= start where the candidate's token is not its own top choice (within margin)."""
    steps = obs.top_logprobs or []
    for j in range(start, min(len(obs.output_token_ids), len(steps))):
        step = steps[j]
        if not step:
            continue
        best = max(float(lp) for _, lp in step)
        chosen = next((float(lp) for tok, lp in step if int(tok) == obs.output_token_ids[j]), None)
        if chosen is None or best - chosen > margin:
            return j
    return None


def judge_tokens(obs: Observation, reference: Observation | None, cfg: TokenMatchConfig) -> Verdict:
    if reference is None:
        return Verdict(kind=VerdictKind.SKIP, reason="token match needs a reference observation")
    limit = cfg.compare_tokens
    cand = obs.output_token_ids[:limit] if limit else obs.output_token_ids
    ref = reference.output_token_ids[:limit] if limit else reference.output_token_ids
    if not ref and not cand:
        return Verdict(kind=VerdictKind.SKIP, reason="neither output has tokens to compare")
    index = first_mismatch(cand, ref)
    longer = max(len(cand), len(ref))
    shared = longer if index is None else index
    figures: dict[str, Any] = {"first_mismatch": index, "shared_prefix": shared,
                               "match_rate": round(shared / longer, 6), "compared_tokens": longer}
    if index is None:
        return Verdict(kind=VerdictKind.GOOD, reason=f"all {longer} tokens match the reference", figures=figures)
    ref_steps, cand_steps = reference.top_logprobs or [], obs.top_logprobs or []
    ref_step = ref_steps[index] if index < len(ref_steps) else None
    both = index < len(cand) and index < len(ref)
    moved = flip(cand_steps[index] if index < len(cand_steps) else None, ref_step, cand[index], ref[index]) \
        if both and cfg.flip_margin is not None else None
    if moved is not None:
        figures["flip"] = round(moved, 6)
        tied = {cand[index], ref[index]} if moved <= (cfg.flip_margin or 0.0) else set()
    else:
        tied = _tied_tokens(ref_step, cfg.tie_margin)
    if both and cand[index] in tied and ref[index] in tied:
        figures["tie_at"] = index
        figures["tie_tokens"] = sorted(tied)
        if not obs.top_logprobs:
            figures["after_tie_checked"] = False
            return Verdict(kind=VerdictKind.GOOD, figures=figures,
                           reason=f"first mismatch at token {index} is a numerical tie (top candidates within "
                                  f"{cfg.tie_margin}); continuation unchecked (candidate has no logprobs)")
        figures["after_tie_checked"] = True
        later = _self_divergence(obs, index + 1, cfg.tie_margin)
        if later is None:
            return Verdict(kind=VerdictKind.GOOD, figures=figures,
                           reason=f"first mismatch at token {index} is a numerical tie{_flip_words(figures, cfg)}; "
                                  "the continuation is greedy-consistent")
        figures["real_divergence_at"] = later
        return Verdict(kind=VerdictKind.BAD, figures=figures,
                       reason=f"tie at token {index}, then a real divergence at token {later}: the candidate "
                              "chose a token that is not its own top candidate")
    if shared / longer >= cfg.min_match_rate:
        return Verdict(kind=VerdictKind.GOOD, figures=figures,
                       reason=f"first mismatch at token {index}; match rate {shared / longer:.3f} >= "
                              f"{cfg.min_match_rate}")
    got = cand[index] if index < len(cand) else "end of output"
    want = ref[index] if index < len(ref) else "end of output"
    return Verdict(kind=VerdictKind.BAD, figures=figures,
                   reason=f"first mismatch at token {index} ({got} vs reference {want})"
                          f"{_flip_words(figures, cfg)}; shared prefix {shared} of {longer}")


def _flip_words(figures: dict[str, Any], cfg: TokenMatchConfig) -> str:
    if "flip" not in figures:
        return ""
    return f" (the two tokens' logprob difference moved {figures['flip']:.3g}; flip margin {cfg.flip_margin})"
