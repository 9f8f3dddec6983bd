"""A session as its reports see it: the journal read once into steps, the answer and the facts
the probes kept (versions, sampling), with how the session stopped when it has no answer.

Reads only the session directory (never git, never the engine), so a report can be rendered
anywhere the session directory is copied, and it never computes a verdict of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_npu.errors import UsageError
from bisect_npu.fix_proposals import FixReport, FixVerification
from bisect_npu.journal import JOURNAL_FILE, Journal
from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.records import (
    CandidateRange,
    DependencyMoveRecord,
    EndRecord,
    FixRecord,
    FixVerifyRecord,
    HeaderRecord,
    NextLevelRecord,
    NodeBuild,
    Record,
    RetryRecord,
    StepRecord,
    TrialRecord,
    trial_seconds,
)
from bisect_npu.request import RunRequest
from bisect_npu.search.retry_policy import HostRecord


@dataclass
class StepView:
    order: int
    index: int
    commit: str
    title: str
    verdict: str
    reason: str
    seconds: float
    build_how: str
    build_seconds: float
    trials: int
    figures: dict[str, Any]
    logs: list[str]
    pr: int | None = None
    run_env: dict[str, str] = field(default_factory=dict)  # the candidate's own switches its runs got
    # An overlay on a release: the compiled inputs the commit changed since it (its verdict may not hold).
    compiled_changes: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)  # the step's observation files (session-relative)
    retries: list[str] = field(default_factory=list)  # each failed attempt: what the host did wrong
    nodes: list[NodeBuild] = field(default_factory=list)  # --executor ray: what each node ran

    @property
    def nodes_said(self) -> str:
        """The Ray nodes the step ran on, each with its build and the image id its containers started from."""
        return "; ".join(" ".join(filter(None, (f"ray node {node.node[:12]} {node.how}", node.image_said())))
                         for node in self.nodes)


@dataclass
class SessionView:
    """Everything a report shows, derived from the journal alone."""

    session_dir: Path
    header: HeaderRecord
    steps: list[StepView]
    end: EndRecord | None
    fix: FixReport | None
    fix_verify: list[FixVerification] | None
    next_level: NextLevelRecord | None = None
    dependency_moves: list[DependencyMoveRecord] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    engine_starts: dict[str, Any] | None = None
    told: dict[str, float] = field(default_factory=dict)
    venvs: dict[str, str] = field(default_factory=dict)  # a venv's key -> how it got its packages
    host_record: HostRecord = field(default_factory=HostRecord)  # attempts failed on the host, trials that ran
    # What stopped a session without an answer (or one whose finer level has none yet), while nothing
    # was journaled since.
    stop: Stop | None = None

    @property
    def crashed(self) -> str | None:
        """The internal error that stopped the session (a bug), if one did."""
        return self.stop.reason if self.stop is not None and self.stop.status == "crashed" else None

    @property
    def range(self) -> CandidateRange:
        return self.header.range

    @property
    def request(self) -> RunRequest:
        return self.header.request

    @property
    def github(self) -> str | None:
        return self.header.github

    def title_of(self, sha: str) -> str:
        return self.range.title_of(sha)

    def pr_of(self, sha: str) -> int | None:
        return self.range.pr_of(sha)


def load_view(session_dir: Path) -> SessionView:
    if not (session_dir / JOURNAL_FILE).is_file():
        raise UsageError(f"{session_dir} holds no bisect-npu journal; pass --session with a session directory")
    journal = Journal.open(session_dir, read_only=True)
    steps: list[StepView] = []
    end: EndRecord | None = None
    fix: FixReport | None = None
    fix_verify: list[FixVerification] | None = None
    next_level: NextLevelRecord | None = None
    moves: list[DependencyMoveRecord] = []
    view_told: dict[str, float] = {}  # what the search weighed its last choice by
    venvs: dict[str, str] = {}
    failed = ran = 0
    # Trials no step has taken (yet), per position, each with how many steps preceded it.
    open_trials: dict[int, list[tuple[int, int, TrialRecord]]] = {}
    candidates = journal.header.range
    for line, entry in enumerate(journal.entries):
        if isinstance(entry, RetryRecord):
            failed += 1
        if isinstance(entry, TrialRecord):
            ran += entry.outcome != VerdictKind.SKIP
            open_trials.setdefault(entry.index, []).append((len(steps), line, entry))
        elif isinstance(entry, StepRecord):
            kept = {(t.case_id, t.trial) for t in entry.trials}
            open_trials[entry.index] = [(at, line_, t) for at, line_, t in open_trials.get(entry.index, [])
                                        if (t.case_id, t.trial) not in kept]
            verdict, build = entry.verdict, entry.build
            logs = [t.log for t in entry.trials if t.log]
            if build is not None and build.log:
                logs.insert(0, build.log)
            view_told = entry.told or view_told
            if build is not None and build.key and build.venv_made:
                venvs[build.key] = build.venv_made
            steps.append(StepView(len(steps) + 1, entry.index, entry.commit, entry.title, verdict.kind.value,
                                  verdict.reason, entry.seconds, build.how if build else "",
                                  (build.seconds if build else None) or 0.0, verdict.trials, verdict.figures, logs,
                                  candidates.pr_of(entry.commit), dict(build.run_env) if build else {},
                                  list(build.compiled_changes) if build else [],
                                  [t.observation for t in entry.trials if t.observation],
                                  [r.cause for r in entry.retries], list(build.nodes) if build else []))
        elif isinstance(entry, EndRecord):
            end = entry
        elif isinstance(entry, FixRecord):
            fix = entry.report
        elif isinstance(entry, FixVerifyRecord):
            fix_verify = entry.verifications
        elif isinstance(entry, NextLevelRecord):
            next_level = entry
        elif isinstance(entry, DependencyMoveRecord):
            moves.append(entry)
    steps = _with_interrupted_rows(steps, open_trials, candidates, counted=journal.header.mode == "noisy")
    journal.close()
    view = SessionView(session_dir, journal.header, steps, end, fix, fix_verify, next_level, moves)
    view.versions, view.sampling = _engine_facts(session_dir, journal.entries)
    view.engine_starts = engine_starts(journal.entries)
    view.told = view_told
    view.venvs = venvs
    view.host_record = HostRecord(failed, ran)
    view.stop = stop_of(session_dir) if end is None or (next_level is None and _descending(session_dir)) else None
    return view


@dataclass(frozen=True)
class Answer:
    """A session's one answer, the one `run` printed: its finest level's where it descended (the
    commit a merge brought in, the commit between two releases, a dependency's commit: its
    `next_level` line), else its own end. `view` is the session that found it: the titles, facts
    and evidence of its commits."""

    status: str  # found, narrowed, ends_wrong; running, stopped or crashed while a finer level is unfinished
    culprit: str | None
    message: str
    view: SessionView
    finer: bool = False  # a finer level's session found it, not the session reported


def answer_of(view: SessionView) -> Answer | None:
    """The session's answer (`Answer`); None while it has none (running, stopped, crashed)."""
    end, below = view.end, view.next_level
    if below is not None:
        finer = _finer_view(view.session_dir, below.session)
        return Answer(below.status, below.culprit, below.message, finer or view, finer=True)
    if end is None:
        return None
    if _descending(view.session_dir):  # its culprit is being bisected at a finer level: no answer yet
        stop = view.stop
        return Answer(stop.status if stop is not None else "running", None, stop.reason if stop is not None else "",
                      view)
    return Answer(end.status, end.culprit, end.message, view)


