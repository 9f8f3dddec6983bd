"""`fix`: rank the upstream commits that fix a culprit and, with `verify`, prove one on the bad
end; what `bisect-npu fix` prints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bisect_npu.defaults import VERIFY_TOP
from bisect_npu.errors import UsageError

if TYPE_CHECKING:
    from bisect_npu.fix import FixProposal, FixReport, FixVerification


@dataclass(frozen=True)
class Fixes:
    """The ranked proposals and, with `verify`, the verification of those tried (best first)."""

    report: FixReport
    verifications: list[FixVerification]

    def ordered(self) -> list[FixProposal]:
        """The proposals tried first, in the order they were tried, then the others by rank."""
        tried = {tuple(v.proposal.shas) for v in self.verifications}
        return [v.proposal for v in self.verifications] + [p for p in self.report.proposals
                                                            if tuple(p.shas) not in tried]

    def rows(self) -> list[list[str]]:
        """One row per proposal: rank, sha(s), branches, confidence, score, PR, title and, with
        verifications, how its verification went."""
        from bisect_npu.fix_proposals import some_branches

        status = {tuple(v.proposal.shas): v for v in self.verifications}
        rows = []
        for rank, proposal in enumerate(self.ordered(), 1):
            row = [str(rank), " ".join(s[:10] for s in proposal.shas), some_branches(proposal.branches),
                   f"{proposal.confidence:.0%}", f"{proposal.score:g}",
                   proposal.pr_url or (f"#{proposal.pr}" if proposal.pr else "-"), proposal.title]
            if self.verifications:
                checked = status.get(tuple(proposal.shas))
                row.append(f"{checked.status}: {checked.detail}" if checked else "not tried")
            rows.append(row)
        return rows

    def reasons(self) -> list[str]:
        """Each proposal's evidence, a reviewer's lines: its reasons, its twins, where it is missing."""
        from bisect_npu.fix_proposals import some_branches

        lines = []
        for rank, proposal in enumerate(self.ordered(), 1):
            lines.append(f"{rank}. {proposal.shas[0][:10]} {proposal.title}")
            lines += [f"   {reason.weight:+g} {reason.signal}: {reason.detail}" for reason in proposal.reasons]
            lines += [f"   {line}" for line in proposal.also_on]
            if proposal.missing_on:
                lines.append(f"   not yet on: {some_branches(proposal.missing_on)}")
        return lines

    def to_json(self) -> dict[str, Any]:
        """The same shapes as a session's journal (`fix` and `fix_verify` lines) and its JSON report."""
        from bisect_npu.observations import to_jsonable

        data: dict[str, Any] = {**to_jsonable(self.report), "verifications": to_jsonable(self.verifications)}
        if self.report.dependency is not None:
            data["dependency"]["message"] = self.report.dependency.message
        return data


def fix(repo: str | Path, culprit: str, *, bad: str | None = None, top: int = 5, recipe: str | Path | None = None,
        keywords: tuple[str, ...] | list[str] = (), command: str | None = None, verify: bool = False,
        verify_top: int = VERIFY_TOP, executor: Literal["local", "docker"] = "local",
        devices: str | None = None) -> Fixes:
    """Rank the later commits that fix `culprit` (the recipe's symptom keywords and `keywords`
    weigh in); with `verify`, apply them to `bad`, best first, re-running the recipe's bad case (or
    `command`, split as `--cmd` splits it) on `executor` and `devices` (as `run --devices`) until
    one works, trying `verify_top` at most."""
    from bisect_npu.execute.ascend import parse_devices
    from bisect_npu.fix import propose_fixes, verify_fixes
    from bisect_npu.orchestration.opening.preflight import command_words
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.upstream.history import open_repo

    loaded = load_recipe(recipe) if recipe else None
    argv = command_words(command) if command else None
    cards = parse_devices(devices) if devices is not None else []
    if verify and ((loaded is None and not argv) or bad is None):
        raise UsageError("--verify needs --recipe or --cmd (the bad case to re-run) and --bad "
                         "(where to apply the fix)")
    if verify and loaded is not None and loaded.accuracy is not None:
        raise UsageError(f"--verify with the accuracy recipe {recipe}: a fixed commit is judged by pairing its "
                         "samples with the good and the bad end's, which `fix` alone has not run; verify it with "
                         "`run --verify-fix` (after the commit search, both ends scored), or with --cmd")
    clone = open_repo(str(repo))
    report = propose_fixes(clone, culprit, bad=bad, symptom=[*(loaded.symptom if loaded else []), *keywords],
                           top=max(top, verify_top if verify else 0))
    verifications: list[FixVerification] = []
    if verify and bad is not None:
        from bisect_npu.orchestration.opening.environments import fix_verifier

        with fix_verifier(str(repo), None if argv else str(recipe), command=argv, executor=executor,
                          devices=cards) as (evaluate, fixes):
            verifications = verify_fixes(clone, bad, report, evaluate, top=verify_top, workdir=fixes, check_bad=True)
    return Fixes(report, verifications)
