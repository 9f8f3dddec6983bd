"""`bisect-npu report`: render a session's report from its journal."""

from __future__ import annotations

import json
from pathlib import Path

import click

from bisect_npu.errors import UsageError


@click.command()
@click.option("--session", "session_dir", type=click.Path(path_type=Path),
              help="Session directory (default: the latest).")
@click.option("--format", "fmt", type=click.Choice(["md", "json"]), default="md", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here instead of stdout.")
def report(session_dir: Path | None, fmt: str, output: Path | None) -> None:
    """Render the Markdown (or JSON) report of a session."""
    from bisect_npu.journal import DEFAULT_ROOT, latest_session
    from bisect_npu.report import load_view, render_json, render_markdown
    from bisect_npu.report.settings import settings_json, settings_report_markdown

    if session_dir is not None and (markdown := settings_report_markdown(session_dir)) is not None:
        text = markdown if fmt == "md" else json.dumps(settings_json(session_dir), indent=2, default=str)
    else:
        view = load_view(session_dir or latest_session(DEFAULT_ROOT))
        text = render_markdown(view) if fmt == "md" else json.dumps(render_json(view), indent=2)
    if output:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {output} ({exc.strerror}); pass -o with a path in an existing, "
                             "writable directory") from None
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)
