"""`render_report`: a session's report from its journal, as `bisect-npu report` prints it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal


def render_report(session_dir: str | Path | None = None, fmt: Literal["md", "json"] = "md") -> str:
    """The Markdown (or JSON) report of a commit session or a settings search (default: the
    latest session under .bisect-npu/sessions)."""
    from bisect_npu.journal import DEFAULT_ROOT, latest_session, session_named
    from bisect_npu.report import load_view, render_json, render_markdown
    from bisect_npu.report.settings import settings_json, settings_report_markdown

    if session_dir is not None:
        session_dir = session_named(Path(session_dir))

    if session_dir is not None and (markdown := settings_report_markdown(Path(session_dir))) is not None:
        return markdown if fmt == "md" else json.dumps(settings_json(Path(session_dir)), indent=2, default=str)
    view = load_view(Path(session_dir) if session_dir is not None else latest_session(DEFAULT_ROOT))
    return render_markdown(view) if fmt == "md" else json.dumps(render_json(view), indent=2)
