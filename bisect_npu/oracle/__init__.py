"""Oracles: observations (and a reference) in, a good/bad/skip Verdict with its figures out.

`judge_observation` judges one trial with every kind the config lists (all must pass);
`judge` judges a commit: per-trial verdicts, then the stats oracle over trials when trials
repeat. Both take the recipe's `oracle` section (an OracleConfig), not the recipe: the oracles
know nothing of recipes, sessions or the search. Kinds: repetition, tokens, logits, acceptance,
penalty, stages (per trial), stats (over trials) and accuracy (a harness run's per-sample results
against the two ends: `oracle.accuracy`). The "command" kind (a user command's exit code) is
judged by the session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.acceptance import judge_acceptance
from bisect_npu.oracle.config import AccuracyConfig, OracleConfig
from bisect_npu.oracle.penalty import judge_penalty
from bisect_npu.oracle.same_case import check_same_case
from bisect_npu.oracle.stats import Undecided, judge_trials
from bisect_npu.oracle.throughput import ThroughputConfig, judge_throughput
from bisect_npu.oracle.tokens import judge_tokens

if TYPE_CHECKING:
    from bisect_npu.oracle.accuracy.judge import judge_accuracy

__all__ = ["judge", "judge_accuracy", "judge_observation", "judge_trials"]

NOT_PER_TRIAL = ("stats", "command", "accuracy")


def __getattr__(name: str) -> Any:
    """`judge_accuracy`, imported when first used: the kinds that compute with numpy (accuracy,
    repetition, logits, stages) are imported by the judging that needs them, so reading a recipe
    (its schema imports the oracles' config) does not import numpy."""
    if name != "judge_accuracy":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from bisect_npu.oracle.accuracy.judge import judge_accuracy

    return judge_accuracy


def _judges() -> dict[str, Callable[[Observation, Observation | None, OracleConfig], Verdict]]:
    from bisect_npu.oracle.dumps.compare import judge_logits
    from bisect_npu.oracle.repetition import judge_repetition
    from bisect_npu.oracle.stages import judge_stages

    return {
        "repetition": lambda obs, ref, cfg: judge_repetition(obs, cfg.repetition),
        "tokens": lambda obs, ref, cfg: judge_tokens(obs, ref, cfg.tokens),
        "logits": lambda obs, ref, cfg: judge_logits(obs, ref, cfg.logits),
        "acceptance": lambda obs, ref, cfg: judge_acceptance(obs, ref, cfg.acceptance),
        "penalty": lambda obs, ref, cfg: judge_penalty(obs, cfg.penalty),
        "stages": lambda obs, ref, cfg: judge_stages(obs, ref, cfg.stages, cfg.logits, cfg.tokens),
        "throughput": lambda obs, ref, cfg: judge_throughput(_throughput(cfg), [obs], [ref] if ref else None),
    }


def _throughput(cfg: OracleConfig) -> ThroughputConfig:
    assert cfg.throughput is not None  # OracleConfig requires the section with the kind
    return cfg.throughput


def _chart_figures(kind: str, figures: dict[str, Any]) -> dict[str, Any]:
    """Plain numeric aliases the report charts (loop_tokens, cosine) next to the kind's own figures."""
    extra: dict[str, Any] = {}
    if kind == "repetition":
        extra["loop_tokens"] = figures.get("loop_covered_tokens", 0)
    if kind == "logits" and "worst_cosine" in figures:
        extra["cosine"] = figures["worst_cosine"]
    return extra


def judge_observation(cfg: OracleConfig, obs: Observation, reference: Observation | None) -> Verdict:
    """One trial: every per-trial kind must pass; kinds that cannot judge it are listed, not failed.
    A reference of another case is refused (a usage error naming what differs), never judged."""
    if reference is not None:
        check_same_case(obs, reference)
    judges = _judges()
    kinds = [k for k in cfg.kinds if k not in NOT_PER_TRIAL]
    verdicts = {kind: judges[kind](obs, reference, cfg) for kind in kinds}
    figures: dict[str, Any] = {}
    for kind, verdict in verdicts.items():
        for key, value in {**verdict.figures, **_chart_figures(kind, verdict.figures)}.items():
            figures.setdefault(key, value)
    figures["oracles"] = {kind: verdict.kind.value for kind, verdict in verdicts.items()}
    bad = [f"{kind}: {v.reason}" for kind, v in verdicts.items() if v.kind == VerdictKind.BAD]
    judged = [kind for kind, v in verdicts.items() if v.kind != VerdictKind.SKIP]
    if bad:
        return Verdict(kind=VerdictKind.BAD, reason="; ".join(bad), figures=figures)
    if not judged:
        why = "; ".join(f"{kind}: {v.reason}" for kind, v in verdicts.items()) or "no per-trial oracle kind"
        return Verdict(kind=VerdictKind.SKIP, reason=why, figures=figures)
    skipped = [kind for kind in verdicts if kind not in judged]
    reason = "; ".join(f"{kind}: {verdicts[kind].reason}" for kind in judged)
    if skipped:
        reason += f" (not judged: {', '.join(skipped)})"
    return Verdict(kind=VerdictKind.GOOD, reason=reason, figures=figures)


def _accuracy_alone(cfg: AccuracyConfig, observations: list[Observation],
                    reference: list[Observation] | None) -> Verdict:
    from bisect_npu.oracle.accuracy.judge import judge_accuracy

    if reference:
        return judge_accuracy(cfg, observations, reference, None, role="bad_end", final=True)
    if cfg.reference == "good_end":
        return Verdict(kind=VerdictKind.SKIP, trials=len(observations),
                       reason="accuracy with reference good_end needs the good end's observations (--reference)")
    return judge_accuracy(cfg, observations, None, None, role="good_end", final=True)


def reference_for(obs: Observation, reference: list[Observation] | None) -> Observation | None:
    """The reference observation of the same case (the same trial number when there are several)."""
    same_case = [r for r in reference or [] if r.case_id == obs.case_id]
    return next((r for r in same_case if r.trial == obs.trial), same_case[0] if same_case else None)


def _all_cases(per_case: list[Verdict]) -> Verdict:
    """Single trials of one or more cases: every case must pass."""
    if len(per_case) == 1:
        return per_case[0]
    for kind in (VerdictKind.BAD, VerdictKind.GOOD):
        first = next((v for v in per_case if v.kind == kind), None)
        if first is not None:
            count = sum(v.kind == kind for v in per_case)
            return first.model_copy(update={"reason": f"{count} of {len(per_case)} cases {kind.value}: "
                                                      f"{first.reason}", "trials": len(per_case)})
    return per_case[0].model_copy(update={"trials": len(per_case)})


def judge(cfg: OracleConfig, observations: list[Observation], reference: list[Observation] | None, *,
          trials_per_case: int, accuracy: AccuracyConfig | None = None) -> Verdict:
    """A commit: per-trial verdicts, then a sequential verdict over trials when trials repeat
    (``trials_per_case`` > 1, the recipe's ``trials.count``) or the config asks for stats.

    Kind accuracy, on its own (`bisect-npu judge`, the library's judge): the observations are all
    the rounds there are; with a reference (the good end's rounds) bad when they score lower than
    it by the paired test, without one the baseline test alone. A session judges its accuracy
    steps against both ends instead (`judge_accuracy`, roles)."""
    if not observations:
        return Verdict(kind=VerdictKind.SKIP, reason="no observations to judge", trials=0)
    for obs in observations:
        paired = reference_for(obs, reference)
        if paired is not None:
            check_same_case(obs, paired)
    if "throughput" in cfg.kinds:  # a figure over the trials, not a per-trial pass

        return judge_throughput(_throughput(cfg), observations, reference)
    if "accuracy" in cfg.kinds:
        if accuracy is None:
            raise ValueError("oracle kind accuracy needs the recipe's accuracy settings")
        return _accuracy_alone(accuracy, observations, reference)
    per_trial = [judge_observation(cfg, obs, reference_for(obs, reference)) for obs in observations]
    if trials_per_case == 1 and "stats" not in cfg.kinds:
        return _all_cases(per_trial)
    usable = [v for v in per_trial if v.kind != VerdictKind.SKIP]
    if not usable:
        return Verdict(kind=VerdictKind.SKIP, trials=len(per_trial),
                       reason=f"no usable trial of {len(per_trial)}: {per_trial[0].reason}")
    reference_rate = None
    if reference and "stats" in cfg.kinds:
        ref_verdicts = [judge_observation(cfg, ref, None) for ref in reference]
        ref_usable = [v for v in ref_verdicts if v.kind != VerdictKind.SKIP]
        if ref_usable:
            reference_rate = sum(v.kind == VerdictKind.BAD for v in ref_usable) / len(ref_usable)
    # The trials given are all there will be (the session runs the recipe's count), so an undecided
    # sequential test is settled here by the rate; figures say when that happened.
    stats_cfg = cfg.stats.model_copy(update={"max_trials": len(usable)})
    result = judge_trials([v.kind == VerdictKind.BAD for v in usable], stats_cfg, reference_rate)
    assert not isinstance(result, Undecided)  # max_trials reached: judge_trials always decides
    example = next((v for v in usable if v.kind == VerdictKind.BAD), usable[0])
    figures = {**result.figures, "trial_outcomes": [v.kind.value for v in per_trial],
               "example_trial": example.reason}
    reason = result.reason
    if figures.get("forced_at_max_trials"):
        reason += " (not significant at this confidence: more trials would settle it)"
    if example.kind == VerdictKind.BAD:
        reason += f"; e.g. {example.reason}"
    return result.model_copy(update={"figures": figures, "reason": reason, "trials": len(per_trial)})
