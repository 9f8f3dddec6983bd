"""Reports from a session's journal: Markdown for a GitHub issue, JSON for CI.

Reads only the journal (never git, never the engine), so a report can be rendered anywhere the
session directory is copied, and it never computes a verdict of its own.
"""

from __future__ import annotations

import json
import platform
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from bisect_npu import __version__
from bisect_npu.contracts import FixReport, FixVerification, Observation, some_branches, to_jsonable
from bisect_npu.errors import UsageError
from bisect_npu.journal import JOURNAL_FILE, Journal
from bisect_npu.level import MergeLevel, held_of, scope_of
from bisect_npu.records import (
    CandidateRange,
    DependencyMoveRecord,
    EndRecord,
    FixRecord,
    FixVerifyRecord,
    HeaderRecord,
    NextLevelRecord,
    Record,
    StepRecord,
    TrialRecord,
    trial_seconds,
)
from bisect_npu.report.nightly import nightly_section
from bisect_npu.report.settings import SETTINGS_DIR, settings_json, settings_markdown
from bisect_npu.request import RunRequest

TEMPLATES = Path(__file__).parent / "templates"
# Figures worth charting, most telling first; the first one that most steps carry is drawn.
CHART_FIGURES = ("loop_rate", "rate", "bad_rate", "loop_tokens", "covered_tokens", "match_rate", "cosine",
                 "min_cosine", "acceptance_rate", "effective", "first_mismatch", "distinct_ratio")


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
    crashed: str | None = None  # the internal error that stopped the session, while nothing was journaled since

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
    # Trials no step has taken (yet), per position, each with how many steps preceded it.
    open_trials: dict[int, list[tuple[int, int, TrialRecord]]] = {}
    candidates = journal.header.range
    for line, entry in enumerate(journal.entries):
        if isinstance(entry, TrialRecord):
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
            steps.append(StepView(len(steps) + 1, entry.index, entry.commit, entry.title, verdict.kind.value,
                                  verdict.reason, entry.seconds, build.how if build else "",
                                  (build.seconds if build else None) or 0.0, verdict.trials, verdict.figures, logs,
                                  candidates.pr_of(entry.commit), dict(build.run_env) if build else {},
                                  list(build.compiled_changes) if build else [],
                                  [t.observation for t in entry.trials if t.observation],
                                  [r.cause for r in entry.retries]))
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
    view.crashed = crash_of(session_dir) if end is None else None
    return view


CRASH_FILE = "crashed.json"  # written by the CLI when a bug stopped the session (bisect_npu.cli.main)


def note_crash(session_dir: Path, error: str) -> None:
    """Keep that `error` (a bug) stopped the session, with the journal's size then: a resumed
    session that journals anything more is no longer the crashed one."""
    journal = session_dir / JOURNAL_FILE
    size = journal.stat().st_size if journal.is_file() else 0
    (session_dir / CRASH_FILE).write_text(json.dumps({"error": error, "journal_bytes": size}) + "\n")


def crash_of(session_dir: Path) -> str | None:
    """The error that crashed the session, if one did and nothing was journaled since."""
    try:
        crash = json.loads((session_dir / CRASH_FILE).read_text())
        size = (session_dir / JOURNAL_FILE).stat().st_size
    except (OSError, ValueError):
        return None
    return str(crash.get("error")) if crash.get("journal_bytes") == size else None


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


