"""A first build of an environment key resolves as of the commit it serves, not as of today.

A key without a lock (builders/locks.py) resolves what its requirements leave open: resolved today,
a commit of months ago gets packages released after it (a `kernels` that its transformers pin
cannot import). pip (26.0 and later) takes a cut-off, `--uploaded-prior-to`, and considers only
files an index says were uploaded before it: the commit's date is that cut-off, so any key builds
what its commit was tested with. pip applies the cut-off only to indexes that publish upload times
(PEP 700) and never to local files, so a dated build asks only the remote indexes pip is
configured with; a host with none (an offline mirror of files), or whose indexes publish no upload
times, builds afresh, and the report says which way each venv was made.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from pathlib import Path

# The first pip with --uploaded-prior-to.
PIP_WITH_CUTOFF = "pip>=26.0"
PYPI = "https://pypi.org/simple"

# How a venv came to hold its packages (the report's host section): its key's lock, resolved with
# the commit's date as cut-off, or resolved as of the day it was built.
MADE_BY_LOCK = "lock"
MADE_DATED = "dated"
MADE_AFRESH = "afresh"


def cutoff_text(committed: datetime.datetime) -> str:
    """The cut-off pip is given for a commit made at `committed`: that instant in UTC, so every
    host reads it the same (pip takes a time without a zone as the host's local time)."""
    if committed.tzinfo is None:
        raise ValueError("a commit's date has a time zone")
    return committed.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cutoff_args(cutoff: str) -> list[str]:
    """pip's words that leave out every file uploaded at or after `cutoff`."""
    return ["--uploaded-prior-to", cutoff]


def is_local(location: str) -> bool:
    """A `file:` URL or a plain path: files pip reads with no upload time, so no cut-off applies."""
    return location.startswith("file:") or "://" not in location


def dated_indexes(settings: Mapping[str, str], no_links: Path) -> dict[str, str] | None:
    """The environment that makes pip ask only the remote indexes of its configuration
    (`settings`: pip's `index-url`, `extra-index-url`, `find-links`, `no-index`), none of its local
    files (`no_links`: an empty directory that stands in for the configured find-links); None when
    no remote index is left, and a dated build cannot be made here. pip reads these variables over
    its configuration files, and ignores an empty one, hence a repeated index and an empty folder."""
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        return None
    indexes = [settings.get("index-url") or PYPI, *settings.get("extra-index-url", "").split()]
    remote = [index for index in indexes if not is_local(index)]
    if not remote:
        return None
    return {"PIP_INDEX_URL": remote[0], "PIP_EXTRA_INDEX_URL": " ".join(remote[1:] or remote[:1]),
            "PIP_FIND_LINKS": str(no_links)}


def made_text(made: str, cutoff: str | None) -> str:
    """The host section's words for how a venv was made."""
    if made == MADE_DATED and cutoff:
        return f"dated: resolved with nothing uploaded after {cutoff} (its first commit's date)"
    if made == MADE_BY_LOCK:
        return "lock: installed as its key's lock"
    if made == MADE_AFRESH:
        return "afresh: resolved as of the day it was built (no lock, no remote index to date)"
    return "not recorded"
