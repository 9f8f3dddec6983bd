"""The sentences a user reads at the end of a session (kept in the `end` and `next_level` records'
`message`, and a settings search's `settings_end`, printed by `run` and the report): pure functions
of typed records and facts, no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from bisect_npu.fix_proposals import FixReport, FixVerification
from bisect_npu.level import HeldUpstream, MergeScope
from bisect_npu.recipe.settings import Difference, show
from bisect_npu.records import FixRecord
from bisect_npu.settings_journal import ReferenceRecord

SKIPS_SHOWN = 3  # skipped commits a narrowed range's sentence names with their reasons


def found(what: str, culprit: str, title: str, *, find_fix: bool, scope: MergeScope | None) -> str:
    """The culprit (`what`: a release or a commit), and the merges it came in through."""
    message = f"first {'fixed' if find_fix else 'bad'} {what}: {culprit[:12]} {title}"
    if scope is not None:
        message += (" (the merge itself: each side is good without the other)" if culprit == scope.merges[-1]
                    else f" (came in through merge {' -> '.join(m[:12] for m in scope.merges)})")
    return message


def best_guess(lo: str, hi: str, commits: int, guess: str, title: str, *, reached: float, asked: float,
               find_fix: bool) -> str:
    """A search that stopped below the confidence asked on one commit (the commits around it reached
    their steps' cap or were skipped): the range (lo, hi] that holds the confidence, and the commit
    it leaned to, with how sure it is of it."""
    digits = next((d for d in range(4) if round(asked * 100, d) == round(asked * 100, 6)), 4)
    shown = math.floor(round(reached * 100 * 10**digits, 6)) / 10**digits  # never rounded up to the asked
    return (f"the {'fix' if find_fix else 'culprit'} is one of {commits} commits in ({lo[:12]}, {hi[:12]}]: no "
            f"commit reached the {asked * 100:.{digits}f}% asked; the best guess is {guess[:12]} {title} "
            f"({shown:.{digits}f}% sure), the steps around it disagree (the report has each one's evidence): "
            "re-run it and its parent")


def narrowed(lo: str, hi: str, commits: int, *, find_fix: bool, skipped: Sequence[tuple[str, str]] = ()) -> str:
    """The range skips left, with why each commit between could not be tested (`skipped`: its
    sha and its step's reason, e.g. its own build failure): what the user checks by hand. A
    range with no skip in it is one whose commits' own steps disagree with each other (a
    likelihood or levels search's culprit that its parent's own spent steps or runs contradict):
    re-run them."""
    where = f"the {'fix' if find_fix else 'culprit'} is one of {commits} commits in ({lo[:12]}, {hi[:12]}]"
    if not skipped:
        return (f"{where}: the steps in it disagree with each other, a commit's own steps against the answer "
                "the others lean to (the report has each one's evidence): re-run the commits in it")
    why = "; ".join(f"{sha[:12]}: {_first_line(reason)}" for sha, reason in skipped[:SKIPS_SHOWN])
    if len(skipped) > SKIPS_SHOWN:
        why += f"; {len(skipped) - SKIPS_SHOWN} more in the report"
    return f"{where}: the commits between could not be tested ({why})"


def _first_line(reason: str, chars: int = 160) -> str:
    line = reason.strip().splitlines()[0] if reason.strip() else "skipped"
    return line if len(line) <= chars else line[: chars - 1] + "…"


def ends_wrong(which: Literal["good", "bad"], good: str, bad: str, *, find_fix: bool, untested: str | None,
               noisy: bool, figures: dict[str, float], oracle: str, log: Path | None, base: str | None = None,
               judged_why: str = "") -> str:
    """Which end did not behave as given and what to do; `untested`: the reason that end could not
    be tested (None: it was judged), `judged_why`: the reason of its verdict where it was judged (a
    unit test missing there reads as passing: the reason says so), `oracle`: "recipe" or "command",
    `log`: its last run's log,
    `base`: the commit tested for the good end where that end is not an ancestor of the bad one
    (their merge-base): what was judged is named, not the end the user gave."""
    ref = good if which == "good" else bad
    # --find-fix names the ends old (broken) and new (fixed), as the user gave them.
    name = ("old" if which == "good" else "new") if find_fix else which
    subject = f"the {name} end {ref}"
    tested = base[:12] if base is not None else good  # what ran as the good end, whichever end misbehaved
    if which == "good" and base is not None:
        subject = f"the merge-base {base[:12]} of the {name} end {good} and {bad} ({good} is not an ancestor of {bad})"
    if untested is not None:
        message = (f"precondition failed: {subject} could not be tested ({untested}); "
                   f"fix the build or the {oracle} for that commit, or choose another end")
    elif find_fix:
        state = "does not show the symptom" if which == "good" else "still shows the symptom"
        state += f" ({_first_line(judged_why)})" if judged_why.strip() and not noisy else ""
        message = (f"precondition failed: {subject} {state}; with --find-fix the old end must "
                   f"be broken and the new end fixed (or pass --no-check-ends)")
    else:
        opposite = "bad" if which == "good" else "good"
        if not noisy:
            judged = f"was judged {opposite}" + (f" ({_first_line(judged_why)})" if judged_why.strip() else "")
        elif which == "bad" and not figures.get("bad_end_rate"):
            judged = f"never showed the symptom in {figures.get('bad_end_trials', 0):.0f} trials"
        else:
            judged = "showed the symptom about as often as the bad end (the report's evidence has the counts)"
        message = (f"precondition failed: {subject} {judged}; check the {oracle} reproduces the "
                   f"problem at {bad} and not at {tested}, or pass --no-check-ends")
        if which == "good" and base is not None:
            message += f", or give a good end on {bad}'s history"
    return message + (f" (its run's log: {log})" if log else "")


def fix_found(report: FixReport) -> str:
    """What the search for upstream fixes found (the run's last progress line without verification)."""
    return f"upstream fixes of {report.culprit[:12]}: {report.note}"


def fix_verified(verifications: Sequence[FixVerification]) -> str:
    """What verifying the proposals on the bad end showed."""
    verified = next((v for v in verifications if v.status == "verified"), None)
    if verified is not None:
        best = verified.proposal
        return f"verified fix: {best.shas[0][:12]} {best.title} turns the bad end good"
    return f"no proposal among the {len(verifications)} tried turns the bad end good"


def dependency_moved(held: HeldUpstream, culprit: str) -> str:
    return f"{culprit[:12]} moved {held.dependency} {held.old_pin} -> {held.new_pin}"


def dependency_unresolved(held: HeldUpstream, culprit: str, combinations: list[str]) -> str:
    """No clean good/bad pair with the upstream held: which combinations ran and what they showed."""
    return (f"{dependency_moved(held, culprit)}, but no clean good/bad pair holds the upstream fixed: "
            + "; ".join(combinations) + ". The pin move and the upstream's own change cannot be told apart here: "
            f"bisect {held.dependency} {held.old_pin}..{held.new_pin} by hand on an upstream commit that runs on both")


def dependency_found(held: HeldUpstream, culprit: str, found_message: str, *, fix: FixRecord | None,
                     verified: set[str], github: str | None, pr: int | None) -> str:
    """The chain: the upstream commit that moved the pin, the dependency's culprit (`found_message`:
    its level's `found` sentence), and its fix (the later dependency commit and the first tag
    holding it)."""
    message = (f"{dependency_moved(held, culprit)}; first bad {held.dependency} commit: "
               f"{found_message.split(': ', 1)[-1]}")
    if held.commit != culprit:
        message += (f" (bisected on its parent {held.commit[:12]}: {culprit[:12]} could not be judged good with "
                    f"{held.dependency} {held.old_pin})")
    if github and pr:
        message += f" ({github}/pull/{pr})"
    if fix is not None and fix.report.proposals:
        best = fix.report.proposals[0]
        sha = best.shas[0]
        tag = fix.first_tags.get(sha)
        advice = (f"move the pin to >= {tag}, or cherry-pick {sha[:12]}" if tag
                  else f"no tag holds it yet: cherry-pick {sha[:12]}")
        link = best.pr_url or (f"{github}/pull/{best.pr}" if github and best.pr else None)
        checked = " (verified: the bad case passes with it)" if sha in verified else ""
        message += (f"; fixed in {held.dependency} by {sha[:12]} {best.title}{f' ({link})' if link else ''}{checked}: "
                    f"{advice}")
    elif fix is not None:
        message += f"; no later {held.dependency} commit fixes it yet"
    return message


def ends_ran(held: HeldUpstream, last: int, steps: list[tuple[int, str, str]]) -> list[str]:
    """What the ends of a dependency-level session (positions 0 and `last`: the held upstream
    commit with the old and the new pin) were judged, from its steps (position, verdict, reason):
    "abc123 with vllm v0.11.0: skip (import failed)"."""
    ran = []
    for index, kind, reason in steps:
        if index in (0, last):
            pin = held.old_pin if index == 0 else held.new_pin
            ran.append(f"{held.commit[:12]} with {held.dependency} {pin}: {kind}{f' ({reason})' if reason else ''}")
    return ran


def settings_found(commit: str, trigger: list[Difference], others: int, tried: int) -> str:
    """A settings search's trigger at `commit`: each key's bad value and the good one."""
    parts = "; ".join(f"{d.key}: {show(d.bad)} (good with {show(d.good)})" for d in trigger)
    return (f"trigger at {commit[:12]}: {parts}; {others} other difference(s) not needed ({tried} configuration(s) "
            "tried)")


def settings_unresolved(commit: str, trigger: list[Difference], unjudged: list[tuple[str, str]]) -> str:
    """No trigger at `commit`: ddmin ended on `trigger`, but the configurations it rests on
    (`unjudged`: each label and why it could not be judged, its own runs' reason) were skipped."""
    keys = ", ".join(d.key for d in trigger)
    why = "; ".join(f"{label}: {reason}" for label, reason in unjudged)
    return (f"no trigger at {commit[:12]}: it would be {keys}, but configurations it rests on could not be judged "
            f"({why}); judge them by hand, or give a good variant without the keys that keep them from running")


def settings_ends_wrong(which: Literal["good", "bad"], differences: list[Difference], at: str, *, skipped: bool,
                        reference: ReferenceRecord | None, reference_label: str, log_dir: Path) -> str:
    """Which side of a settings search (the good variant, the recipe) did not behave as given at
    `at`, and what to do; `reference`: that side's run at the reference commit where it was not good
    there, `log_dir`: where the configurations' logs are."""
    given = ", ".join(f"{d.key}={show(d.good)}" for d in differences)
    if skipped and reference is not None:
        side = f"the good variant ({given})" if which == "good" else "the recipe"
        return (f"precondition failed: {side} is {reference.verdict.kind.value} at the reference commit "
                f"{reference_label} ({reference.verdict.reason}); give a --reference-at where it passes")
    if skipped:
        side = "the good variant" if which == "good" else "the bad recipe"
        return (f"precondition failed: {side} could not be run at {at}; see its log under {log_dir}, fix the recipe "
                "or the build")
    if which == "good":
        return (f"precondition failed: the good variant ({given}) is also bad at {at}; give a variant that passes "
                "(more keys set back, or another value)")
    return (f"precondition failed: the recipe is not bad at {at}; check that it reproduces the problem there before "
            "searching its settings")