def evidence_summary(view: SessionView) -> list[str]:
    """The evidence behind the answer in words (the journal keeps the raw figures): in exact mode
    the steps that bracket the culprit, in noisy mode both commits' trials with 95% intervals and
    the posterior, and for ends judged wrong in noisy mode what each end showed. Noisy figures count
    the search's "bad" runs, which with --find-fix are the runs without the symptom; the words
    always count runs that show it."""
    end = view.end
    if end is None:
        return []
    figures = end.figures
    flipped = view.request.search.find_fix
    if end.status == "ends_wrong" and "good_end_trials" in figures:
        old, new = ("the old end", "the new end") if flipped else ("the good end", "the bad end")
        return [f"{old}: {_symptom_share(figures, 'good_end', flipped)}",
                f"{new}: {_symptom_share(figures, 'bad_end', flipped)}",
                f"P(the two ends differ) = {_percent(figures['change_probability'])}"]
    if end.status != "found":
        return []
    found = "the fix" if flipped else "the culprit"
    if "culprit_trials" in figures:
        parent = _parent_of(view, end)
        more = "less" if flipped else "more"
        after, before = figures["bad_rate_estimate"], figures["good_rate_estimate"]
        if flipped:
            after, before = 1 - after, 1 - before
        return [
            f"{found}: {_symptom_share(figures, 'culprit', flipped)}",
            f"its parent{f' `{parent[:12]}`' if parent else ''}: {_symptom_share(figures, 'parent', flipped)}",
            f"P({found} shows the symptom {more} often than its parent, from their own trials) = "
            f"{_percent(figures['separation'])}",
            f"posterior that this is the first {'fixed' if flipped else 'bad'} "
            f"{'release' if view.range.kind == 'versions' else 'commit'}: "
            f"{_percent(figures['posterior'])} (range-wide estimates: the symptom in {after:.0%} of runs after the "
            f"change, {before:.0%} before; {figures['trials']:.0f} trials in all)",
        ]
    if "culprit_log_lr" in figures:  # likelihood mode (the accuracy oracle): each step weighed by its ratio
        parent = _parent_of(view, end)
        side = "good" if flipped else "bad"
        return [f"{found}: log likelihood ratio {figures['culprit_log_lr']:+.1f} for the {side} side over its steps",
                f"its parent{f' `{parent[:12]}`' if parent else ''}: {figures['parent_log_lr']:+.1f} (0 at an end: "
                "the reference)",
                f"posterior that this is the first {'fixed' if flipped else 'bad'} commit: "
                f"{_percent(figures['posterior'])} after {figures['steps']:.0f} steps"]
    if "posterior" in figures:  # every position capped or skipped: the best guess, with its weight
        return [f"posterior {_percent(figures['posterior'])}: the commits around it reached the trial cap or "
                "were skipped before the answer was sure"]
    at = {s.index: s for s in view.steps if s.verdict in ("good", "bad")}
    culprit_index = end.index if end.index is not None else -1
    culprit, before_step = at.get(culprit_index), at.get(culprit_index - 1)
    lines = []
    # A merge level's ends were judged in the level above (the merge, and its first parent).
    merge_level = isinstance(view.header.level, MergeLevel)
    given = "judged in the level above" if merge_level else "taken as given, not tested (--no-check-ends)"
    if culprit is not None:
        lines.append(f"**{culprit.verdict}** at {found} (step {culprit.order})")
    else:
        lines.append(f"{found} is the {'new' if flipped else 'bad'} end, {given}")
    if before_step is not None:
        lines.append(f"**{before_step.verdict}** at its parent `{before_step.commit[:12]}` (step {before_step.order})")
    elif merge_level and culprit_index == 1:
        lines.append(f"its parent is in the history of the merge's first parent `{view.range.base[:12]}`, {given}")
    elif (parent := _parent_of(view, end)) is not None:
        lines.append(f"its parent `{parent[:12]}` is an end {given}")
    if "tested" in figures:
        what = "releases" if view.range.kind == "versions" else "commits"
        lines.append(f"{figures['tested']:.0f} of {len(view.range.candidates) + 1} {what} tested (the "
                     f"candidates and the {'old' if flipped else 'good'} end)")
    return lines


def host_line(view: SessionView) -> str | None:
    """The NPU host type the session ran on and the recipe fields it changed (310P: float16)."""
    if not view.header.context.host:
        return None
    changes = ", ".join(f"`{name}: {value}`" for name, value in view.header.host_changes.items())
    host = view.header.context.host
    return f"NPU host type: {host}" + (f"; the recipe as this host ran it: {changes}" if changes else "")


# Steps whose runs used an environment this session made (not a failed build, not trials journaled earlier).
_RAN_HERE = ("built", "overlay", "reused")