def _finer_view(session_dir: Path, recorded: str) -> SessionView | None:
    """The finer level's session a `next_level` line names: where it was, else the same path below
    `session_dir` (the session copied elsewhere); None when neither is readable."""
    parts = Path(recorded).parts
    for place in (Path(recorded), *(session_dir.joinpath(*parts[k:]) for k in range(1, len(parts)))):
        if (place / JOURNAL_FILE).is_file():
            try:
                return load_view(place)
            except UsageError:
                return None
    return None


def _descending(session_dir: Path) -> bool:
    """Whether a finer level's session was started below `session_dir` (`Bisection` makes it in a
    directory of its own, with a `latest` file)."""
    try:
        return any((child / "latest").is_file() for child in session_dir.iterdir() if child.is_dir())
    except OSError:
        return False


CRASH_FILE = "crashed.json"  # written by the CLI when a bug stopped the session (bisect_npu.cli.main)
STOP_FILE = "stopped.json"  # written by the CLI when an error the user can act on stopped it


@dataclass(frozen=True)
class Stop:
    """Why a session without an answer stopped: a bug (`crashed`, exit 1), or an error the user can
    act on (`stopped`: exit 2 for bad input, 5 for the infrastructure, 130 for an interrupt)."""

    status: str
    exit_code: int
    reason: str


def note_crash(session_dir: Path, error: str) -> None:
    """Keep that `error` (a bug) stopped the session, with the journal's size then: a resumed
    session that journals anything more is no longer the crashed one."""
    _note(session_dir / CRASH_FILE, {"error": error, "exit_code": 1})


