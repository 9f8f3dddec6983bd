"""The `bisect-npu run` line another person runs to get the session again: the commits it bisected
(a branch named at the start has moved on since), no path of this machine in it (the repository is
its GitHub URL or UPSTREAM, a file its name, with a recipe file's text attached) and none of this
host's own stores."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from bisect_npu.journal import JOURNAL_FILE, Journal
from bisect_npu.level import held_of
from bisect_npu.recipe.loader import bundled_recipes
from bisect_npu.report.view import SessionView

UPSTREAM = "UPSTREAM"  # stands for the reader's clone where the session's repository has no known URL
# This host's own places and stores: another person's run has its own.
DROPPED = {"--workdir": 1, "--verdict-store": 1, "--no-verdict-store": 0, "--cache-size-gb": 1}


@dataclass(frozen=True)
class Reproduce:
    command: str
    recipe_file: str | None = None  # the recipe file the command names, by name
    recipe_text: str | None = None  # its text, attached to the report
    upstream_placeholder: bool = False  # the command says UPSTREAM for the repository


def reproduce(view: SessionView) -> Reproduce:
    """The run line for another host; a dependency level's is its upstream session's (it has no
    `run` line of its own: the held upstream commit comes from that run's culprit)."""
    request, github, bisected = view.request, view.github, view.range
    parent = Path(view.header.parent_session) if view.header.parent_session else None
    if held_of(view.header.level) is not None and parent is not None and (parent / JOURNAL_FILE).is_file():
        with Journal.open(parent, read_only=True) as journal:
            request, github, bisected = journal.header.request, journal.header.github, journal.header.range
    if bisected.kind == "commits":  # the commits bisected, not refs that may have moved since (a branch)
        request = request.model_copy(update={"range": request.range.model_copy(
            update={"good": bisected.good, "bad": bisected.bad})})
    argv = request.run_argv()
    out: list[str] = []
    recipe_file = recipe_text = None
    placeholder = False
    skip = 0
    for at, word in enumerate(argv):
        if skip:
            skip -= 1
            continue
        if word in DROPPED:
            skip = DROPPED[word]
            continue
        value = argv[at + 1] if at + 1 < len(argv) else None
        if word == "--repo" and value is not None:
            placeholder = not (github or _is_url(value))
            out += [word, value if _is_url(value) else github or UPSTREAM]
            skip = 1
        elif word == "--recipe" and request.judge.nightly_case:
            skip = 1  # made from the nightly case at each commit: the case is what the reader runs
        elif word == "--recipe" and value is not None and value not in bundled_recipes():
            recipe_file = Path(value).name
            out += [word, recipe_file]
            recipe_text = _read(value)
            skip = 1
        else:
            out.append(portable(word))
    return Reproduce(shlex.join(["bisect-npu", "run", *out]), recipe_file, recipe_text, placeholder)


def _is_url(value: str) -> bool:
    return "://" in value or value.startswith("git@")


def portable(word: str) -> str:
    """An argument without this machine's directories: an absolute path (also as NAME=PATH, or
    FILE::CASE) becomes its last part, which the reader has beside them."""
    name, eq, value = word.partition("=") if not word.startswith("-") else ("", "", word)
    target = value if eq else word
    if not target.startswith(("/", "~")):
        return word
    path, sep, rest = target.partition("::")
    short = Path(path).name + sep + rest
    return f"{name}={short}" if eq else short


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