def switch_lines(steps: list[StepView]) -> list[str]:
    """Each switch the candidates' own source offered (VLLM_BATCH_INVARIANT=1) and in how many steps'
    runs it was on; where only some had it, the steps ran different kernels, and the report says so."""
    ran = [s for s in steps if s.build_how in _RAN_HERE]
    switches = sorted({item for s in ran for item in s.run_env.items()})
    lines = []
    for name, value in switches:
        on = sum(1 for s in ran if s.run_env.get(name) == value)
        line = f"`{name}={value}` (the candidate's own switch) in the runs of {on} of {len(ran)} steps"
        if on < len(ran):
            line += ("; the others' source lacks it and ran other kernels: a culprit where it first appears may be "
                     "the switch, not a regression")
        lines.append(line)
    return lines


def _percent(p: float) -> str:
    """A probability as a percentage that never rounds a doubt away: 0.99965 is ">99.9%", not 100.0%."""
    if 0.999 < p < 1:
        return ">99.9%"
    if 0 < p < 0.001:
        return "<0.1%"
    return f"{p:.1%}"


def _symptom_share(figures: dict[str, float], name: str, flipped: bool) -> str:
    """How many of a commit's trials showed the symptom, with the 95% interval of the share."""
    trials = round(figures[f"{name}_trials"])
    rate, low, high = figures[f"{name}_rate"], figures[f"{name}_rate_lo"], figures[f"{name}_rate_hi"]
    if flipped:  # the figures count runs without the symptom
        rate, low, high = 1 - rate, 1 - high, 1 - low
    return (f"the symptom in {round(rate * trials)} of {trials} trials ({rate:.0%}; 95% interval "
            f"{low:.0%}-{high:.0%})")


def _parent_of(view: SessionView, end: EndRecord) -> str | None:
    """The candidate (or the base) just before the culprit's position."""
    index = end.index
    if index is None or index < 1:
        return None
    return view.range.base if index == 1 else view.range.candidates[index - 2]


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


def chart_series(steps: list[StepView]) -> tuple[str, list[tuple[str, float]]] | None:
    """The oracle figure to chart per tested commit (in history order), or None if none is numeric."""
    steps = [s for s in steps if s.verdict != "unfinished"]  # no figures: they would only dilute the chart
    for name in CHART_FIGURES:
        points = [(s, s.figures.get(name)) for s in steps]
        numeric = [(s, float(v)) for s, v in points if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numeric) >= max(2, len(steps) // 2):
            numeric.sort(key=lambda p: p[0].index)
            return name, [(s.commit[:7], v) for s, v in numeric]
    return None


FLIPPED_SHOWN = 5  # samples listed as "flipped at the culprit"
EXCERPT_CHARS = 240


def _excerpt(text: str | None) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


def _step_samples(view: SessionView, step: StepView) -> dict[str, dict[str, Any]]:
    """A step's per-sample outcomes, its rounds pooled: id -> correct (rate), runs and the first texts."""
    pooled: dict[str, dict[str, Any]] = {}
    for path in step.observations:
        try:
            obs = Observation.load(view.session_dir / path)
        except UsageError:
            continue  # a report shows what it can read; the step's figures still say what was judged
        for sample in obs.samples or []:
            seen = pooled.setdefault(sample.id, {"correct_runs": 0.0, "runs": 0, "prompt": sample.prompt,
                                                 "output": sample.output, "target": sample.target,
                                                 "finish_reason": sample.finish_reason})
            seen["correct_runs"] += sample.correct_runs
            seen["runs"] += sample.runs
    for seen in pooled.values():
        seen["correct"] = seen["correct_runs"] / seen["runs"]
    return pooled


def accuracy_view(view: SessionView) -> dict[str, Any] | None:
    """An accuracy session's figures: each tested commit's score with its interval and the samples it
    ran against the whole set, and the samples that flipped at the culprit (the bad case)."""
    rows = sorted((s for s in view.steps if "accuracy" in s.figures and s.verdict != "unfinished"),
                  key=lambda s: (s.index, s.order))
    if not rows:
        return None
    total = max(int(s.figures.get("samples_total") or 0) for s in rows)
    runs = sum(int(s.figures.get("sample_runs") or 0) for s in rows)
    flipped: list[dict[str, Any]] = []
    end = view.end
    if end is not None and end.status == "found" and end.culprit:
        culprit = [s for s in rows if s.commit == end.culprit]
        below = [s for s in rows if culprit and s.index < culprit[0].index]
        parent = [s for s in below if s.index == max(b.index for b in below)] if below else []
        mine = {k: v for s in culprit for k, v in _step_samples(view, s).items()}
        theirs = {k: v for s in parent for k, v in _step_samples(view, s).items()}
        drops = [(theirs[i]["correct"] - m["correct"], i) for i, m in mine.items()
                 if i in theirs and theirs[i]["correct"] > m["correct"]]
        for _, i in sorted(drops, key=lambda d: -d[0])[:FLIPPED_SHOWN]:
            before, after = theirs[i], mine[i]
            flipped.append({"id": i, "before": round(before["correct"], 3), "after": round(after["correct"], 3),
                            "prompt": _excerpt(before["prompt"] or after["prompt"]),
                            "target": _excerpt(before["target"] or after["target"]),
                            "before_output": _excerpt(before["output"]), "after_output": _excerpt(after["output"]),
                            "after_finish": after["finish_reason"], "parent": parent[0].commit if parent else None})
    return {"rows": rows, "samples_total": total, "sample_runs": runs, "flipped": flipped,
            "metric": "loop_rate" if any("loop_rate" in s.figures for s in rows) else "accuracy",
            "full_runs": total * len(rows)}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.ChainableUndefined)
    env.filters["short"] = lambda sha: (sha or "")[:12]
    env.filters["some_branches"] = some_branches
    env.filters["shell_join"] = shlex.join  # a command as it would be typed again
    env.filters["cell"] = lambda text: str(text).replace("|", "\\|").replace("\n", " ")[:160]
    return env


