"""Verify a proposal: cherry-pick it onto the bad end in a throw-away worktree and hand the new commit to
the caller's evaluator, so the proof goes through the normal build, probe and oracle."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Collection
from pathlib import Path

import git

from bisect_npu.builders.base import BuildFailed
from bisect_npu.builders.local import remove_worktree
from bisect_npu.defaults import VERIFY_TOP
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.fix.results import AlreadyApplied, AppliedFix, ApplyConflict, ApplyResult
from bisect_npu.fix_proposals import FixProposal, FixReport, FixStatus, FixVerification
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.upstream.history import git_error_line, is_ancestor, resolve_ref

APPLY_NAME = re.compile(r"apply-[0-9a-f]{10}-[0-9a-f]{8}")  # apply_fix's worktrees


def apply_fix(repo: git.Repo, bad: str, fix_shas: list[str], workdir: Path) -> ApplyResult:
    """Cherry-pick `fix_shas` onto `bad` in a fresh detached worktree under `workdir`.

    The user's checkout is never touched. The new commit stays in the object database (kept alive
    by `refs/bisect-npu/fixes/<sha>`) so the build and execute rooms can treat it like any candidate.
    """
    bad_sha = resolve_ref(repo, bad)
    shas = [resolve_ref(repo, s) for s in fix_shas]
    if not shas:
        raise UsageError("no fix commit to apply; pass at least one sha")
    pending = [s for s in shas if not is_ancestor(repo, s, bad_sha)]
    if not pending:
        return AlreadyApplied(shas, bad_sha)
    workdir.mkdir(parents=True, exist_ok=True)
    tree = workdir / f"apply-{bad_sha[:10]}-{uuid.uuid4().hex[:8]}"
    try:
        repo.git.worktree("add", "--detach", "--quiet", str(tree), bad_sha)
    except git.GitCommandError as exc:
        raise InfrastructureError(f"cannot create a worktree under {workdir}: {git_error_line(exc)}; "
                                  f"check free disk and permissions") from None
    wt = git.Repo(tree)
    identity = _identity_args(repo)
    try:
        for sha in pending:
            conflict = _cherry_pick(wt, sha, identity)
            if conflict is not None:
                return ApplyConflict(shas, conflict)
        head = wt.git.rev_parse("HEAD")
    finally:
        wt.close()
        remove_worktree(repo, tree)
    if head == bad_sha:
        return AlreadyApplied(shas, bad_sha)
    repo.git.update_ref(f"refs/bisect-npu/fixes/{head}", head)
    return AppliedFix(head, bad_sha, shas)


def _cherry_pick(wt: git.Repo, sha: str, identity: list[str]) -> list[str] | None:
    """Apply one commit; None when applied (or already present), else the conflicted files."""
    parents = wt.git.log("-1", "--format=%P", sha).split()
    mainline = ["-m", "1"] if len(parents) > 1 else []
    try:
        wt.git.execute(["git", *identity, "cherry-pick", "-x", "--no-edit", *mainline, sha])
        return None
    except git.GitCommandError:
        conflicted = wt.git.diff("--name-only", "--diff-filter=U").split("\n")
        conflicted = [c for c in conflicted if c]
        if not conflicted and not wt.git.status("--porcelain", "--untracked-files=no").strip():
            wt.git.cherry_pick("--skip")  # empty: the change is already in the bad end
            return None
        wt.git.cherry_pick("--abort")
        return conflicted or ["(cherry-pick failed without conflicting files)"]


def _identity_args(repo: git.Repo) -> list[str]:
    """Committer identity for the cherry-pick: the user's, or a fixed one when git has none."""
    reader = repo.config_reader()
    has = reader.has_option("user", "name") and reader.has_option("user", "email")
    return [] if has else ["-c", "user.name=bisect-npu", "-c", "user.email=bisect-npu@localhost"]


