"""Two observations are compared only when they are of the same case: a verdict on the outputs of
two different prompts, or of two vocabularies, is no verdict.

The same case means the same model vocabulary (where both carry `extra["model_identity"]`: its size
and the tokenizer's digest) and the same prompt: the digest of the prompt or messages the case
gave the probe (`extra["case_input"]`), where both carry it; otherwise the prompt token ids, unless
both come from one recipe at one run digest (the same case by construction, where ids that differ
are a finding of the prompt stage: a chat template or tokenizer regression, not another case).
A golden from another backend of the same model passes: its recipe differs, its case does not.
"""

from __future__ import annotations

from typing import Any

from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation

_VOCABULARY = ("vocab_size", "tokenizer")


def _identity(obs: Observation) -> dict[str, Any]:
    identity = obs.extra.get("model_identity")
    return identity if isinstance(identity, dict) else {}


def _same_run(obs: Observation, reference: Observation) -> bool:
    return bool(obs.recipe and obs.run_digest) and (obs.recipe, obs.run_digest) == (reference.recipe,
                                                                                   reference.run_digest)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def case_difference(obs: Observation, reference: Observation, *, same_cases: bool = False) -> str | None:
    """What makes the two observations different cases (one phrase), or None when they are one case.
    `same_cases`: the caller knows both ran the same cases (two records of one cases digest), so prompt
    token ids that differ are a finding, as within one recipe's run."""
    ours, theirs = _identity(obs), _identity(reference)
    differing = [key for key in _VOCABULARY if key in ours and key in theirs and ours[key] != theirs[key]]
    if differing:
        return "the model vocabulary (" + ", ".join(f"{key} {ours[key]} vs reference {theirs[key]}"
                                                    for key in differing) + ")"
    ours_input, theirs_input = obs.extra.get("case_input"), reference.extra.get("case_input")
    if ours_input and theirs_input:
        return None if ours_input == theirs_input else \
            f"the prompt (case input digest {ours_input} vs reference {theirs_input})"
    if same_cases or _same_run(obs, reference) or not obs.prompt_token_ids or not reference.prompt_token_ids:
        return None
    if obs.prompt_token_ids != reference.prompt_token_ids:
        at = _first_difference(obs.prompt_token_ids, reference.prompt_token_ids)
        return (f"the prompt token ids (from index {at}; {len(obs.prompt_token_ids)} ids vs reference "
                f"{len(reference.prompt_token_ids)})")
    return None


def check_same_case(obs: Observation, reference: Observation, *, same_cases: bool = False) -> None:
    """Refuse to compare observations of two different cases, naming what differs."""
    difference = case_difference(obs, reference, same_cases=same_cases)
    if difference is not None:
        raise UsageError(f"the reference is another case than the observation of case {obs.case_id}: it differs in "
                         f"{difference} (reference: recipe {reference.recipe or '?'}, case {reference.case_id}); "
                         "give a reference of the same prompt and model")
