"""An accuracy session's scores per tested commit and the samples that flipped at the culprit, and
the figure charted per tested commit for the other kinds."""

from __future__ import annotations

from typing import Any

from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation
from bisect_npu.report.view import SessionView, StepView

# Figures worth charting, most telling first; the first one that most steps carry is drawn.
CHART_FIGURES = ("loop_rate", "rate", "bad_rate", "loop_tokens", "covered_tokens", "match_rate", "cosine",
                 "min_cosine", "acceptance_rate", "effective", "first_mismatch", "distinct_ratio")


def chart_series(steps: list[StepView]) -> tuple[str, list[tuple[str, float]]] | None:
    """The oracle figure to chart per tested commit (in history order), or None if none is numeric."""
    steps = [s for s in steps if s.verdict != "unfinished"]  # no figures: they would only dilute the chart
    for name in CHART_FIGURES:
        points = [(s, s.figures.get(name)) for s in steps]
        numeric = [(s, float(v)) for s, v in points if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numeric) >= max(2, len(steps) // 2):
            numeric.sort(key=lambda p: p[0].index)
            return name, [(s.commit[:7], v) for s, v in numeric]
    return None


FLIPPED_SHOWN = 5  # samples listed as "flipped at the culprit"
EXCERPT_CHARS = 240


def _excerpt(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def _step_samples(view: SessionView, step: StepView) -> dict[str, dict[str, Any]]:
    """A step's per-sample outcomes, its rounds pooled: id -> correct (rate), runs and the first texts."""
    pooled: dict[str, dict[str, Any]] = {}
    for path in step.observations:
        try:
            obs = Observation.load(view.session_dir / path)
        except UsageError:
            continue  # a report shows what it can read; the step's figures still say what was judged
        for sample in obs.samples or []:
            seen = pooled.setdefault(sample.id, {"correct_runs": 0.0, "runs": 0, "prompt": sample.prompt,
                                                 "output": sample.output, "target": sample.target,
                                                 "finish_reason": sample.finish_reason})
            seen["correct_runs"] += sample.correct_runs
            seen["runs"] += sample.runs
    for seen in pooled.values():
        seen["correct"] = seen["correct_runs"] / seen["runs"]
    return pooled


def accuracy_view(view: SessionView) -> dict[str, Any] | None:
    """An accuracy session's figures: each tested commit's score with its interval and the samples it
    ran against the whole set, and the samples that flipped at the culprit (the bad case)."""
    rows = sorted((s for s in view.steps if "accuracy" in s.figures and s.verdict != "unfinished"),
                  key=lambda s: (s.index, s.order))
    if not rows:
        return None
    total = max(int(s.figures.get("samples_total") or 0) for s in rows)
    runs = sum(int(s.figures.get("sample_runs") or 0) for s in rows)
    flipped: list[dict[str, Any]] = []
    end = view.end
    if end is not None and end.status == "found" and end.culprit:
        culprit = [s for s in rows if s.commit == end.culprit]
        below = [s for s in rows if culprit and s.index < culprit[0].index]
        parent = [s for s in below if s.index == max(b.index for b in below)] if below else []
        mine = {k: v for s in culprit for k, v in _step_samples(view, s).items()}
        theirs = {k: v for s in parent for k, v in _step_samples(view, s).items()}
        drops = [(theirs[i]["correct"] - m["correct"], i) for i, m in mine.items()
                 if i in theirs and theirs[i]["correct"] > m["correct"]]
        for _, i in sorted(drops, key=lambda d: -d[0])[:FLIPPED_SHOWN]:
            before, after = theirs[i], mine[i]
            flipped.append({"id": i, "before": round(before["correct"], 3), "after": round(after["correct"], 3),
                            "prompt": _excerpt(before["prompt"] or after["prompt"]),
                            "target": _excerpt(before["target"] or after["target"]),
                            "before_output": _excerpt(before["output"]), "after_output": _excerpt(after["output"]),
                            "after_finish": after["finish_reason"], "parent": parent[0].commit if parent else None})
    return {"rows": rows, "samples_total": total, "sample_runs": runs, "flipped": flipped,
            "metric": "loop_rate" if any("loop_rate" in s.figures for s in rows) else "accuracy",
            "full_runs": total * len(rows)}