def _pick_shas(repo: git.Repo, proposal: FixProposal, bad_sha: str) -> list[str]:
    """The twin that applies best to the bad end: one made right on top of it, else one on the bad end's
    branch (the back-port, adapted to that branch), else the upstream commit."""
    for sha in proposal.shas:
        parents = repo.git.log("-1", "--format=%P", sha).split()
        if parents and is_ancestor(repo, parents[0], bad_sha):
            return [sha]
    on_branch = [sha for sha in proposal.shas if is_ancestor(repo, bad_sha, sha)]
    return on_branch[:1] or proposal.shas[:1]


def _status_of(verdict: Verdict) -> FixStatus:
    if verdict.kind is VerdictKind.GOOD:
        return "verified"
    # The session's evaluator turns a build failure into a skip whose reason says so.
    if verdict.kind is VerdictKind.SKIP and verdict.reason.startswith("build failed"):
        return "build_failed"
    return "not_verified"


def _detail_of(verdict: Verdict) -> str:
    if verdict.kind is VerdictKind.GOOD:
        return "the bad case passes with the fix applied"
    return f"{verdict.kind.value} with the fix applied: {verdict.reason}"


def verify_fixes(repo: git.Repo, bad: str, report: FixReport, evaluate: Callable[[str], Verdict], *,
                 top: int = VERIFY_TOP, workdir: Path, done: Collection[str] = (),
                 on_result: Callable[[FixVerification], None] | None = None,
                 check_bad: bool = False) -> list[FixVerification]:
    """Walk the ranking: apply each proposal in turn to `bad` and evaluate the new commit, until one
    turns the bad end good or `top` proposals were tried; the verified one first, then the others in
    the order tried (len(result) is how many were tried in this call).

    A wrong proposal ranked above the right one costs one evaluation, not the fix. Proposals whose
    first sha is in ``done`` (tried by an interrupted run, which did not find the fix) are skipped but
    count towards ``top``; ``on_result`` hears of each verification the moment it is made, so a caller
    can keep it. With ``check_bad`` (a bad end not judged before, as in `bisect-npu fix --verify`) the
    bad end itself is evaluated first: a fix "verified" on a commit that never showed the symptom
    proves nothing.
    """
    bad_sha = resolve_ref(repo, bad)
    holders = [report.culprit, *(twin.sha for twin in report.twins)]
    if not any(is_ancestor(repo, sha, bad_sha) for sha in holders):
        raise UsageError(f"{bad} does not contain the culprit {report.culprit[:12]} (nor a cherry-pick of it): "
                         "a fix applied there proves nothing; give as --bad a commit that shows the symptom")
    if check_bad and (baseline := evaluate(bad_sha)).kind is not VerdictKind.BAD:
        raise UsageError(f"--bad {bad} is judged {baseline.kind.value} by this oracle ({baseline.reason}): without "
                         "the symptom there a fix applied to it proves nothing; give a --bad that shows it")
    results: list[FixVerification] = []
    for proposal in report.proposals[:top]:
        if proposal.shas[0] in done:
            continue
        results.append(_verify_one(repo, bad_sha, proposal, evaluate, workdir))
        if on_result is not None:
            on_result(results[-1])
        if results[-1].status == "verified":
            break
    results.sort(key=lambda v: v.status != "verified")
    return results


def _verify_one(repo: git.Repo, bad_sha: str, proposal: FixProposal, evaluate: Callable[[str], Verdict],
                workdir: Path) -> FixVerification:
    applied = apply_fix(repo, bad_sha, _pick_shas(repo, proposal, bad_sha), workdir)
    if isinstance(applied, ApplyConflict):
        return FixVerification(proposal, "conflict", conflict_files=applied.files, detail=applied.message)
    if isinstance(applied, AlreadyApplied):
        return FixVerification(proposal, "already_applied", detail=applied.message)
    try:
        verdict = evaluate(applied.sha)
    except BuildFailed as exc:
        return FixVerification(proposal, "build_failed", applied_sha=applied.sha, detail=str(exc))
    return FixVerification(proposal, _status_of(verdict), verdict, applied.sha, detail=_detail_of(verdict))
