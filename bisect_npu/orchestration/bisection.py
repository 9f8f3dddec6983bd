"""A bisection through its levels, above `Session`: a session per level, the switch from a found
culprit to the finer level that bisects it (published releases -> the commits between the two
releases' tags, as mozregression goes from nightlies to builds; a merge on the first-parent line ->
the commits it brought in, as git bisect would look inside it), and the fix stage after a culprit
at the last level.

A `Level` says what a found culprit leads to next: a release level leads to commits, a commit
whose change moved a declared dependency's pin to that dependency's own commits with the
upstream held fixed (`dependency_descent`; the finer session is a `DependencyLevel`). What has been
done is read back from each session's journal as its state folded it when it opened (the parent's
`next_level` line, the `fix`, `fix_verified` and `fix_verify` lines of the session that found the
culprit), so a run killed at any point resumes where it was; a finer level's answer is read from
its session's state when it has run, never from its journal again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from bisect_npu import interrupts
from bisect_npu.builders.base import Builder
from bisect_npu.execute.base import Executor
from bisect_npu.execute.inprocess import Oracle
from bisect_npu.journal import DEFAULT_ROOT, LATEST_FILE
from bisect_npu.level import (
    CommitsLevel,
    DependencyLevel,
    HeldUpstream,
    LevelSpec,
    MergeLevel,
    MergeScope,
    ReleasesLevel,
    SettingsLevel,
    held_of,
    scope_of,
)
from bisect_npu.orchestration.ending import end_messages
from bisect_npu.orchestration.ending.result import EXIT_CODES, EXIT_ENDS_WRONG, SessionResult
from bisect_npu.orchestration.opening.environments import fix_worktrees, overlay_release_for, sweep_fix_worktrees
from bisect_npu.orchestration.opening.session_spec import SessionSpec, declared_dependencies, dep_repo_of
from bisect_npu.orchestration.opening.throughput_search import ThroughputSearch
from bisect_npu.orchestration.session import Session
from bisect_npu.progress import Progress
from bisect_npu.records import DependencyMoveRecord, FixRecord, FixVerifiedRecord, FixVerifyRecord, NextLevelRecord
from bisect_npu.request import RangeSpec
from bisect_npu.upstream import history


@dataclass(frozen=True)
class Descent:
    """A culprit handed down to a finer level: that level (`level`) and the ends it bisects
    (`range`, which its session's request keeps: its reproduce line), the directory below the
    session where its session lives, the two ends as the parent journal's `next_level` line names
    them and what the user is told on the way down."""

    level: LevelSpec
    range: RangeSpec
    directory: str
    good: str
    bad: str
    note: str
    merge: str | None = None  # a merge level: the merge whose brought-in commits are bisected
    merged: int = 0  # ... and how many commits it brought in
    # A dependency level: the session to try when this one's good end is not good (the culprit's
    # parent held, with the new pin as the bad end).
    fallback: Descent | None = None

    def spec_below(self, spec: SessionSpec) -> SessionSpec:
        """The finer session's: the same request over this descent's range, at its level."""
        return SessionSpec(spec.request.model_copy(update={"range": self.range}, deep=True), self.level,
                           spec.context.model_copy())


class Level(Protocol):
    """What a kind of level does with its culprit (one handler per `LevelSpec` kind)."""

    # Whether a culprit found at this level gets the fix stage (upstream commits that fix it).
    proposes_fix: bool

    def descent(self, session: Session, found: SessionResult) -> Descent | None:
        """Where the culprit `found` is bisected next; None when this level is the last."""


class Releases:
    """Published versions of a package (`--package`): the culprit release and the one before it
    are mapped to tags of the repository, whose commits between are bisected next, each as an
    overlay on the older release's venv where the repository holds its Python packages."""

    proposes_fix = False

    def descent(self, session: Session, found: SessionResult) -> Descent | None:
        from bisect_npu.upstream import versions

        end = session.ended()
        if session.repo is None or end is None or end.index is None:
            return None  # no repository to descend into: the release is the answer
        older, newer = session.commit_at(end.index - 1), session.commit_at(end.index)
        good_tag = versions.tag_for_version(session.repo, older)
        bad_tag = versions.tag_for_version(session.repo, newer)
        # Its commits run as overlays on the older release's venv where the repository holds the
        # release's Python packages (no build per commit).
        overlay = overlay_release_for(session.spec, session.recipe, session.repo, older, bad_tag,
                                      session.journal.session_dir / "steps" / older[:12])
        commits = RangeSpec(good=good_tag, bad=bad_tag, repo=session.spec.range.repo, overlay_on_release=overlay)
        how = f", each as an overlay on {older}'s venv (no builds)" if overlay else ""
        return Descent(CommitsLevel(overlay_on_release=overlay), commits, "commit-level", good_tag, bad_tag,
                       f"release level done: {older} -> {newer}; bisecting commits {good_tag}..{bad_tag}{how}")


class Commits:
    """Commits of a repository's first-parent line. A culprit that is a merge leads to the commits
    it brought in (unless --first-parent-only): its first parent is the good end, its second
    parent's first-parent line and the merge itself the candidates (`history.merged_line`), and a
    merge among those is descended into again. That is git bisect's answer (the first bad commit
    whose parents are good) reached line by line; the merges' weights (`history.brought_in`) keep
    the steps near git's. A culprit that is not a merge, or is the merge whose commits were
    bisected (each side good alone), goes into a dependency whose pin it moved
    (`dependency_descent`), else to the fix stage."""

    proposes_fix = True

    def descent(self, session: Session, found: SessionResult) -> Descent | None:
        into_merge = None if session.spec.search.first_parent_only else self._into_merge(session, found)
        return into_merge or dependency_descent(session, found)

    @staticmethod
    def _into_merge(session: Session, found: SessionResult) -> Descent | None:
        culprit, scope, repo = found.culprit, scope_of(session.spec.level), session.repo
        if repo is None or culprit is None or (scope is not None and culprit == scope.merges[-1]):
            return None
        parents = history.parents_of(repo, culprit)
        if len(parents) != 2:
            if len(parents) > 2:
                session.progress.note(f"the culprit {culprit[:12]} is an octopus merge of {len(parents)} branches; "
                                      "its merged commits are not bisected (bisect each branch's merge by hand)")
            return None
        header = session.journal.header.range
        goods = [*(scope.goods if scope else []), header.good]
        merged = int(repo.git.rev_list("--count", culprit, "--not", parents[0], *goods, "--"))
        level = MergeLevel(scope=MergeScope(merges=[*(scope.merges if scope else []), culprit], goods=goods,
                                            bad=scope.bad if scope else header.bad),
                           overlay_on_release=session.spec.level.overlay_on_release
                           if isinstance(session.spec.level, CommitsLevel) else None)
        title = header.title_of(culprit)
        return Descent(level, session.spec.range.between(parents[0], culprit), f"merge-{culprit[:12]}", parents[0],
                       culprit, f"the culprit came in through merge {culprit[:12]} {title}; descending into the "
                       f"{merged} commits it brought in", merge=culprit, merged=merged)


class Dependency:
    """Commits of a dependency between the two pins, the upstream held at one commit: the last
    level; its culprit gets the fix stage in the dependency's history."""

    proposes_fix = True

    def descent(self, session: Session, found: SessionResult) -> Descent | None:
        return None


class Settings:
    """The settings at a culprit (`run --settings`): a search of configurations at one commit,
    run after the culprit's fix stage by `Bisection` (orchestration/settings_search.py), never bisected:
    it leads nowhere finer and proposes no fix."""

    proposes_fix = False

    def descent(self, session: Session, found: SessionResult) -> Descent | None:
        return None


# The handler of each kind of level.
HANDLERS: dict[type[LevelSpec], Level] = {
    ReleasesLevel: Releases(), CommitsLevel: Commits(), MergeLevel: Commits(), DependencyLevel: Dependency(),
    SettingsLevel: Settings(),
}


def handler_of(level: LevelSpec) -> Level:
    return HANDLERS[type(level)]


def dependency_descent(session: Session, found: SessionResult) -> Descent | None:
    """When the culprit moved the pin of a declared Python-only dependency (and --no-dependency
    was not given): that dependency's first-parent commits old pin..new pin, the upstream held at
    the culprit, falling back to its parent when the culprit cannot run with the old pin. Every
    pin move found is journaled (`dependency_move`), crossed or not, for the report."""
    from bisect_npu.builders.dependency import open_dependency_clone, read_pin, resolve_pin

    spec, repo, recipe, culprit = session.spec, session.repo, session.recipe, found.culprit
    if held_of(spec.level) is not None or repo is None or culprit is None or spec.search.find_fix:
        return None
    declared = declared_dependencies(spec, recipe)
    parents = repo.commit(culprit).parents if declared else ()
    if not parents:
        return None
    parent = parents[0].hexsha
    dockerfile = recipe.build.dockerfile if recipe else "Dockerfile"
    build_args = recipe.build.docker_args if recipe else {}
    journaled = session.state.moved()
    for dependency in declared:
        old = read_pin(repo, parent, dependency, dockerfile, build_args)
        new = read_pin(repo, culprit, dependency, dockerfile, build_args)
        if old is None or new is None or old == new:
            continue
        name, where = dependency.name, dependency.pin.describe(dockerfile)
        if not dependency.python_only:
            note = (f"the culprit moved {name} {old} -> {new} ({where}); {name} is not Python-only, so its "
                    "commits are not crossed: compare the two versions' changes by hand")
        elif not spec.search.cross_dependencies:
            note = f"the culprit moved {name} {old} -> {new} ({where}); not crossed (--no-dependency)"
        elif spec.executor.executor == "ray":
            note = (f"the culprit moved {name} {old} -> {new} ({where}); not crossed with --executor ray (its "
                    "nodes build the upstream's commits only): run again with --executor local or docker to cross")
        else:
            note = ""
        if name not in journaled:
            session.append(DependencyMoveRecord(name=name, old=old, new=new, where=where, culprit=culprit,
                                                crossed=not note, note=note))
        if note:
            session.progress.note(note)
            continue
        clone = open_dependency_clone(dependency, dep_repo_of(spec, name))
        old_sha = resolve_pin(clone, dependency, old, f"{where} at {parent[:12]}")
        new_sha = resolve_pin(clone, dependency, new, f"{where} at {culprit[:12]}")
        pins = RangeSpec(good=old_sha, bad=new_sha, repo=str(clone.working_tree_dir or clone.git_dir))
        at_culprit, at_parent_level = (DependencyLevel(held=HeldUpstream(
            repo=str(spec.range.repo), commit=commit, dependency=name, old_pin=old, new_pin=new))
            for commit in (culprit, parent))
        at_parent = Descent(at_parent_level, pins, f"dependency-{name}-at-parent", old_sha, new_sha,
                            f"{culprit[:12]} with {name} {old} could not be judged good; holding its parent "
                            f"{parent[:12]} instead, with {name} {new} as the bad end")
        return Descent(at_culprit, pins, f"dependency-{name}", old_sha, new_sha,
                       f"the culprit {culprit[:12]} moved {name} {old} -> {new}; bisecting {name}'s commits "
                       f"{old}..{new} with the upstream held at the culprit (its old pin first: it must show the "
                       "good behaviour)", fallback=at_parent)
    return None


class Bisection:
    """Runs one session's level, then the finer level or the fix stage its culprit leads to, and
    writes the session's reports (each level's session writes its own)."""

    def __init__(self, session: Session, oracle: Oracle | None = None) -> None:
        self.session = session
        self.level = handler_of(session.spec.level)
        self.oracle = oracle  # a Python oracle (bisect_npu.api): finer levels judge with it too

    @classmethod
    def start(cls, spec: SessionSpec, session_dir: Path | None = None, root: Path = DEFAULT_ROOT,
              progress: Progress | None = None, builder: Builder | None = None, executor: Executor | None = None,
              parent: Path | None = None, oracle: Oracle | None = None,
              searching: ThroughputSearch | None = None) -> Bisection:
        return cls(Session.start(spec, session_dir=session_dir, root=root, progress=progress, builder=builder,
                                 executor=executor, parent=parent, oracle=oracle, searching=searching), oracle)

    @classmethod
    def resume(cls, session_dir: Path | None = None, root: Path = DEFAULT_ROOT, progress: Progress | None = None,
               builder: Builder | None = None, executor: Executor | None = None,
               oracle: Oracle | None = None, accept_changed_command: bool = False) -> Bisection:
        return cls(Session.resume(session_dir, root=root, progress=progress, builder=builder, executor=executor,
                                  oracle=oracle, accept_changed_command=accept_changed_command), oracle)

    @property
    def session_dir(self) -> Path:
        return self.session.journal.session_dir

    def run(self) -> SessionResult:
        """The answer of the finest level reached (a resumed finished session: its own answer),
        once this session's reports are written (with the finer level's answer where it has one)."""
        from bisect_npu.report import write_reports

        try:
            result = self._run()
            write_reports(self.session_dir)
            return result
        finally:
            try:
                self.session.close()
            finally:
                sweep_fix_worktrees(self.session.repo, self.session_dir)  # what a killed fix verification left

    def _run(self) -> SessionResult:
        session = self.session
        finished_before = session.ended() is not None
        result = session.bisect()
        interrupts.raise_if_received()
        finer = session.state.finer()
        if finer:  # the finer level is done: its answer (a dependency level's: the chain) is this run's
            session.progress.note("session already finished; re-rendering the report only")
            return self._finer_answer(finer[-1])
        descent = self.level.descent(session, result) if result.status == "found" and result.culprit else None
        if descent is not None:
            return self._descend(descent)
        fix = FixStage(session)
        wanted = self.level.proposes_fix and fix.wanted(result)
        if finished_before:
            if wanted and not fix.done():
                session.progress.note("session ended before its fix proposal was done; finishing that")
            else:
                session.progress.note("session already finished; re-rendering the report only")
                self._search_settings(result)
                return result
        if wanted and result.culprit:
            fix.run(result.culprit)
            interrupts.raise_if_received()
        self._search_settings(result)
        return result

    def _search_settings(self, result: SessionResult) -> None:
        """`--settings`: the settings the culprit of a commit level needs, searched at it in the
        session's `settings/` (an interrupted search continues, a finished one is read back); the
        report's Settings section gives the answer, which leaves the run's own answer as it is."""
        session = self.session
        spec = session.spec
        if (not spec.search.settings or result.status != "found" or result.culprit is None
                or not isinstance(spec.level, CommitsLevel) or session.recipe is None):
            return
        from bisect_npu.orchestration.settings_session import search_at_culprit

        search_at_culprit(session, SettingsLevel(commit=result.culprit, good_set=list(spec.search.settings)))

    def _descend(self, descent: Descent) -> SessionResult:
        """Bisect the finer level in a session of its own below this one (resumed if a killed run
        had started it), then note its answer in this session's journal and report; the answer's
        steps count every level's. A dependency level whose held culprit is not good with the old
        pin tries its fallback (the parent held); when neither gives a clean good/bad pair the
        answer says which combinations ran."""
        session = self.session
        child = self._child(descent)
        ran = [(descent, child)]
        if descent.fallback is not None and child.result.status == "ends_wrong" and _end_wrong(child.session) == "good":
            child = self._child(descent.fallback)
            ran.append((descent.fallback, child))
        result = child.result
        held = held_of(descent.level)
        if held is not None:
            result = _dependency_answer(ran)
        steps = sum(c.result.steps for _, c in ran)
        lo, hi = result.range if result.range else (None, None)
        session.append(NextLevelRecord(session=str(result.session_dir), status=result.status, culprit=result.culprit,
                                       lo=lo, hi=hi, best_guess=result.best_guess,
                                       message=result.message, good=descent.good, bad=descent.bad,
                                       merge=descent.merge, merged=descent.merged, steps=steps,
                                       dependency=held.dependency if held else None))
        return replace(result, steps=steps + len(session.state.journaled_steps()))

    def _child(self, descent: Descent) -> Child:
        """A finer level's session run, with what its state holds once it ran."""
        session = self.session
        session.progress.note(descent.note)
        root = self.session_dir / descent.directory
        if (root / LATEST_FILE).exists():  # interrupted during the finer level: continue that session
            child = Bisection.resume(root=root, progress=session.progress, oracle=self.oracle)
        else:
            child = Bisection.start(descent.spec_below(session.spec), root=root, progress=session.progress,
                                    parent=self.session_dir, oracle=self.oracle,
                                    searching=session.throughput_search)  # the run searches one way
        return Child(child.run(), child.session)

    def _finer_answer(self, finer: NextLevelRecord) -> SessionResult:
        """A finished session's answer is its finest level's, as its `next_level` line keeps it."""
        codes = EXIT_CODES
        status = finer.status if finer.status in codes else "ends_wrong"
        rng = (finer.lo, finer.hi) if finer.lo and finer.hi else None
        return SessionResult(status, codes[status], Path(finer.session), culprit=finer.culprit,  # type: ignore[arg-type]
                             range=rng, best_guess=finer.best_guess, message=finer.message,
                             steps=finer.steps + len(self.session.state.journaled_steps()))


@dataclass(frozen=True)
class Child:
    """A finer level's session once it ran: its answer, and the session whose state the answer's
    sentences read (closed: its journal is not read again)."""

    result: SessionResult
    session: Session


def _end_wrong(session: Session) -> str | None:
    """Which end of a finished session was judged wrong (its `end` record)."""
    end = session.ended()
    return end.which if end is not None else None


def _ends_ran(session: Session, held: HeldUpstream) -> list[str]:
    """What the ends of a dependency-level session were judged, from its steps."""
    steps = [(s.index, s.verdict.kind.value, s.verdict.reason) for s in session.state.journaled_steps()]
    return end_messages.ends_ran(held, session.n, steps)


def _dependency_answer(ran: list[tuple[Descent, Child]]) -> SessionResult:
    """The dependency level's answer as the chain the user reads (`sentences.dependency_found`);
    or, with no clean good/bad pair, which combinations ran and what they showed."""
    descent, last = ran[-1]
    result = last.result
    held = held_of(descent.level)
    assert held is not None
    first = held_of(ran[0][0].level)
    culprit = first.commit if first else held.commit
    if result.status == "ends_wrong":
        combos = [line for d, c in ran if (ran_held := held_of(d.level)) for line in _ends_ran(c.session, ran_held)]
        return replace(result, message=end_messages.dependency_unresolved(held, culprit, combos),
                       exit_code=EXIT_ENDS_WRONG)
    if result.status != "found" or result.culprit is None:
        return replace(result, message=f"{end_messages.dependency_moved(held, culprit)}; {result.message}")
    state, header = last.session.state, last.session.journal.header
    fix = state.fix()
    verified = {v.proposal.shas[0] for v in state.fix_verified() if v.status == "verified"}
    github, pr = header.github, header.range.pr_of(result.culprit)
    return replace(result, message=end_messages.dependency_found(held, culprit, result.message, fix=fix,
                                                                  verified=verified, github=github, pr=pr))


class FixStage:
    """Rank the upstream fixes of a session's culprit, then verify the top ones on its bad end,
    journaling each verification as it ends: an interrupted run's resume ranks again (seconds,
    the same answer) and verifies only the rest."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.spec = session.spec

    def wanted(self, result: SessionResult) -> bool:
        return (result.status == "found" and bool(result.culprit) and self.spec.fix.propose_fix
                and not self.spec.search.find_fix)

    def done(self) -> bool:
        state = self.session.state
        return state.fix_verify() is not None or (state.fix() is not None and not self.spec.fix.verify_fix)

    def run(self, culprit: str) -> None:
        from bisect_npu import fix

        session = self.session
        assert session.repo is not None
        scope = scope_of(self.spec.level)  # a culprit inside a merge: fixes are looked for from the run's bad end
        bad = scope.bad if scope else session.journal.header.range.bad
        session.progress.note("looking for upstream commits that fix the culprit")
        report = fix.propose_fixes(session.repo, culprit, bad=bad,
                                   symptom=session.recipe.symptom if session.recipe else (),
                                   top=max(5, self.spec.fix.fix_top))
        if session.state.fix() is None:
            # A dependency's fix is taken by moving the pin: the first tag holding each proposal.
            tags = {p.shas[0]: tag for p in report.proposals if held_of(self.spec.level)
                    and (tag := history.first_tag_containing(session.repo, p.shas[0]))}
            session.append(FixRecord(report=report, first_tags=tags))
        session.progress.note(end_messages.fix_found(report))
        if not self.spec.fix.verify_fix:
            return
        if not report.proposals:
            session.append(FixVerifyRecord(verifications=[]))  # nothing to verify: the stage is done
            return
        kept = session.state.fix_verified()
        session.progress.note(f"verifying the fix proposals on the bad end, best first, until one works "
                              f"(at most {self.spec.fix.fix_top})"
                              + (f"; {len(kept)} tried before the interruption" if kept else ""))
        # The walk stops at the first verified fix: an interrupted run that had found it is done.
        fresh = [] if any(v.status == "verified" for v in kept) else fix.verify_fixes(
            session.repo, bad, report, session.verdict_of, top=self.spec.fix.fix_top,
            workdir=fix_worktrees(self.session_dir), done={v.proposal.shas[0] for v in kept},
            on_result=lambda v: session.append(FixVerifiedRecord(verification=v)))
        every = sorted([*kept, *fresh], key=lambda v: v.status != "verified")
        session.append(FixVerifyRecord(verifications=every))
        session.progress.note(end_messages.fix_verified(every))

    @property
    def session_dir(self) -> Path:
        return self.session.journal.session_dir
