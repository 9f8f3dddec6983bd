"""The accuracy verdict of one commit: its rounds of per-sample outcomes against the two ends.

A commit's role decides the question asked: the good end is the reference (bad only when it
misses the baseline), the bad end must score lower than the good end, and a candidate is put on
a side by the likelihood ratio of its outcomes (stats.py). A verdict that is not clear at the
recipe's confidence asks for another round (figure ``more_rounds``) until ``max_rounds``; then
the likelier side decides (``forced_at_max_rounds``). The bad end's verdict, while the drop is
unclear and the good end's mean the less known, asks for the good end's next round first (figure
``good_end_again``: the good end's rounds are pooled, at most ``max_rounds`` in all). Every verdict carries the search's
evidence, ``log_likelihood_ratio`` (bad side over good side).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from bisect_npu.observations import Observation, SampleOutcome, Verdict, VerdictKind
from bisect_npu.oracle.accuracy import stats
from bisect_npu.oracle.accuracy.focus import discordant_ids
from bisect_npu.oracle.accuracy.judged import JudgedRuns
from bisect_npu.oracle.config import AccuracyConfig

Role = Literal["good_end", "bad_end", "candidate"]


def samples_of(observations: Sequence[Observation]) -> list[SampleOutcome] | None:
    """Every round's outcomes pooled per sample; None when an observation has none."""
    if not observations or any(obs.samples is None for obs in observations):
        return None
    return stats.pool(*(obs.samples or [] for obs in observations))


def _score_figures(samples: Sequence[SampleOutcome], cfg: AccuracyConfig, total: int | None) -> dict[str, Any]:
    s = stats.score(samples, cfg.confidence)
    figures: dict[str, Any] = {"accuracy": round(s.accuracy, 3), "accuracy_low": round(s.low, 3),
                               "accuracy_high": round(s.high, 3), "samples_run": s.samples, "sample_runs": s.runs,
                               "samples_total": total if total is not None else s.samples}
    if cfg.metric == "loop_rate":
        figures["loop_rate"] = round(100 - s.accuracy, 3)
    return figures


def _verdict(kind: VerdictKind | None, reason: str, figures: dict[str, Any], rounds: int,
             cfg: AccuracyConfig, lean: VerdictKind, final: bool | None) -> Verdict:
    """`kind` when decided; else another round while rounds remain, or `lean` (forced)."""
    figures = {**figures, "rounds": rounds, "more_rounds": False}
    last = rounds >= cfg.max_rounds if final is None else final
    if kind is None and not last:
        figures["more_rounds"] = True
        return Verdict(kind=lean, reason=f"not clear at {cfg.confidence:g} after {rounds} round(s): {reason}",
                       figures=figures, trials=rounds)
    figures["stopped"] = "clear" if kind is not None else "plan ended"
    if kind is None:
        figures["forced_at_max_rounds"] = True
        reason += f" (not significant at {cfg.confidence:g} after {rounds} rounds: the likelier side)"
        kind = lean
    return Verdict(kind=kind, reason=reason, figures=figures, trials=rounds)


def _points(value: float) -> str:
    return f"{value:.1f}"


def judge_accuracy(cfg: AccuracyConfig, observations: Sequence[Observation], good_end: Sequence[Observation] | None,
                   bad_end: Sequence[Observation] | None, *, role: Role, final: bool | None = None,
                   judged: JudgedRuns | None = None) -> Verdict:
    """The verdict of one commit in `role` from its rounds (observations) and the ends' rounds;
    ``final`` says no further round can come (default: ``max_rounds`` rounds ran), so an unclear
    verdict is forced instead of asking for more (a focused candidate's rounds follow
    focus.round_plan). ``judged``: a candidate's side rates conditioned on the other candidates
    already judged (oracle/accuracy/judged.py)."""
    mine = samples_of(observations)
    rounds = len(observations)
    if mine is None or not mine:
        return Verdict(kind=VerdictKind.SKIP, reason="no per-sample results in the observation (the harness "
                       "scored nothing)", trials=rounds)
    good = samples_of(good_end or []) if role != "good_end" else mine
    bad = samples_of(bad_end or []) if role == "candidate" else (mine if role == "bad_end" else None)
    total = len(good) if good else None
    figures = _score_figures(mine, cfg, total)
    if role == "good_end":
        return _judge_good_end(cfg, mine, figures, rounds, final)
    if good is None:
        return Verdict(kind=VerdictKind.SKIP, reason="no per-sample results of the good end to pair against",
                       trials=rounds)
    if role == "bad_end":
        return _judge_bad_end(cfg, mine, good, figures, rounds, final, len(good_end or []))
    if bad is None:
        return Verdict(kind=VerdictKind.SKIP, reason="no per-sample results of the bad end to pair against",
                       trials=rounds)
    return _judge_candidate(cfg, mine, good, bad, figures, rounds, final, judged)