def note_stop(session_dir: Path, reason: str, exit_code: int) -> None:
    """Keep why an error the user can act on stopped the session (as `note_crash` keeps a bug)."""
    _note(session_dir / STOP_FILE, {"error": reason, "exit_code": exit_code})


def _note(path: Path, fields: dict[str, Any]) -> None:
    journal = path.parent / JOURNAL_FILE
    size = journal.stat().st_size if journal.is_file() else 0
    path.write_text(json.dumps({**fields, "journal_bytes": size}) + "\n")


def crash_of(session_dir: Path) -> str | None:
    """The error that crashed the session, if one did and nothing was journaled since."""
    stop = stop_of(session_dir)
    return stop.reason if stop is not None and stop.status == "crashed" else None


def stop_of(session_dir: Path) -> Stop | None:
    """What stopped the session last, if anything did and nothing was journaled since."""
    try:
        size = (session_dir / JOURNAL_FILE).stat().st_size
    except OSError:
        return None
    notes = []
    for name, status in ((CRASH_FILE, "crashed"), (STOP_FILE, "stopped")):
        try:
            path = session_dir / name
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(note, dict) and note.get("journal_bytes") == size:
            notes.append((path.stat().st_mtime, Stop(status, int(note.get("exit_code", 1)), str(note.get("error")))))
    return max(notes, key=lambda n: n[0])[1] if notes else None


def _with_interrupted_rows(steps: list[StepView], orphans: dict[int, list[tuple[int, int, TrialRecord]]],
                           candidates: CandidateRange, *, counted: bool) -> list[StepView]:
    """Trials of a step that did not finish (an interruption, or a session still running) and that
    no later step took over, as `unfinished` rows where they happened; steps renumbered. Noisy
    mode counts such trials as evidence (`counted`); exact mode judges whole steps only."""
    runs: list[tuple[int, int, int, list[TrialRecord]]] = []  # (steps before, journal line, position, trials)
    for index, cut in orphans.items():
        for at, line, trial in cut:
            if runs and (runs[-1][0], runs[-1][2]) == (at, index):
                runs[-1][3].append(trial)
            else:
                runs.append((at, line, index, [trial]))
    rows = list(steps)
    for at, _, index, trials in sorted(runs, key=lambda run: run[:2], reverse=True):
        commit = trials[0].commit
        bad = sum(1 for t in trials if t.outcome == "bad")
        reason = (f"{len(trials)} trial(s) of a step that did not finish (interrupted, or still running), {bad} "
                  f"bad; {'counted as evidence' if counted else 'not judged: exact mode judges whole steps'}")
        rows.insert(at, StepView(0, index, commit, candidates.title_of(commit), "unfinished", reason,
                                 round(sum(t.seconds for t in trials), 3), "", 0.0, len(trials), {},
                                 [t.log for t in trials if t.log], candidates.pr_of(commit)))
    for order, row in enumerate(rows, 1):
        row.order = order
    return rows


def engine_starts(entries: Sequence[Record]) -> dict[str, Any] | None:
    """How the probe runs went: trials, engine starts (trials of one commit share one when the
    recipe batches), and the mean seconds of a start and of a trial; None without probe trials."""
    starts, runs = trial_seconds(entries)
    if not starts:
        return None
    return {"trials": len(runs), "starts": len(starts), "start_s": round(sum(starts) / len(starts), 1),
            "trial_s": round(sum(runs) / len(runs), 1)}


def _engine_facts(session_dir: Path, entries: Sequence[Record]) -> tuple[dict[str, str], dict[str, Any]]:
    """Versions and effective sampling parameters from the last observation the session kept."""
    for entry in reversed(entries):
        path = entry.observation if isinstance(entry, TrialRecord) else None
        if path and (session_dir / path).exists():
            try:
                obs = Observation.load(session_dir / path)
            except UsageError:
                continue
            return dict(obs.versions), dict(obs.sampling)
    return {}, {}


STORED = "stored"  # a step whose verdict the verdict store had: nothing built or run


def reused_count(steps: list[StepView]) -> int:
    """Steps whose verdict came from the verdict store (earlier sessions judged the commit)."""
    return sum(1 for step in steps if step.build_how == STORED)


def build_counts(steps: list[StepView]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for step in steps:
        if step.build_how and step.build_how != STORED:
            counts[step.build_how] = counts.get(step.build_how, 0) + 1
    return counts


