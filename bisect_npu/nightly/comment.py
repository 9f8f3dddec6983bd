"""`/bisect <case> [--good REF] [--bad REF]` in an issue or pull-request comment: parsed without a
shell (the comment reaches the workflow's step through the environment), each word checked
against what a case or a ref may be, so nothing the comment says becomes an option of its own."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from bisect_npu.errors import UsageError

TRIGGER = "/bisect"
_CASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*")  # a case name, or FILE[::CASE[::BENCHMARK]] in the clone
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/~^-]*")  # a tag, branch, sha, HEAD~3; never an option
USAGE = "write `/bisect <case> [--good REF] [--bad REF]`, e.g. `/bisect Qwen3-32B-W8A8-aclgraph-a3 --bad main`"


@dataclass(frozen=True)
class BisectComment:
    case: str
    good: str = "last-good"
    bad: str = "main"


def parse_comment(body: str) -> BisectComment:
    """The first line that starts with /bisect; every word checked (see the module's docstring)."""
    line = next((raw.strip() for raw in body.splitlines() if raw.strip().startswith(TRIGGER)), None)
    if line is None:
        raise UsageError(f"the comment has no {TRIGGER} line; {USAGE}")
    try:
        words = shlex.split(line)[1:]
    except ValueError as exc:
        raise UsageError(f"{TRIGGER}: cannot split the line into words ({exc}); {USAGE}") from None
    case, refs = None, {"--good": "last-good", "--bad": "main"}
    rest = iter(words)
    for word in rest:
        if word in refs:
            value = next(rest, "")
            if not _REF.fullmatch(value) or ".." in value:
                raise UsageError(f"{TRIGGER}: {word} {value!r} is not a ref (a tag, branch or sha); {USAGE}")
            refs[word] = value
        elif case is None and _CASE.fullmatch(word) and ".." not in word:
            case = word
        else:
            raise UsageError(f"{TRIGGER}: unexpected {word!r}; {USAGE}")
    if case is None:
        raise UsageError(f"{TRIGGER}: no case named; {USAGE}")
    return BisectComment(case, refs["--good"], refs["--bad"])
