"""The steps of the GitHub Actions composite action (action.yml), as `bisect-npu ci` runs them:
each takes the step's environment (`os.environ` there), whose files receive the outputs and the
job summary."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bisect_npu.ci import BisectInputs


def ci_bisect(inputs: BisectInputs, environ: Mapping[str, str], session: str | None = None) -> int:
    """Bisect, or resume the session of a retried job (GITHUB_RUN_ATTEMPT > 1); report to the job
    summary, answer to the step's outputs. Returns the step's exit code: 0 for an answer (or no
    regression since last-good)."""
    from bisect_npu.ci import Actions, bisect_step

    return bisect_step(inputs, Actions.from_environ(environ), session)


def ci_issue(report_json: str | Path, repository: str, environ: Mapping[str, str],
             label: str = "bisect-npu-regression") -> dict[str, str]:
    """Open the culprit's issue in `repository` (owner/name), or comment on the one already filed
    for it (found by its marker); returns the outputs set (`issue-action`, `issue`)."""
    from bisect_npu.ci import Actions, IssueInputs, issue_step

    with tempfile.TemporaryDirectory(prefix="bisect-npu-issue-") as workdir:
        return issue_step(IssueInputs(Path(report_json), repository, label), Actions.from_environ(environ),
                          Path(workdir))


@dataclass(frozen=True)
class BisectComment:
    """A `/bisect` comment read: the ends, the nightly case it names (as found at the bad end) and
    the `bisect-npu run` options for the action's `args`."""

    good: str
    bad: str
    case: str
    args: list[str]


def ci_comment(body: str, environ: Mapping[str, str], *, repo: str | Path = ".", good_table: str = "",
               soc: str = "") -> BisectComment:
    """Parse a `/bisect <case> [--good REF] [--bad REF]` comment, look its case up in `repo` at the
    bad ref, and set the step outputs `good`, `bad`, `case` and `args`; `good_table` (the
    runner's nightly good_table.csv, with its `soc`) answers `--good last-good`."""
    import shlex

    from bisect_npu.ci import Actions
    from bisect_npu.nightly.at_commit import locate_case
    from bisect_npu.nightly.comment import parse_comment
    from bisect_npu.upstream import history

    asked = parse_comment(body)
    clone = history.open_repo(str(repo))
    case = locate_case(clone, history.resolve_ref(clone, asked.bad), asked.case)
    args = ["--nightly-case", case]
    if good_table and asked.good == "last-good":
        args += ["--good-table", good_table, *(["--soc", soc] if soc else [])]
    Actions.from_environ(environ).set_outputs({"good": asked.good, "bad": asked.bad, "case": case,
                                               "args": shlex.join(args)})
    return BisectComment(asked.good, asked.bad, case, args)
