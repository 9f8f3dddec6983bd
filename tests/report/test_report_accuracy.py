"""The report of an accuracy session: scores with intervals, samples run, the flipped samples."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_npu.level import CommitsLevel
from bisect_npu.records import CandidateRange, EndRecord, HeaderRecord
from bisect_npu.report import SessionView, StepView, accuracy_view, evidence_summary, render_markdown
from bisect_npu.request import RunRequest


def write_obs(tmp: Path, name: str, samples: list[dict]) -> str:
    (tmp / name).write_text(json.dumps({"case_id": "accuracy", "samples": samples}))
    return name


def acc_step(order: int, index: int, verdict: str, accuracy: float, run: int, obs: list[str]) -> StepView:
    figures = {"accuracy": accuracy, "accuracy_low": accuracy - 8, "accuracy_high": accuracy + 6, "samples_run": run,
               "samples_total": 30, "sample_runs": run, "rounds": 1, "log_likelihood_ratio": 0.0}
    return StepView(order, index, str(index) * 40, "", verdict, "", 1.0, "", 0.0, 1, figures, [], observations=obs)


def test_the_report_shows_scores_samples_run_and_what_flipped_at_the_culprit(tmp_path: Path) -> None:
    right = {"id": "q7", "correct": 1, "prompt": "What is 2+2?", "output": "4", "target": "4"}
    wrong = {"id": "q7", "correct": 0, "prompt": "What is 2+2?", "output": "5 5 5 5", "target": "4",
             "finish_reason": "length"}
    steps = [acc_step(1, 0, "good", 80.0, 30, [write_obs(tmp_path, "g.json", [right])]),
             acc_step(2, 3, "bad", 67.0, 30, [write_obs(tmp_path, "b.json", [wrong])]),
             acc_step(3, 1, "good", 80.0, 6, [write_obs(tmp_path, "c1.json", [right])]),
             acc_step(4, 2, "bad", 66.0, 6, [write_obs(tmp_path, "c2.json", [wrong])])]
    header = HeaderRecord(range=CandidateRange(kind="commits", good="0" * 40, bad="3" * 40, base="0" * 40,
                                               good_ref="good", bad_ref="bad",
                                               candidates=["1" * 40, "2" * 40, "3" * 40]),
                          request=RunRequest.of(good="good", bad="bad"), level=CommitsLevel())
    end = EndRecord(status="found", culprit="2" * 40, index=2,
                    figures={"posterior": 0.995, "culprit_log_lr": 9.2, "parent_log_lr": -8.1, "steps": 4.0})
    view = SessionView(tmp_path, header, steps, end, None, None)
    acc = accuracy_view(view)
    assert acc is not None
    assert acc["sample_runs"] == 72 and acc["full_runs"] == 120
    assert [f["id"] for f in acc["flipped"]] == ["q7"]
    assert acc["flipped"][0]["parent"] == "1" * 40  # the tested commit right below the culprit
    page = render_markdown(view)
    assert "## Bad against good" in page and "| 6 / 30 |" in page and "[72.0, 86.0]" in page and "| 80.0 |" in page
    assert "xychart-beta" in page and "line [72.0, 72.0, 58.0, 59.0]" in page
    assert "**q7** (1.0 -> 0.0 correct, finished `length`): What is 2+2?" in page
    assert "after: 5 5 5 5" in page
    assert evidence_summary(view)[0] == "the culprit: log likelihood ratio +9.2 for the bad side over its steps"


def test_a_flipped_sample_without_texts_shows_no_empty_lines(tmp_path: Path) -> None:
    """A harness that keeps no excerpts (only per-sample correctness): the flipped sample is listed
    with its counts, and no "expected:", "before:" or "after:" line stands empty; a text it does
    keep is shown."""
    right, wrong = {"id": "q1", "correct": 1}, {"id": "q1", "correct": 0, "output": "7"}
    steps = [acc_step(1, 0, "good", 80.0, 30, [write_obs(tmp_path, "g.json", [right])]),
             acc_step(2, 1, "bad", 60.0, 30, [write_obs(tmp_path, "b.json", [wrong])])]
    header = HeaderRecord(range=CandidateRange(kind="commits", good="0" * 40, bad="1" * 40, base="0" * 40,
                                               good_ref="good", bad_ref="bad", candidates=["1" * 40]),
                          request=RunRequest.of(good="good", bad="bad"), level=CommitsLevel())
    view = SessionView(tmp_path, header, steps, EndRecord(status="found", culprit="1" * 40, index=1), None, None)
    page = render_markdown(view)
    assert "**q1** (1.0 -> 0.0 correct)" in page and "  - after: 7" in page
    assert not [line for line in page.splitlines() if line.strip() in ("- expected:", "- before:", "- after:")]
