"""Progress lines: a step's trials are reported as they finish (a batch can run for many minutes)."""

from __future__ import annotations

import io

from rich.console import Console

from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.progress import PlainProgress, RichProgress


def test_plain_progress_reports_each_trial_of_a_multi_trial_step() -> None:
    out = io.StringIO()
    progress = PlainProgress(out)
    progress.step_started(22, "a" * 40, "[Core] a change", 8, 3)
    progress.trial_finished(22, 7, "bad", 1, 3)
    progress.trial_finished(22, 8, "good", 2, 3)
    progress.step_started(5, "b" * 40, "[Misc] another", 4, 2)
    progress.trial_finished(5, 0, "run", 1, 1)
    progress.step_finished(5, "b" * 40, Verdict(kind=VerdictKind.GOOD, reason="ok"), 1.5)
    lines = out.getvalue().splitlines()
    assert lines[1].endswith("#22 trial 7: bad (1 of 3)") and lines[2].endswith("#22 trial 8: good (2 of 3)")
    assert len(lines) == 5  # no line for the one-trial step's trial


def test_rich_progress_counts_trials_and_bad_ones_in_the_status_line() -> None:
    progress = RichProgress(Console(file=io.StringIO(), force_terminal=True))
    try:
        progress.step_started(22, "a" * 40, "[Core] a change", 8, 3)
        progress.trial_finished(22, 7, "bad", 1, 3)
        progress.trial_finished(22, 8, "good", 2, 3)
        assert progress.status_line.endswith("trials 2/3, 1 bad")
        progress.step_started(23, "c" * 40, "[Core] next", 4, 2)
        progress.trial_finished(23, 0, "good", 1, 2)
        assert progress.status_line.endswith("trials 1/2, 0 bad")  # counts restart per step
    finally:
        progress.close()


def test_rich_log_lines_do_not_end_with_this_module_s_path(monkeypatch) -> None:
    import sys

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("COLUMNS", "200")
    progress = RichProgress()
    try:
        progress.note("resuming session s")
        progress.step_finished(5, "b" * 40, Verdict(kind=VerdictKind.BAD, reason="exit 1"), 1.5)
    finally:
        progress.close()
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert any(line.rstrip().endswith("resuming session s") for line in lines), lines
    assert any(line.rstrip().endswith("(1.5s) exit 1") for line in lines), lines
    assert "progress.py" not in err.getvalue()
