"""Deterministic token match against a reference observation (greedy decoding, same prompt).

Figures: first mismatch index, shared prefix, match rate = shared prefix / longer output.

Near ties: NPU and GPU kernels and precisions round differently, so where the reference's two best
candidates are close, either token is a correct greedy choice. Whether a first mismatch is such a
*numerical tie* is the one tie rule's answer (`oracle.ties`): the flip of the two tokens against a
margin measured on the pair and bounded by its precisions; the verdict says the noise measured and
the margin used.

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
from bisect_npu.oracle.ties import SHIPPED, Factors, Tie, judge_tie


def first_mismatch(candidate: list[int], reference: list[int]) -> int | None:
    """Index of the first differing position (a length difference counts), or None if equal."""
    for i, (a, b) in enumerate(zip(candidate, reference, strict=False)):
        if a != b:
            return i
    return None if len(candidate) == len(reference) else min(len(candidate), len(reference))


def self_divergence(obs: Observation, start: int, margin: float) -> int | None:
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


def tie_at_first_mismatch(obs: Observation, reference: Observation, index: int, cfg: TokenMatchConfig,
                          compared: int | None = None,
                          factors: Factors = SHIPPED) -> tuple[Tie | None, dict[str, Any], str | None]:
    """The tie rule at the first mismatch `index` of outputs compared over `compared` tokens: (its answer,
    figures, why the outputs still diverge after a tie, or None). No answer where one output ended there."""
    if index >= len(obs.output_token_ids) or index >= len(reference.output_token_ids):
        return None, {}, None
    tie = judge_tie(obs, reference, index, cfg.tie_margin, cfg.flip_margin, factors, compared)
    figures = tie.figures()
    if not tie.tied:
        return tie, figures, None
    figures["tie_at"] = index
    figures["tie_tokens"] = sorted({obs.output_token_ids[index], reference.output_token_ids[index]})
    figures["after_tie_checked"] = bool(obs.top_logprobs)
    later = self_divergence(obs, index + 1, cfg.tie_margin) if obs.top_logprobs else None
    if later is None:
        return tie, figures, None
    figures["real_divergence_at"] = later
    return tie, figures, (f"tie at token {index}, then a real divergence at token {later}: the candidate chose a "
                          "token that is not its own top candidate")


def judge_tokens(obs: Observation, reference: Observation | None, cfg: TokenMatchConfig,
                 factors: Factors = SHIPPED) -> Verdict:
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
    tie, tie_figures, diverged = tie_at_first_mismatch(obs, reference, index, cfg, longer, factors)
    figures.update(tie_figures)
    if diverged is not None:
        return Verdict(kind=VerdictKind.BAD, figures=figures, reason=diverged)
    if tie is not None and tie.tied:
        after = "the continuation is greedy-consistent" if obs.top_logprobs else \
            "continuation unchecked (candidate has no logprobs)"
        return Verdict(kind=VerdictKind.GOOD, figures=figures,
                       reason=f"first mismatch at token {index} is a numerical tie ({tie.words()}); {after}")
    if shared / longer >= cfg.min_match_rate:
        return Verdict(kind=VerdictKind.GOOD, figures=figures,
                       reason=f"first mismatch at token {index}; match rate {shared / longer:.3f} >= "
                              f"{cfg.min_match_rate}")
    got = cand[index] if index < len(cand) else "end of output"
    want = ref[index] if index < len(ref) else "end of output"
    moved = f" ({tie.words()})" if tie is not None and tie.flip is not None else ""
    return Verdict(kind=VerdictKind.BAD, figures=figures,
                   reason=f"first mismatch at token {index} ({got} vs reference {want}){moved}; "
                          f"shared prefix {shared} of {longer}")