def _baseline(cfg: AccuracyConfig, samples: Sequence[SampleOutcome]) -> stats.BaselineCheck | None:
    if cfg.reference == "good_end" or cfg.baseline is None:
        return None
    return stats.baseline_check(samples, cfg.baseline, cfg.threshold, cfg.confidence, cfg.max_rounds)


def _baseline_figures(check: stats.BaselineCheck | None) -> dict[str, Any]:
    if check is None:
        return {}
    return {"baseline_line": check.line, "baseline_verdict": check.verdict or "undecided",
            "baseline_alpha": round(check.alpha, 6)}


def _judge_good_end(cfg: AccuracyConfig, mine: list[SampleOutcome], figures: dict[str, Any],
                    rounds: int, final: bool | None) -> Verdict:
    check = _baseline(cfg, mine)
    figures = {**figures, **_baseline_figures(check), "log_likelihood_ratio": 0.0}
    text = f"accuracy {_points(figures['accuracy'])} on {len(mine)} samples"
    if check is None:
        return Verdict(kind=VerdictKind.GOOD, reason=f"the reference: {text}", trials=rounds,
                       figures={**figures, "rounds": rounds, "more_rounds": False})
    kind = {"good": VerdictKind.GOOD, "bad": VerdictKind.BAD, None: None}[check.verdict]
    lean = VerdictKind.GOOD if check.score.accuracy >= check.line else VerdictKind.BAD
    where = "below" if lean == VerdictKind.BAD else "not below"
    return _verdict(kind, f"{text}, {where} baseline - threshold = {_points(check.line)}", figures, rounds, cfg, lean,
                    final)


def _judge_bad_end(cfg: AccuracyConfig, mine: list[SampleOutcome], good: list[SampleOutcome],
                   figures: dict[str, Any], rounds: int, final: bool | None, good_rounds: int) -> Verdict:
    diff, p = stats.paired_rate_p(mine, good)
    worse, better = stats.discordant_counts(mine, good)
    g, b = stats.by_id(good), stats.by_id(mine)
    check = _baseline(cfg, mine)
    figures = {**figures, **_baseline_figures(check), "paired_difference": round(100 * diff, 3),
               "paired_p": p, "discordant": len(discordant_ids(good, mine)), "only_good_right": worse,
               "only_bad_right": better, "flipped": stats.flipped(g, b), "log_likelihood_ratio": 0.0,
               "good_accuracy": round(stats.score(good, cfg.confidence).accuracy, 3)}
    alpha = 1 - cfg.confidence
    text = (f"accuracy {_points(figures['accuracy'])} against the good end's {_points(figures['good_accuracy'])} "
            f"(paired difference {diff * 100:+.1f} points, p = {p:.3g})")
    paired: VerdictKind | None = None
    if cfg.reference in ("good_end", "both"):
        paired = VerdictKind.BAD if p <= alpha / cfg.max_rounds else None  # Bonferroni over the looks
    by_baseline = {"good": VerdictKind.GOOD, "bad": VerdictKind.BAD, None: None}[check.verdict] if check else None
    if cfg.reference == "good_end":
        kind = paired
    elif cfg.reference == "baseline":
        kind = by_baseline
    else:
        kind = VerdictKind.BAD if VerdictKind.BAD in (paired, by_baseline) else None
    lean = VerdictKind.BAD if diff < 0 else VerdictKind.GOOD
    if kind == VerdictKind.BAD and not stats.ends_known(good, mine):
        # Every candidate is placed between the ends' means: an end measured too loosely for the
        # drop between them would misplace them all, so it runs again while rounds remain.
        figures["ends_too_loose"] = True
        text += "; the ends' means are not yet known well enough for this drop"
        kind = None if not (rounds >= cfg.max_rounds if final is None else final) else kind
    if (kind is None or figures.get("ends_too_loose")) and good_rounds < cfg.max_rounds:
        looser, good_error, bad_error = stats.looser_end(good, mine)
        if looser == "good":
            # The drop is unclear and the good end's mean the looser: its next round tells more
            # than the bad end's (the step runs it, then judges the bad end's rounds again).
            figures |= {"good_end_again": True, "good_error": round(good_error, 5), "bad_error": round(bad_error, 5)}
            text += (f"; the good end's mean is the looser (standard error {100 * good_error:.2f} points against "
                     f"{100 * bad_error:.2f}): it runs again first")
    return _verdict(kind, text, figures, rounds, cfg, lean, final)


