"""Reports from a session's journal: Markdown for a GitHub issue, JSON for CI.

`view` reads the session; `case`, `outputs`, `culprit`, `host`, `reproduce`, `evidence` and
`accuracy` each make one section of what a maintainer reads; `render` puts them in order.
"""

from __future__ import annotations

from bisect_npu.report.accuracy import accuracy_view, chart_series
from bisect_npu.report.evidence import evidence_summary, host_line, switch_lines
from bisect_npu.report.render import render_json, render_markdown, report_paths, session_status, write_reports
from bisect_npu.report.view import (
    SessionView,
    StepView,
    Stop,
    crash_of,
    load_view,
    note_crash,
    note_stop,
    reused_count,
    stop_of,
)

__all__ = ["SessionView", "StepView", "Stop", "accuracy_view", "chart_series", "crash_of", "evidence_summary",
           "host_line", "load_view", "note_crash", "note_stop", "render_json", "render_markdown", "report_paths",
           "reused_count", "session_status", "stop_of", "switch_lines", "write_reports"]