def render_markdown(view: SessionView) -> str:
    chart = chart_series(view.steps)
    nightly = nightly_section(view)
    tail = _environment().get_template("nightly.md.j2").render(n=nightly, github=view.github) if nightly else ""
    return _main_report(view, chart) + tail  # the nightly-shaped section beside our own, after it


def _main_report(view: SessionView, chart: tuple[str, list[tuple[str, float]]] | None) -> str:
    return _environment().get_template("report.md.j2").render(
        v=view, r=view.range, q=view.request, cx=view.header.context,
        held=held_of(view.header.level), scope=scope_of(view.header.level), end=view.end, chart=chart,
        reproduce=reproduce_command(view), tool_version=__version__,
        host=f"{platform.node()} ({platform.system()} {platform.machine()}, Python {platform.python_version()})",
        build_counts=_build_counts(view.steps), total_seconds=round(sum(s.seconds for s in view.steps), 1),
        reused=reused_count(view.steps),
        evidence=evidence_summary(view), host_line=host_line(view), switches=switch_lines(view.steps),
        settings=settings_markdown(view.session_dir / SETTINGS_DIR, after_commit_search=True),
        accuracy=accuracy_view(view),
    )


def render_json(view: SessionView) -> dict[str, Any]:
    end = view.end
    figures = end.figures if end is not None else None
    return {
        "tool_version": __version__,
        "session": str(view.session_dir),
        "status": end.status if end is not None else "crashed" if view.crashed else "running",
        "culprit": end.culprit if end is not None else None,
        "culprit_title": view.title_of(end.culprit) if end is not None and end.culprit else None,
        "range": [end.lo, end.hi] if end is not None and end.status == "narrowed" else None,
        "message": end.message if end is not None else None,
        "evidence": figures,
        # What the noisy figures' rates count: the search's "bad" runs, clean ones under --find-fix.
        "evidence_counts": (("runs without the symptom" if view.request.search.find_fix else "runs with the symptom")
                            if any(name.endswith("_rate") for name in figures or {}) else None),
        "prefetch_saved_s": end.prefetch_saved_s if end is not None else None,
        "ends_wrong": end.which if end is not None and end.status == "ends_wrong" else None,  # the end judged wrong
        "good": view.range.good, "bad": view.range.bad, "base": view.range.base,
        "good_ref": view.range.good_ref, "bad_ref": view.range.bad_ref,
        "merge_base_note": view.range.merge_base_note,
        "candidates": len(view.range.candidates),
        "steps": [{"index": s.index, "commit": s.commit, "title": s.title, "verdict": s.verdict,
                   "reason": s.reason, "seconds": s.seconds, "build": s.build_how, "trials": s.trials,
                   "figures": s.figures, "run_env": s.run_env, "compiled_changes": s.compiled_changes,
                   "retries": len(s.retries), "host_failures": s.retries}
                  for s in view.steps],
        "host": view.header.context.host, "host_changes": view.header.host_changes,
        "fix": to_jsonable(view.fix), "fix_verify": to_jsonable(view.fix_verify),
        "level": view.range.kind, "package": view.range.package,
        "next_level": view.next_level.model_dump(mode="json") if view.next_level is not None else None,
        "dependency_moves": [move.model_dump(mode="json") for move in view.dependency_moves],
        "parent_session": view.header.parent_session,
        "versions": view.versions, "engine_starts": view.engine_starts, "search_told": view.told,
        "reused_verdicts": reused_count(view.steps), "verdict_store": view.request.store.verdict_store,
        "settings": settings_json(view.session_dir / SETTINGS_DIR),  # a settings search at the culprit
        "nightly": _nightly_json(view),
        "accuracy": _accuracy_json(view),
    }


