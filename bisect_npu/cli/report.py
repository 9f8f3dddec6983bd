"""`bisect-npu report`: render a session's report from its journal."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click


@click.command()
@click.option("--session", "session_dir", type=click.Path(path_type=Path),
              help="Session directory (default: the latest).")
@click.option("--format", "fmt", type=click.Choice(["md", "json"]), default="md", show_default=True)
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write here instead of stdout.")
def report(session_dir: Path | None, fmt: Literal["md", "json"], output: Path | None) -> None:
    """Render the Markdown (or JSON) report of a session."""
    from bisect_npu import api

    text = api.render_report(session_dir, fmt)
    if output:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise api.UsageError(f"cannot write {output} ({exc.strerror}); pass -o with a path in an "
                                 "existing, writable directory") from None
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text)
