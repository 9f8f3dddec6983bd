"""What bad looks like against good: the culprit's output beside its parent's (or the nearest good
step's), aligned at the first difference, and for dumps the first divergent module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation
from bisect_npu.report.view import SessionView, StepView

BEFORE_CHARS = 80  # of the shared text shown before the first difference
AFTER_CHARS = 160  # of each side shown from it


@dataclass(frozen=True)
class OutputPair:
    """One request's output at a good and at a bad commit, cut around the first difference."""

    case_id: str
    good_commit: str
    bad_commit: str
    good: str
    bad: str
    at_char: int | None  # the first differing character (None: the texts are equal)
    at_token: int | None  # the first differing output token, where both kept their ids
    good_finish: str | None
    bad_finish: str | None
    good_tokens: int
    bad_tokens: int
    caret: int  # the column of the first difference in the shown texts
    figures: list[tuple[str, Any, Any]]  # where the texts are the same: the judge's figures that differ (good, bad)


def compared_steps(view: SessionView) -> tuple[StepView, StepView] | None:
    """(good, bad): the culprit's step and the good step nearest below it (its parent when tested);
    without an answer, the two ends' steps."""
    judged = [s for s in view.steps if s.verdict in ("good", "bad") and s.observations]
    end = view.end
    flipped = view.request.search.find_fix
    if end is not None and end.status == "found" and end.culprit:
        found = [s for s in judged if s.commit == end.culprit]
        if not found:
            return None
        culprit = found[-1]
        before = [s for s in judged if s.index < culprit.index and s.verdict != culprit.verdict]
        if not before:
            return None
        parent = max(before, key=lambda s: (s.index, s.order))
        return (culprit, parent) if flipped else (parent, culprit)
    good = [s for s in judged if s.verdict == "good"]
    bad = [s for s in judged if s.verdict == "bad"]
    return (good[0], bad[0]) if good and bad else None


def _observations(view: SessionView, step: StepView) -> dict[str, Observation]:
    """A step's first observation of each request (by case id)."""
    seen: dict[str, Observation] = {}
    for path in step.observations:
        try:
            obs = Observation.load(view.session_dir / path)
        except UsageError:
            continue
        seen.setdefault(obs.case_id, obs)
    return seen


def _first_difference(a: list[Any] | str, b: list[Any] | str) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def _cut(text: str, at: int | None) -> str:
    start = max(0, (at or 0) - BEFORE_CHARS)
    end = (at or 0) + AFTER_CHARS if at is not None else BEFORE_CHARS + AFTER_CHARS
    return ("…" if start else "") + text[start:end] + ("…" if len(text) > end else "")


def output_pairs(view: SessionView) -> list[OutputPair]:
    """Each request's good and bad output, aligned at the first difference (empty: no text kept)."""
    steps = compared_steps(view)
    if steps is None:
        return []
    good_step, bad_step = steps
    good, bad = _observations(view, good_step), _observations(view, bad_step)
    pairs = []
    for case_id, bad_obs in bad.items():
        good_obs = good.get(case_id)
        if good_obs is None or not (good_obs.text or bad_obs.text):
            continue
        good_text, bad_text = _one_line(good_obs.text), _one_line(bad_obs.text)
        at = _first_difference(good_text, bad_text)
        token = (_first_difference(good_obs.output_token_ids, bad_obs.output_token_ids)
                 if good_obs.output_token_ids and bad_obs.output_token_ids else None)
        pairs.append(OutputPair(case_id, good_step.commit, bad_step.commit, _cut(good_text, at), _cut(bad_text, at),
                                at, token, good_obs.finish_reason, bad_obs.finish_reason,
                                len(good_obs.output_token_ids), len(bad_obs.output_token_ids),
                                (at > BEFORE_CHARS) + min(at, BEFORE_CHARS) if at is not None else 0,
                                _differing(good_step.figures, bad_step.figures) if at is None else []))
    return pairs


FIGURES_SHOWN = 6


def _differing(good: dict[str, Any], bad: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The numeric figures of two steps that differ (a throughput, a rate): what the judge saw."""
    rows = []
    for name in sorted(set(good) & set(bad)):
        a, b = good[name], bad[name]
        if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool) and a != b:
            rows.append((name, a, b))
    return rows[:FIGURES_SHOWN]


def first_divergent(view: SessionView) -> dict[str, Any] | None:
    """A dumps comparison's first divergent tensor at the culprit (its name, module, layer, step,
    the rule that fired and its figures), wherever the judge put it among the step's figures."""
    end = view.end
    if end is None or not end.culprit:
        return None
    for step in reversed(view.steps):
        if step.commit == end.culprit and (found := _find(step.figures)) is not None:
            return found
    return None


def _find(figures: Any) -> dict[str, Any] | None:
    if isinstance(figures, dict):
        first = figures.get("first_divergent")
        if isinstance(first, dict) and "name" in first:
            return first
        for value in figures.values():
            if (found := _find(value)) is not None:
                return found
    return None
