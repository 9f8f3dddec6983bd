"""Speculative decoding health: the share of draft tokens the target model accepted.

A corrupted rejection sampler shows up as an acceptance rate near 0 long before the text looks
wrong, so the rate itself is the figure. Optionally the greedy output must also agree with a
reference run at temperature 0 (token agreement = shared prefix / longer output).
"""

from __future__ import annotations

from typing import Any

from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.config import AcceptanceConfig
from bisect_npu.oracle.tokens import first_mismatch


def judge_acceptance(obs: Observation, reference: Observation | None, cfg: AcceptanceConfig) -> Verdict:
    spec = obs.extra.get("spec_decode")
    if not isinstance(spec, dict) or not isinstance(spec.get("proposed"), int) \
            or not isinstance(spec.get("accepted"), int):
        return Verdict(kind=VerdictKind.SKIP,
                       reason="observation has no extra.spec_decode {proposed, accepted} counts")
    proposed, accepted = spec["proposed"], spec["accepted"]
    if proposed <= 0:
        return Verdict(kind=VerdictKind.SKIP, reason="no draft tokens were proposed (is speculative decoding on?)")
    rate = accepted / proposed
    figures: dict[str, Any] = {"proposed": proposed, "accepted": accepted, "acceptance_rate": round(rate, 4),
                               "min_acceptance_rate": cfg.min_acceptance_rate}
    if rate < cfg.min_acceptance_rate:
        return Verdict(kind=VerdictKind.BAD, figures=figures,
                       reason=f"acceptance rate {rate:.3f} ({accepted}/{proposed}) < {cfg.min_acceptance_rate}")
    if cfg.min_token_agreement is not None and reference is not None:
        index = first_mismatch(obs.output_token_ids, reference.output_token_ids)
        longer = max(1, len(obs.output_token_ids), len(reference.output_token_ids))
        agreement = 1.0 if index is None else index / longer
        figures["token_agreement"] = round(agreement, 4)
        if agreement < cfg.min_token_agreement:
            return Verdict(kind=VerdictKind.BAD, figures=figures,
                           reason=f"token agreement with the reference {agreement:.3f} < "
                                  f"{cfg.min_token_agreement} (first mismatch at token {index})")
    return Verdict(kind=VerdictKind.GOOD, figures=figures,
                   reason=f"acceptance rate {rate:.3f} ({accepted}/{proposed})")