def _nightly_json(view: SessionView) -> dict[str, Any] | None:
    from dataclasses import asdict


    section = nightly_section(view)
    if section is None:
        return None
    return {**section, "steps": [{**step, "rows": [asdict(row) for row in step["rows"]]} for step in section["steps"]]}


def _accuracy_json(view: SessionView) -> dict[str, Any] | None:
    acc = accuracy_view(view)
    if acc is None:
        return None
    return {**acc, "rows": [{"index": s.index, "commit": s.commit, "verdict": s.verdict,
                             **{k: s.figures.get(k) for k in ("accuracy", "accuracy_low", "accuracy_high",
                                                              "samples_run", "samples_total", "sample_runs",
                                                              "rounds", "log_likelihood_ratio")}}
                            for s in acc["rows"]]}


def reproduce_command(view: SessionView) -> str:
    """The `run` that gives this session again; a dependency level's is its upstream session's
    (it has no `run` line of its own: the held upstream commit comes from that run's culprit)."""
    request = view.request
    parent = Path(view.header.parent_session) if view.header.parent_session else None
    if held_of(view.header.level) is not None and parent is not None and (parent / JOURNAL_FILE).is_file():
        with Journal.open(parent, read_only=True) as journal:
            request = journal.header.request
    argv = request.run_argv()
    if reused_count(view.steps) and "--no-verdict-store" not in argv:
        # Run again on this host, the same line would take the same verdicts from the store: this one runs them.
        if "--verdict-store" in argv:
            at = argv.index("--verdict-store")
            del argv[at:at + 2]
        argv.append("--no-verdict-store")
    return shlex.join(["bisect-npu", "run", *argv])


STORED = "stored"  # a step whose verdict the verdict store had: nothing built or run


def reused_count(steps: list[StepView]) -> int:
    """Steps whose verdict came from the verdict store (earlier sessions judged the commit)."""
    return sum(1 for step in steps if step.build_how == STORED)


def _build_counts(steps: list[StepView]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for step in steps:
        if step.build_how and step.build_how != STORED:
            counts[step.build_how] = counts.get(step.build_how, 0) + 1
    return counts


def report_paths(session_dir: Path) -> tuple[Path, Path]:
    """Where a session's reports are: (markdown, json), beside the journal."""
    return session_dir / "report.md", session_dir / "report.json"


def write_reports(session_dir: Path) -> tuple[Path, Path]:
    """Render both formats next to the journal; returns (markdown path, json path)."""
    view = load_view(session_dir)
    md_path, json_path = report_paths(session_dir)
    md_path.write_text(render_markdown(view), encoding="utf-8")
    json_path.write_text(json.dumps(render_json(view), indent=2), encoding="utf-8")
    return md_path, json_path
