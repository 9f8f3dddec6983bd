"""How a session ended, as its caller gets it, and the exit codes docs/reference/exit-codes.md
gives (by `EndRecord.status`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

EXIT_FOUND, EXIT_NARROWED, EXIT_ENDS_WRONG = 0, 3, 4
EXIT_CODES = {"found": EXIT_FOUND, "narrowed": EXIT_NARROWED, "ends_wrong": EXIT_ENDS_WRONG}


@dataclass(frozen=True)
class SessionResult:
    """How a session ended; `exit_code` as docs/reference/exit-codes.md gives it (0, 3 or 4)."""

    status: Literal["found", "narrowed", "ends_wrong"]
    exit_code: int
    session_dir: Path
    culprit: str | None = None
    range: tuple[str, str] | None = None
    best_guess: str | None = None  # narrowed below the confidence asked: the commit the search leaned to
    message: str = ""
    steps: int = 0
    output_tail: str = ""  # ends judged wrong: the last lines of that end's last run (its log is in `message`)
