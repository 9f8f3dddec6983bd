"""The per-sample JSONL line format: what the `command` harness writes and the runners produce.

One JSON object per line, one line per sample:

    {"id": "aime-7", "correct": 1, "runs": 1, "prompt": "...", "output": "...", "target": "42",
     "finish_reason": "stop"}

`id` (a string, or an integer read as its decimal text) and `correct` (0, 1, true, false, or a
rate in [0, 1] when the sample ran `runs` times) are required; the rest is optional text for the
report. Blank lines are ignored; a sample listed twice is merged (its runs add up), so a harness
may write one line per run. Anything else is a `SampleFormatError` naming the file and the line:
a harness that writes nonsense is a broken harness (infrastructure), never a verdict.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from bisect_npu.errors import InfrastructureError, validation_problem
from bisect_npu.observations import SampleOutcome

MAX_LINE_CHARS = 1 << 22  # a line holds one sample's excerpts: 4 Mi characters is far beyond any


class SampleFormatError(InfrastructureError):
    """A per-sample line that does not parse (exit 5: the harness, not the commit, is at fault)."""


def _outcome(raw: object, where: str) -> SampleOutcome:
    if not isinstance(raw, dict):
        raise SampleFormatError(f"{where}: a sample line is a JSON object with `id` and `correct`, got "
                                f"{type(raw).__name__}; fix the harness's output")
    if isinstance(raw.get("correct"), bool):
        raw = {**raw, "correct": float(raw["correct"])}
    try:
        return SampleOutcome.model_validate(raw)
    except ValidationError as exc:
        field, problem = validation_problem(exc, root="<line>")
        raise SampleFormatError(f"{where}: field {field!r}: {problem}; fix the harness's output") from exc


def merge_outcomes(outcomes: Iterable[SampleOutcome]) -> list[SampleOutcome]:
    """Outcomes of one sample (several runs written apart) as one, its runs pooled; first-seen order."""
    merged: dict[str, SampleOutcome] = {}
    for outcome in outcomes:
        seen = merged.get(outcome.id)
        if seen is None:
            merged[outcome.id] = outcome
            continue
        runs = seen.runs + outcome.runs
        merged[outcome.id] = seen.model_copy(update={
            "runs": runs, "correct": (seen.correct_runs + outcome.correct_runs) / runs})
    return list(merged.values())


def parse_sample_lines(lines: Iterable[str], source: str) -> list[SampleOutcome]:
    """The samples of a JSONL text (lines numbered from 1 in errors); one per id, runs pooled."""
    outcomes = []
    for number, line in enumerate(lines, start=1):
        where = f"{source}:{number}"
        if len(line) > MAX_LINE_CHARS:
            raise SampleFormatError(f"{where}: a line of {len(line)} characters; excerpts belong in a sample line, "
                                    "not whole transcripts")
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise SampleFormatError(f"{where}: not a JSON line ({exc}); one JSON object per sample per line") from exc
        outcomes.append(_outcome(raw, where))
    return merge_outcomes(outcomes)


def read_samples_jsonl(path: str | Path) -> list[SampleOutcome]:
    """A per-sample JSONL file; a missing or empty file is an error (the harness wrote nothing)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SampleFormatError(f"{path}: the harness wrote no per-sample file; see its log") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise SampleFormatError(f"{path}: cannot read the per-sample file ({exc})") from exc
    samples = parse_sample_lines(text.splitlines(), str(path))
    if not samples:
        raise SampleFormatError(f"{path}: no sample lines; the harness scored nothing (an empty dataset?)")
    return samples