def _judge_candidate(cfg: AccuracyConfig, mine: list[SampleOutcome], good: list[SampleOutcome],
                     bad: list[SampleOutcome], figures: dict[str, Any], rounds: int, final: bool | None,
                     judged: JudgedRuns | None = None) -> Verdict:
    prior = stats.fit_joint(good, bad, cfg.greedy)
    bound = stats.stop_bound(cfg.confidence, prior)
    discordant = set(discordant_ids(good, bad))
    control = [s for s in mine if s.id not in discordant]
    control_diff, control_p = stats.control_p(control, good, bad, prior, cfg.confidence)
    broken_elsewhere = bool(control) and control_diff < 0 and control_p <= (1 - cfg.confidence) / cfg.max_rounds
    evidence = stats.step_evidence(mine, good, bad, prior, cfg.confidence, judged)
    log_lr = evidence.log_lr
    imputed = _imputed(mine, good)
    check = _baseline(cfg, imputed)
    if broken_elsewhere and log_lr < stats.step_bound(cfg.confidence):
        log_lr = stats.step_bound(cfg.confidence)
        evidence = stats.StepEvidence(log_lr)
    figures = {**figures, **_baseline_figures(check), "log_likelihood_ratio": round(log_lr, 4),
               "wald_bound": round(bound, 4), "answer_bound": round(stats.step_bound(cfg.confidence), 4),
               "discordant": len(discordant), "control": len(control),
               "control_difference": round(100 * control_diff, 3), "control_p": control_p,
               "broken_elsewhere": broken_elsewhere, "prior_rho": round(prior.rho, 4), "prior_cov": round(prior.cov, 5),
               "estimated_accuracy": round(stats.score(imputed, cfg.confidence).accuracy, 3)}
    if judged:
        figures["judged_runs"] = _judged_figure(judged)
    if evidence.good_nodes:
        # The search integrates the ends' shared error once over every step (search.Weight).
        figures["ends_error_nodes"] = {"good": [round(t, 4) for t in evidence.good_nodes],
                                       "bad": [round(t, 4) for t in evidence.bad_nodes]}
    by_ratio = VerdictKind.BAD if log_lr >= bound else VerdictKind.GOOD if log_lr <= -bound else None
    if cfg.reference == "both" and check is not None and check.verdict == "bad":
        by_ratio = VerdictKind.BAD
    side = "bad" if log_lr > 0 else "good"
    text = (f"scores like the {side} end on {len(mine)} samples (log likelihood ratio {log_lr:+.2f}, "
            f"bound {bound:.2f}); accuracy {_points(figures['accuracy'])} on those")
    if broken_elsewhere:
        text = (f"broken elsewhere: {control_diff * 100:+.1f} points against the good side's rates on {len(control)} "
                f"control samples the ends agree on (p = {control_p:.3g})")
    return _verdict(by_ratio, text, figures, rounds, cfg, VerdictKind.BAD if log_lr > 0 else VerdictKind.GOOD, final)


def _judged_figure(judged: JudgedRuns) -> dict[str, float]:
    """The weighed runs of other candidates added to each side's (judged.py), in all."""
    return {side: round(sum(k + w for k, w in runs.values()), 3)
            for side, runs in (("good", judged.good), ("bad", judged.bad))}


def _imputed(mine: list[SampleOutcome], good: list[SampleOutcome]) -> list[SampleOutcome]:
    """The whole dataset's outcomes of a focused candidate: the samples it did not run take the
    good end's (the ends agree there, and its control samples check that it does too)."""
    ran = {s.id for s in mine}
    return [*mine, *(s for s in good if s.id not in ran)]
