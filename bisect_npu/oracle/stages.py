"""Precision alignment: find the first pipeline stage where the candidate leaves the reference.

Stages, in the order the request flows: rendered chat template (text), prompt token ids, forward
pass (a tensor dump, compared with `logits.compare_dumps`), effective sampler parameters, and the
detokenized text. Each is read from `observation.extra["stages"]`, falling back to the matching
top-level observation field (prompt_token_ids, logits_dump, sampling, text). The first stage that
differs is where the drift enters; later stages usually differ as a consequence and are reported
but not blamed. A stage missing on either side is skipped and listed.

The text stage is judged on the tokens behind it with the one tie rule (`oracle.ties`, as the
`tokens` oracle does): text that differs only after a numerical tie between two greedy outputs,
the candidate's continuation greedy-consistent, matches (its figures say the tie, the noise and the
margin); a mismatch beyond the margin is the stage's difference. Either way the stage's words name
the rule and where its constant was set (`[tie rule; provenance]`), as the dump rules do.
"""

from __future__ import annotations

from typing import Any

from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.config import LogitsConfig, StagesConfig, TokenMatchConfig
from bisect_npu.oracle.dumps.compare import compare_dumps
from bisect_npu.oracle.penalty import same_value
from bisect_npu.oracle.ties import PROVENANCE
from bisect_npu.oracle.tokens import first_mismatch, tie_at_first_mismatch

_FALLBACK = {"prompt_token_ids": "prompt_token_ids", "forward": "logits_dump", "sampler": "sampling",
             "text": "text"}


def _stage(obs: Observation, name: str) -> Any:
    stages = obs.extra.get("stages")
    if isinstance(stages, dict) and stages.get(name) is not None:
        return stages[name]
    value = getattr(obs, _FALLBACK[name], None) if name in _FALLBACK else None
    return value if value not in (None, "", [], {}) else None


def _first_diff(a: str | list[Any], b: str | list[Any]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _compare(name: str, cand: Any, ref: Any, logits_cfg: LogitsConfig) -> tuple[bool, dict[str, Any], str]:
    """(matches, figures, one-line description) for one stage."""
    if name in ("chat_template", "text", "prompt_token_ids"):
        index = _first_diff(cand, ref)
        figures: dict[str, Any] = {"first_difference": index, "length": len(cand), "reference_length": len(ref)}
        if index is None:
            return True, figures, "identical"
        if isinstance(cand, str):
            figures["candidate_excerpt"] = cand[max(0, index - 20):index + 40]
            figures["reference_excerpt"] = ref[max(0, index - 20):index + 40]
        return False, figures, f"differs at {'character' if isinstance(cand, str) else 'token'} {index}"
    if name == "sampler":
        keys = sorted(set(cand) | set(ref))
        differing = {k: {"candidate": cand.get(k), "reference": ref.get(k)}
                     for k in keys if not same_value(ref.get(k), cand.get(k), 1e-6)}
        if not differing:
            return True, {}, "identical"
        return False, {"differing": differing}, "differs in " + ", ".join(differing)
    result = compare_dumps(str(cand), str(ref), logits_cfg)
    first = result.first_divergent
    worst = result.worst_cosine
    figures = {"tensors_compared": len(result.rows), "worst_cosine": worst.metrics["cosine"] if worst else None,
               "layers": result.layer_profile()}
    if first is None:
        return True, figures, "all tensors within the pass lines"
    carriers, _ = result.after_first()
    figures["first_divergent"] = first.to_dict()
    figures["carried_by"] = len(carriers)
    provenance = f"; {first.provenance}" if first.provenance else ""
    rule = f"[{first.rule or 'mismatch'} rule{provenance}]"
    return False, figures, f"first divergent tensor {first.name}: {first.problem} {rule}"


def _text_after_tie(obs: Observation, reference: Observation, figures: dict[str, Any],
                    tokens_cfg: TokenMatchConfig) -> tuple[bool, str | None]:
    """Where the texts differ: the tie rule on the tokens behind them. (whether the difference starts at a
    numerical tie the candidate continued greedily from, what the rule said; None: no token differs or
    one output ended there); figures get the tie's."""
    index = first_mismatch(obs.output_token_ids, reference.output_token_ids)
    if index is None:
        return False, None
    compared = max(len(obs.output_token_ids), len(reference.output_token_ids))
    tie, tie_figures, diverged = tie_at_first_mismatch(obs, reference, index, tokens_cfg, compared)
    figures.update(tie_figures, first_token_mismatch=index)
    if tie is None:
        return False, None
    rule = f"[tie rule; {PROVENANCE}]"
    if diverged is not None:
        return False, f"{diverged} {rule}"
    if not tie.tied:
        return False, f"token {index} is no numerical tie ({tie.words()}) {rule}"
    return True, f"differs after a numerical tie at token {index} ({tie.words()}) {rule}"


def judge_stages(obs: Observation, reference: Observation | None, cfg: StagesConfig,
                 logits_cfg: LogitsConfig, tokens_cfg: TokenMatchConfig | None = None) -> Verdict:
    if reference is None:
        return Verdict(kind=VerdictKind.SKIP, reason="stage comparison needs a reference observation")
    figures: dict[str, Any] = {"stages": {}, "skipped_stages": []}
    first_bad: tuple[str, str] | None = None
    for name in cfg.stages:
        cand, ref = _stage(obs, name), _stage(reference, name)
        if cand is None or ref is None:
            figures["skipped_stages"].append(name)
            continue
        matches, stage_figures, said = _compare(name, cand, ref, logits_cfg)
        if name == "text" and not matches:
            tied, words = _text_after_tie(obs, reference, stage_figures, tokens_cfg or TokenMatchConfig())
            if tied:
                matches, said = True, str(words)
                stage_figures["tie"] = words
            elif words is not None:
                said = f"{said}: {words}"
        figures["stages"][name] = {"matches": matches, **stage_figures}
        if not matches and first_bad is None:
            first_bad = (name, said)
    if not figures["stages"]:
        return Verdict(kind=VerdictKind.SKIP, figures=figures,
                       reason="no stage is recorded on both the candidate and the reference")
    if first_bad is not None:
        figures["first_differing_stage"] = first_bad[0]
        return Verdict(kind=VerdictKind.BAD, figures=figures,
                       reason=f"first differing stage: {first_bad[0]} ({first_bad[1]})")
    return Verdict(kind=VerdictKind.GOOD, figures=figures,
                   reason="all compared stages match the reference: " + ", ".join(figures["stages"]))
