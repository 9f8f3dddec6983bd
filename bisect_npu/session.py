"""A bisection session: ties history, search, evaluation, journal and fix proposal together.

Nothing else lives here: choosing commits is `search`, running them is `evaluate`, judging is
`oracle`, persistence is `journal`, rendering is `report`. The journal is the only state: a
session killed at any moment resumes from it without redoing a finished step or trial.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import math
import os
import re
import shlex
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import git
from pydantic import ValidationError

from bisect_npu import __version__, history, search
from bisect_npu.build.base import Builder
from bisect_npu.evaluate import Evaluator, StepResult, TrialRecord, step_seconds, trial_seconds
from bisect_npu.execute.base import Executor
from bisect_npu.journal import Journal, latest_session, new_session_dir, require_header
from bisect_npu.models import Observation, UsageError, Verdict
from bisect_npu.progress import PlainProgress, Progress
from bisect_npu.recipe import EarlierRunsSpec, InstallPlan, Recipe, load_recipe

DEFAULT_ROOT = Path(".bisect-npu") / "sessions"
EXIT_FOUND, EXIT_NARROWED, EXIT_ENDS_WRONG = 0, 3, 4


@dataclass
class RunOptions:
    """Everything `bisect-npu run` was asked; stored in the journal header so resume needs nothing else."""

    good: str
    bad: str
    repo: str | None = "."
    # Release level: candidates are published versions of this package instead of commits.
    package: str | None = None
    index_url: str | None = None
    prereleases: bool = False
    recipe: str | None = None
    command: list[str] | None = None
    executor: Literal["local", "docker"] = "local"
    devices: list[int] = field(default_factory=list)
    slots: int = 1
    mode: Literal["exact", "noisy"] | None = None
    confidence: float | None = None
    check_ends: bool = True
    timeout_s: float = 3600.0
    propose_fix: bool = True
    verify_fix: bool = False
    fix_top: int = 3
    workdir: str | None = None
    cache_size_gb: float = 200.0
    # --find-fix: the old end shows the symptom and the new end does not; find the first fixed one.
    find_fix: bool = False
    # Build what the next step can need while the current candidate runs (default: with --devices,
    # where runs use the NPUs and builds the CPUs; on a CPU-only host they would compete).
    prefetch: bool | None = None
    # --earlier-runs: ends' runs made before the session, "shown/runs" at the bad end and the good
    # end; the noisy search counts them (overrides the recipe's trials.earlier_runs).
    earlier_runs: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_argv(self) -> list[str]:
        """The `bisect-npu run` arguments that give these options again (the report's reproduce
        line): every option `run` has, where it differs from `run`'s default."""
        valued: list[tuple[str, object]] = [
            ("--package", self.package), ("--repo", self.repo), ("--good", self.good), ("--bad", self.bad),
            ("--index-url", self.index_url), ("--recipe", self.recipe),
            ("--cmd", shlex.join(self.command) if self.command else None),
            ("--executor", self.executor if self.executor != "local" else None),
            ("--devices", ",".join(map(str, self.devices)) or None),
            ("--slots", self.slots if self.slots != max(1, len(self.devices)) else None),
            ("--workdir", self.workdir), ("--mode", self.mode),
            ("--confidence", repr(self.confidence) if self.confidence is not None else None),
            ("--timeout", repr(self.timeout_s) if self.timeout_s != 3600.0 else None),
            ("--cache-size", f"{int(self.cache_size_gb * 2**30)}" if self.cache_size_gb != 200.0 else None),
        ]
        argv = [str(arg) for flag, value in valued if value is not None for arg in (flag, value)]
        if self.earlier_runs:
            argv += ["--earlier-runs", *self.earlier_runs]
        flags = {"--pre": self.prereleases, "--prefetch": self.prefetch is True,
                 "--no-prefetch": self.prefetch is False, "--no-check-ends": not self.check_ends,
                 "--no-fix": not self.propose_fix, "--verify-fix": self.verify_fix, "--find-fix": self.find_fix}
        return argv + [flag for flag, wanted in flags.items() if wanted]

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def _in_units(seconds: list[float], units: list[float]) -> float:
    """Mean `seconds` over the mean seconds of one unit (a trial, a step); 0 until both exist."""
    if not seconds or sum(units) <= 0:
        return 0.0
    return round((sum(seconds) / len(seconds)) / max(sum(units) / len(units), 1e-3), 2)


def told_costs(problem: search.SearchProblem) -> dict[str, float]:
    """What the search weighed its choice by (journaled with each step, shown in the report):
    the costs above 0, in its unit, the number of build groups it knew and how many of them
    had an image when it chose."""
    told = {"load_cost": problem.load_cost, "build_cost": problem.build_cost, "overlay_cost": problem.overlay_cost}
    if problem.build_groups is not None:
        told["build_groups"] = float(len(set(problem.build_groups)))
        told["prebuilt_groups"] = float(len(problem.prebuilt_groups))
    return {name: value for name, value in told.items() if value}


def earlier_runs_spec(options: RunOptions, recipe: Recipe | None) -> EarlierRunsSpec | None:
    """The ends' earlier runs: --earlier-runs, else the recipe's ``trials.earlier_runs``."""
    if not options.earlier_runs:
        return recipe.trials.earlier_runs if recipe else None
    bad_end, good_end = options.earlier_runs
    try:
        return EarlierRunsSpec(bad_end=bad_end, good_end=good_end)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise UsageError(f"--earlier-runs {bad_end} {good_end}: {reason}") from exc


@dataclass(frozen=True)
class SessionResult:
    """How a session ended; `exit_code` follows DESIGN.md (0 culprit, 3 range, 4 precondition)."""

    status: Literal["found", "narrowed", "ends_wrong"]
    exit_code: int
    session_dir: Path
    culprit: str | None = None
    range: tuple[str, str] | None = None
    message: str = ""
    steps: int = 0


class Session:
    """One bisection over a resolved range, driven step by step from the journal."""

    def __init__(self, journal: Journal, options: RunOptions, repo: git.Repo | None, recipe: Recipe | None,
                 evaluator: Evaluator, progress: Progress) -> None:
        self.journal = journal
        self.options = options
        self.repo = repo
        self.recipe = recipe
        self.evaluator = evaluator
        self.progress = progress
        header_range = journal.header["range"]
        self.base: str = header_range["base"]
        self.candidates: list[str] = list(header_range["candidates"])
        self.titles: dict[str, str] = header_range.get("titles", {})
        self._lock = threading.Lock()
        self._told: dict[str, float] = {}  # the costs the search was told for the round being run
        self.earlier_runs = earlier_runs_spec(options, recipe)
        if recipe is not None and recipe.reference.kind == "golden":
            evaluator.reference = load_golden(recipe)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def start(cls, options: RunOptions, session_dir: Path | None = None, root: Path = DEFAULT_ROOT,
              progress: Progress | None = None, builder: Builder | None = None,
              executor: Executor | None = None, parent: Path | None = None) -> Session:
        """Resolve and check everything that can be wrong before the journal is created."""
        if (options.recipe is None) == (options.command is None):
            raise UsageError("give either --recipe FILE or --cmd COMMAND (the oracle for each candidate)")
        recipe = load_recipe(options.recipe) if options.recipe else None
        options.mode = options.mode or (recipe.trials.mode if recipe else "exact")
        earlier_runs = earlier_runs_spec(options, recipe)
        if options.earlier_runs and options.mode != "noisy":
            raise UsageError("--earlier-runs counts only in noisy mode; add --mode noisy (or trials.mode: noisy "
                             "in the recipe), or drop it: exact mode takes one verdict per commit")
        if recipe is not None and options.recipe and Path(options.recipe).exists():
            options.recipe = str(Path(options.recipe).resolve())
        repo = history.open_repo(options.repo) if options.repo else None
        if repo is not None and options.repo and not history.is_url(options.repo):
            options.repo = str(repo.working_tree_dir or repo.git_dir)
        if options.package is None and repo is None:
            raise UsageError("give --repo (a clone of the upstream) or --package (bisect published releases)")
        candidates_range = _resolve_candidates(options, repo)
        if options.command:
            ends = [candidates_range["base"], candidates_range["bad"]] if candidates_range["kind"] == "commits" else []
            _check_command(options.command, repo, ends)
        if repo is not None and options.package is None and options.executor == "docker" and recipe is not None:
            _check_dockerfile(repo, recipe.build.dockerfile, candidates_range)
        if options.devices and options.slots > len(options.devices):
            raise UsageError(f"--slots {options.slots} needs at least as many --devices (got {len(options.devices)}); "
                             "give one card or more per slot")
        if options.workdir:
            from bisect_npu.build.local import check_workdir

            options.workdir = str(Path(options.workdir).resolve())  # resume may start elsewhere
            check_workdir(Path(options.workdir))
        session_dir = (session_dir or new_session_dir(root)).resolve()
        header = {
            "tool_version": __version__,
            "options": options.to_json(),
            "recipe_digest": recipe.digest() if recipe else None,
            "mode": options.mode or (recipe.trials.mode if recipe else "exact"),  # what the search ran in
            "earlier_runs": earlier_runs.model_dump() if earlier_runs else None,
            "range": candidates_range,
            "github": history.github_url(repo) if repo is not None and options.package is None else None,
            "parent_session": str(parent) if parent else None,
        }
        journal = Journal.create(session_dir, header)
        progress = progress or PlainProgress()
        if candidates_range["merge_base_note"]:
            progress.note(candidates_range["merge_base_note"])
        evaluator = _make_evaluator(options, repo, recipe, session_dir, builder, executor)
        return cls(journal, options, repo, recipe, evaluator, progress)

    @classmethod
    def resume(cls, session_dir: Path | None = None, root: Path = DEFAULT_ROOT, progress: Progress | None = None,
               builder: Builder | None = None, executor: Executor | None = None) -> Session:
        session_dir = (session_dir or latest_session(root)).resolve()
        journal = Journal.open(session_dir)
        require_header(journal)
        options = RunOptions.from_json(journal.header["options"])
        recipe = load_recipe(options.recipe) if options.recipe else None
        if recipe is not None and recipe.digest() != journal.header.get("recipe_digest"):
            journal.close()
            raise UsageError(f"recipe {options.recipe} changed since the session started; "
                             "start a new session with `bisect-npu run` (results would mix two bad cases)")
        repo = history.open_repo(options.repo) if options.repo else None
        progress = progress or PlainProgress()
        if journal.dropped_tail:
            progress.note("dropped a torn last journal line (the previous run was killed mid-write)")
        evaluator = _make_evaluator(options, repo, recipe, session_dir, builder, executor)
        return cls(journal, options, repo, recipe, evaluator, progress)

    # -- state from the journal -----------------------------------------------------------------

    @property
    def n(self) -> int:
        return len(self.candidates)

    def commit_at(self, index: int) -> str:
        return self.base if index == 0 else self.candidates[index - 1]

    @property
    def mode(self) -> Literal["exact", "noisy"]:
        if self.options.mode:
            return self.options.mode
        return self.recipe.trials.mode if self.recipe else "exact"

    def problem(self) -> search.SearchProblem:
        confidence = self.options.confidence or (self.recipe.trials.confidence if self.recipe else 0.99)
        earlier = self.earlier_runs.for_search(find_fix=self.options.find_fix) if self.earlier_runs else None
        # Costs in the search's unit, measured from the journal (one read for all three), so a
        # resumed session weighs as the interrupted one did; each only where it is used. Which
        # groups have an image is asked of the builder: those are real, whoever built them.
        noisy, groups = self.mode == "noisy", self.build_groups
        startups, units = trial_seconds(self.journal.entries) if noisy else ([], step_seconds(self.journal.entries))
        builds = self._fresh_build_seconds()
        return search.SearchProblem(n=self.n, mode=self.mode, check_ends=self.options.check_ends,
                                    slots=max(1, self.options.slots), confidence=confidence, earlier_runs=earlier,
                                    load_cost=self._load_cost(startups, units) if noisy else 0.0,
                                    build_cost=self._build_cost(builds, units) if noisy or groups else 0.0,
                                    build_groups=groups, prebuilt_groups=self.prebuilt_groups(),
                                    overlay_cost=self._overlay_cost(builds, units) if groups else 0.0)

    def _load_cost(self, startups: list[float], runs: list[float]) -> float:
        """What an engine start costs, in trials (noisy mode sizes its queries by it): the recipe's
        ``trials.load_cost``, or the mean startup over the mean trial seconds. 0 where trials
        cannot share an engine start (a user command, ``trials.batch: false``)."""
        if self.recipe is None or not self.evaluator.batches:
            return 0.0
        if self.recipe.trials.load_cost != "auto":
            return float(self.recipe.trials.load_cost)
        return _in_units(startups, runs)

    @functools.cached_property
    def build_keys(self) -> list[str] | None:
        """Each position's build key, where the builder shares compiled images between commits
        (a full build for the first commit of a key, an overlay for the others); else None."""
        keys = [self.evaluator.builder.build_key(self.commit_at(i)) for i in range(self.n + 1)]
        if any(key is None for key in keys):
            return None
        return [key for key in keys if key is not None]

    @functools.cached_property
    def build_groups(self) -> tuple[int, ...] | None:
        """``build_keys`` as the search's group ids."""
        return search.group_ids(self.build_keys) if self.build_keys is not None else None

    def prebuilt_groups(self) -> frozenset[int]:
        """The groups whose image the builder holds already (asked at each decision: an earlier
        session's images, and what prefetch has built since)."""
        if self.build_keys is None or self.build_groups is None:
            return frozenset()
        built = self.evaluator.builder.built_keys()
        return frozenset(group for key, group in zip(self.build_keys, self.build_groups, strict=True) if key in built)

    def _build_cost(self, builds: dict[str, list[float]], units: list[float]) -> float:
        """What a full build costs in the search's unit (a trial in noisy mode, a step in exact
        mode), which weighs a commit's information against its build: the recipe's
        ``trials.build_cost``, or the mean seconds of the session's full builds (of every fresh
        build where each commit is its own) over the mean seconds of one unit."""
        setting = self.recipe.trials.build_cost if self.recipe else "auto"
        if setting != "auto":
            return float(setting)
        fresh = builds["built"] if self.build_groups else builds["built"] + builds["overlay"]
        return _in_units(fresh, units)

    def _overlay_cost(self, builds: dict[str, list[float]], units: list[float]) -> float:
        """What an overlay on a built key's image or outputs costs, in the same unit."""
        setting = self.recipe.trials.overlay_cost if self.recipe else "auto"
        if setting != "auto":
            return float(setting)
        return _in_units(builds["overlay"], units)

    def _fresh_build_seconds(self) -> dict[str, list[float]]:
        """Seconds of the session's full builds and overlays, from the journal's steps."""
        seconds: dict[str, list[float]] = {"built": [], "overlay": []}
        for entry in self.journal.entries:
            if entry["type"] != "step":
                continue
            build = entry.get("build") or {}
            if build.get("how") in seconds and build.get("seconds"):
                seconds[build["how"]].append(build["seconds"])
        return seconds

    def _search_term(self, kind: str) -> Literal["good", "bad", "skip"]:
        """The oracle says whether the symptom shows; with --find-fix the search looks for where it
        stops showing, so "symptom" is the old state (good) and "no symptom" the new one (bad)."""
        if self.options.find_fix and kind != "skip":
            return "good" if kind == "bad" else "bad"
        return kind  # type: ignore[return-value]

    def evidence(self) -> dict[int, search.Evidence]:
        evidence: dict[int, search.Evidence] = {}
        for entry in self.journal.entries:
            index = entry.get("index")
            if index is None:
                continue
            current = evidence.get(index, search.Evidence())
            if self.mode == "noisy" and entry["type"] == "trial" and entry.get("outcome"):
                evidence[index] = current.add(self._search_term(entry["outcome"]))
            elif entry["type"] == "step" and (self.mode == "exact" or (entry["verdict"]["kind"] == "skip"
                                              and not entry.get("trials"))):
                evidence[index] = current.add(self._search_term(entry["verdict"]["kind"]))
        return evidence

    def _pending_trials(self, index: int) -> list[TrialRecord]:
        """Trials of `index` journaled after its last finished step: an interrupted step's work."""
        pending: list[TrialRecord] = []
        for entry in self.journal.entries:
            if entry.get("index") != index:
                continue
            if entry["type"] == "trial":
                pending.append(TrialRecord.from_json(entry))
            elif entry["type"] == "step":
                pending = []
        return pending

    def _next_trial(self, index: int) -> int:
        """Trial numbers keep growing per position, so a repeated query never repeats a seed."""
        numbers = [e["trial"] for e in self.journal.entries if e["type"] == "trial" and e.get("index") == index]
        return max(numbers, default=-1) + 1

    def _finished_steps(self) -> list[dict[str, Any]]:
        return [e for e in self.journal.entries if e["type"] == "step"]

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> SessionResult:
        try:
            return self._run()
        finally:
            try:
                self.evaluator.close()
            finally:  # each cleanup runs even when the one before it is interrupted
                try:
                    if self.repo is not None:  # what a killed fix verification left
                        from bisect_npu import fix
                        from bisect_npu.build.local import sweep_worktrees

                        sweep_worktrees(self.repo, self.journal.session_dir / "fix-worktrees", fix.APPLY_NAME)
                finally:
                    self.progress.close()
                    self.journal.close()

    def _run(self) -> SessionResult:
        ended = next((e for e in self.journal.entries if e["type"] == "end"), None)
        if ended is not None:
            level_done = any(e["type"] == "next_level" for e in self.journal.entries)
            if self.options.package and self.repo is not None and ended["status"] == "found" and not level_done:
                return self._commit_level(search.Found(ended["index"]))
            result = self._result_from_end(ended)
            if self._fix_wanted(result) and not self._fix_done():
                self.progress.note("session ended before its fix proposal was done; finishing that")
                self._propose_fix(ended["culprit"])
            else:
                self.progress.note("session already finished; re-rendering the report only")
            return result
        while True:
            problem = self.problem()
            decision = search.decide(problem, self.evidence())
            if not isinstance(decision, search.Next):
                break
            self._told = told_costs(problem)
            self._prefetch_next(problem, decision.queries)
            self._run_queries(decision.queries)
        result = self._finish(decision)
        if result.status != "found" or not result.culprit:
            return result
        if self.options.package:
            return self._commit_level(decision) if self.repo is not None else result
        if self._fix_wanted(result):
            self._propose_fix(result.culprit)
        return result

    def _fix_wanted(self, result: SessionResult) -> bool:
        return (result.status == "found" and bool(result.culprit) and not self.options.package
                and self.options.propose_fix and not self.options.find_fix)

    def _fix_done(self) -> bool:
        kinds = {e["type"] for e in self.journal.entries}
        return "fix_verify" in kinds or ("fix" in kinds and not self.options.verify_fix)

    def _commit_level(self, decision: search.Decision) -> SessionResult:
        """Release level done: map the two adjacent versions to tags and bisect the commits between
        them in a session of their own, like mozregression's switch from nightlies to builds."""
        from bisect_npu import versions

        assert isinstance(decision, search.Found) and self.repo is not None
        older, newer = self.commit_at(decision.index - 1), self.commit_at(decision.index)
        good_tag = versions.tag_for_version(self.repo, older)
        bad_tag = versions.tag_for_version(self.repo, newer)
        self.progress.note(f"release level done: {older} -> {newer}; bisecting commits {good_tag}..{bad_tag}")
        root = self.journal.session_dir / "commit-level"
        if (root / "latest").exists():  # interrupted during the commit level: continue that session
            child = Session.resume(root=root, progress=self.progress)
        else:
            options = dataclasses.replace(self.options, package=None, good=good_tag, bad=bad_tag)
            child = Session.start(options, root=root, progress=self.progress, parent=self.journal.session_dir)
        result = child.run()
        from bisect_npu.report import write_reports

        self._append({"type": "next_level", "session": str(result.session_dir), "status": result.status,
                      "culprit": result.culprit, "message": result.message, "good": good_tag, "bad": bad_tag})
        write_reports(self.journal.session_dir)  # the release level's report, with its commit-level answer
        return result

    def _prefetch_next(self, problem: search.SearchProblem, queries: tuple[search.Query, ...]) -> None:
        """Start building what the search will ask next, whatever verdicts these queries get."""
        from bisect_npu.build.prefetch import Prefetcher, speculative_queries

        builder = self.evaluator.builder
        if isinstance(builder, Prefetcher):
            wanted = speculative_queries(problem, self.evidence(), [q.index for q in queries])
            builder.prefetch([self.commit_at(i) for i in wanted])

    def _prefetch_saved(self) -> float | None:
        from bisect_npu.build.prefetch import Prefetcher

        builder = self.evaluator.builder
        return builder.seconds_saved() if isinstance(builder, Prefetcher) else None

    def _run_queries(self, queries: tuple[search.Query, ...]) -> None:
        ordered = sorted(queries, key=lambda q: q.index != 0)  # the good end first: it is the reference
        if self._needs_reference() and ordered and ordered[0].index == 0:
            self._run_query(ordered.pop(0))
        if len(ordered) <= 1 or self.options.slots <= 1:
            for query in ordered:
                self._run_query(query)
            return
        # Noisy rounds may put several slots on one commit: hand out their trial numbers now, so
        # concurrent queries never share a number (and a seed).
        firsts: list[int] = []
        following: dict[int, int] = {}
        for query in ordered:
            first = following.get(query.index, self._next_trial(query.index))
            firsts.append(first)
            following[query.index] = first + query.trials
        with ThreadPoolExecutor(max_workers=self.options.slots) as pool:
            for future in [pool.submit(self._run_query, q, f) for q, f in zip(ordered, firsts, strict=True)]:
                future.result()

    def _needs_reference(self) -> bool:
        return bool(self.recipe and self.recipe.reference.kind == "good_end")

    def _ensure_reference(self) -> None:
        if not self._needs_reference() or self.evaluator.reference is not None:
            return
        good_steps = [e for e in self._finished_steps() if e["index"] == 0]
        if not good_steps:
            self._run_query(search.Query(0, self.recipe.trials.count if self.recipe else 1))
            good_steps = [e for e in self._finished_steps() if e["index"] == 0]
        records = [TrialRecord.from_json(t) for s in good_steps for t in s.get("trials", [])]
        self.evaluator.set_reference(records)

    def _run_query(self, query: search.Query, first_trial: int | None = None) -> None:
        if query.index != 0:
            self._ensure_reference()
        commit = self.commit_at(query.index)
        left = self._candidates_left()
        self.progress.step_started(query.index, commit, self.titles.get(commit, ""), left,
                                   max(1, math.ceil(math.log2(left + 1))))
        noisy = self.mode == "noisy"
        trials = query.trials if noisy else (self.recipe.trials.count if self.recipe else 1)

        pending = self._pending_trials(query.index) if not noisy else []
        expected = trials * (len(self.recipe.cases) if self.recipe else 1)
        finished = itertools.count(len(pending) + 1)

        def on_trial(record: TrialRecord) -> None:
            self._append({"type": "trial", "index": query.index, "commit": commit, **record.to_json()})
            outcome = record.outcome.value if record.outcome else "run"
            self.progress.trial_finished(query.index, record.trial, outcome, next(finished), expected)

        as_reference = query.index == 0 and self._needs_reference()
        first = self._next_trial(query.index) if first_trial is None else first_trial
        result = self.evaluator.evaluate(commit, trials, pending, on_trial, noisy, first, as_reference)
        self._record_step(query.index, result)

    def _record_step(self, index: int, result: StepResult) -> None:
        self._append({"type": "step", "index": index, "commit": result.commit,
                      "title": self.titles.get(result.commit, ""), "build": result.build,
                      "verdict": result.verdict.model_dump(mode="json"),
                      "trials": [t.to_json() for t in result.trials], "seconds": result.seconds,
                      **({"told": self._told} if self._told else {})})
        self.progress.step_finished(index, result.commit, result.verdict, result.seconds)

    def _append(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.journal.append(record)

    def _candidates_left(self) -> int:
        evidence = self.evidence()
        good = max((i for i, e in evidence.items() if e.good and not e.bad), default=0)
        bad = min((i for i, e in evidence.items() if e.bad and i > good), default=self.n)
        return max(1, bad - good)

    # -- the end --------------------------------------------------------------------------------

    def _finish(self, decision: search.Decision) -> SessionResult:
        steps = len(self._finished_steps())
        if isinstance(decision, search.Found):
            culprit = self.commit_at(decision.index)
            title = self.titles.get(culprit, "")
            message = f"first {'fixed' if self.options.find_fix else 'bad'} commit: {culprit[:12]} {title}"
            end = {"status": "found", "culprit": culprit, "index": decision.index,
                   "confidence": decision.confidence, "figures": decision.figures}
            result = SessionResult("found", EXIT_FOUND, self.journal.session_dir, culprit=culprit,
                                   message=message, steps=steps)
        elif isinstance(decision, search.Narrowed):
            lo, hi = self.commit_at(decision.lo), self.commit_at(decision.hi)
            message = (f"the culprit is one of {decision.hi - decision.lo} commits in ({lo[:12]}, {hi[:12]}]: "
                       "the commits between could not be tested (skipped)")
            end = {"status": "narrowed", "lo": lo, "hi": hi, "lo_index": decision.lo, "hi_index": decision.hi,
                   "figures": decision.figures}
            result = SessionResult("narrowed", EXIT_NARROWED, self.journal.session_dir, range=(lo, hi),
                                   message=message, steps=steps)
        else:
            assert isinstance(decision, search.EndsWrong)
            ref = self.options.good if decision.which == "good" else self.options.bad
            end_index = 0 if decision.which == "good" else self.n
            if self.evidence().get(end_index, search.Evidence()).skipped:
                reason = next((e["verdict"]["reason"] for e in reversed(self._finished_steps())
                               if e["index"] == end_index), "")
                message = (f"precondition failed: the {decision.which} end {ref} could not be tested ({reason}); "
                           "fix the build or the recipe for that commit, or choose another end")
            elif self.options.find_fix:
                state = "does not show the symptom" if decision.which == "good" else "still shows the symptom"
                message = (f"precondition failed: the old end {ref} {state}; with --find-fix the old end must "
                           f"be broken and the new end fixed (or pass --no-check-ends)")
            else:
                opposite = "bad" if decision.which == "good" else "good"
                message = (f"precondition failed: the {decision.which} end {ref} was judged {opposite}; "
                           f"check the recipe reproduces the problem at {self.options.bad} and not at "
                           f"{self.options.good}, or pass --no-check-ends")
            end = {"status": "ends_wrong", "which": decision.which, "figures": decision.figures}
            result = SessionResult("ends_wrong", EXIT_ENDS_WRONG, self.journal.session_dir, message=message,
                                   steps=steps)
        self._append({"type": "end", **end, "message": message, "prefetch_saved_s": self._prefetch_saved()})
        return result

    def _result_from_end(self, end: dict[str, Any]) -> SessionResult:
        steps = len(self._finished_steps())
        status = end["status"]
        code = {"found": EXIT_FOUND, "narrowed": EXIT_NARROWED, "ends_wrong": EXIT_ENDS_WRONG}[status]
        rng = (end["lo"], end["hi"]) if status == "narrowed" else None
        return SessionResult(status, code, self.journal.session_dir, culprit=end.get("culprit"), range=rng,
                             message=end.get("message", ""), steps=steps)

    def _propose_fix(self, culprit: str) -> None:
        """Rank the fixes, then verify the top ones, journaling each verification as it ends: an
        interrupted run's resume ranks again (seconds, the same answer) and verifies only the rest."""
        from bisect_npu import fix

        assert self.repo is not None
        self.progress.note("looking for upstream commits that fix the culprit")
        report = fix.propose_fixes(self.repo, culprit, bad=self.journal.header["range"]["bad"],
                                   symptom=self.recipe.symptom if self.recipe else (), top=max(5, self.options.fix_top))
        if not any(e["type"] == "fix" for e in self.journal.entries):
            self._append({"type": "fix", "report": to_jsonable(report)})
        if not self.options.verify_fix:
            return
        if not report.proposals:
            self._append({"type": "fix_verify", "verifications": []})  # nothing to verify: the stage is done
            return
        kept = [e["verification"] for e in self.journal.entries if e["type"] == "fix_verified"]
        self.progress.note(f"verifying the top {self.options.fix_top} fix proposals on the bad end"
                           + (f" ({len(kept)} verified before the interruption)" if kept else ""))
        fresh = fix.verify_fixes(self.repo, self.journal.header["range"]["bad"], report, self.verdict_of,
                                 top=self.options.fix_top, workdir=self.journal.session_dir / "fix-worktrees",
                                 done={v["proposal"]["shas"][0] for v in kept},
                                 on_result=lambda v: self._append({"type": "fix_verified",
                                                                   "verification": to_jsonable(v)}))
        every = [*kept, *to_jsonable(fresh)]
        every.sort(key=lambda v: v["status"] != "verified")
        self._append({"type": "fix_verify", "verifications": every})

    def verdict_of(self, commit: str) -> Verdict:
        """Evaluate any commit (a fix applied on the bad end) with this session's recipe or command."""
        self._ensure_reference()
        trials = self.recipe.trials.count if self.recipe else 1
        if self.mode == "noisy" and self.recipe is not None:
            return self.evaluator.evaluate(commit, max(trials, 10), [], lambda record: None, judge_each=True).verdict
        return self.evaluator.evaluate(commit, trials, [], lambda record: None, judge_each=False).verdict


def _resolve_candidates(options: RunOptions, repo: git.Repo | None) -> dict[str, Any]:
    """The journal header's `range`: commits of a repository, or published versions of a package."""
    if options.package:
        from bisect_npu import versions

        vrange = versions.resolve_version_range(options.package, options.good, options.bad,
                                                include_prereleases=options.prereleases,
                                                index_url=options.index_url)
        candidates = [*vrange.candidates, vrange.bad]
        titles = {**vrange.titles, vrange.good: f"{options.package} {vrange.good}",
                  vrange.bad: f"{options.package} {vrange.bad}"}
        return {"kind": "versions", "package": options.package, "good": vrange.good, "bad": vrange.bad,
                "base": vrange.good, "good_ref": options.good, "bad_ref": options.bad, "merge_base_note": None,
                "candidates": candidates, "titles": titles, "prs": {}, "groups": vrange.groups}
    assert repo is not None
    brange = history.resolve_range(repo, options.good, options.bad)
    if not brange.candidates:
        raise UsageError(f"nothing to bisect between {options.good} and {options.bad}")
    facts = history.commits_facts(repo, [brange.base, *brange.candidates])
    return {"kind": "commits", "good": brange.good, "bad": brange.bad, "base": brange.base,
            "good_ref": options.good, "bad_ref": options.bad, "merge_base_note": brange.merge_base_note,
            "candidates": list(brange.candidates), "titles": {f.sha: f.title for f in facts},
            "prs": {f.sha: f.pr for f in facts if f.pr}}


def _check_dockerfile(repo: git.Repo, dockerfile: str, candidates_range: dict[str, Any]) -> None:
    """Both ends must hold the Dockerfile the images are built from (a recipe's build.dockerfile),
    or every step would be a skip; say where in the range it first appears."""
    from bisect_npu.build.key import BuildKeyReader

    keys = BuildKeyReader(repo, dockerfile=dockerfile)
    for which, sha in (("good", candidates_range["base"]), ("bad", candidates_range["bad"])):
        if keys.key(sha).has_dockerfile:
            continue
        first = next((c for c in candidates_range["candidates"] if keys.key(c).has_dockerfile), None)
        where = f"it first appears at {first[:12]} in this range" if first else "no commit of this range has it"
        raise UsageError(f"the {which} end {candidates_range[f'{which}_ref']} ({sha[:12]}) has no {dockerfile}, "
                         f"so it cannot be built for that target ({where}); pick ends that have it, or set "
                         "build.dockerfile to one they have")


def load_golden(recipe: Recipe) -> list[Observation]:
    """A golden reference: one observation file, or a directory of them (paths relative to the recipe)."""
    if not recipe.reference.path:
        raise UsageError(f"recipe {recipe.name}: reference.kind golden needs reference.path "
                         "(an observation JSON or a directory of them)")
    path = Path(recipe.reference.path)
    if not path.is_absolute() and recipe.source:
        path = Path(recipe.source).resolve().parent / path
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not all(f.exists() for f in files):
        raise UsageError(f"recipe {recipe.name}: golden reference {path} not found or empty")
    return [Observation.load(f) for f in files]


def to_jsonable(value: Any) -> Any:
    """Dataclasses, pydantic models, enums and paths as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "value") and not isinstance(value, int | float | str | bool):
        return value.value
    return value


# An argument that is only a path (a shell snippet such as `./x.sh && test -f y` is not).
_PLAIN_PATH = re.compile(r"[\w./+@%:=,-]+")


def _check_command(command: list[str], repo: git.Repo | None, ends: list[str]) -> None:
    """A command on PATH must exist now. The command runs in each candidate's checkout, which holds
    only committed files: a relative program, or an argument that names a relative path (`./x`,
    `../x`, or, run from the repository's root, a file there), must be committed at both ends, a
    program executable and not a directory."""
    import shutil

    program = command[0]
    if "/" not in program and shutil.which(program) is None:
        raise UsageError(f"command not found: {program}; give a program on PATH or a path relative to "
                         "the repository root (e.g. ./tests/check.sh)")
    if Path(program).is_absolute() and not Path(program).is_file():
        raise UsageError(f"command not found: {program} is not a file")
    if repo is None:
        return
    at_root = repo.working_tree_dir is not None and Path.cwd().resolve() == Path(repo.working_tree_dir).resolve()
    relative = [arg for i, arg in enumerate(command)
                if _PLAIN_PATH.fullmatch(arg) and not Path(arg).is_absolute()
                and (arg.startswith(("./", "../")) or (i == 0 and "/" in arg)
                     or (i > 0 and at_root and Path(arg).is_file()))]
    for arg in relative:
        for sha in ends:
            entry = _tree_entry(repo.commit(sha).tree, os.path.normpath(arg))
            if entry is None:
                raise UsageError(f"{arg} is not committed at {sha[:12]}: --cmd runs in each candidate's checkout, "
                                 f"which holds only committed files; give an absolute path (e.g. "
                                 f"{Path(arg).resolve()}) or commit it")
            if arg != program or entry == "symlink":
                continue
            if entry.type == "tree":
                raise UsageError(f"{arg} is a directory; give the program to run (e.g. {arg.rstrip('/')}/check.sh)")
            if stat.S_ISREG(entry.mode) and not entry.mode & 0o111:
                raise UsageError(f"{arg} is not executable at {sha[:12]}; run it through its interpreter "
                                 f"(e.g. --cmd \"python3 {arg}\") or commit it with the executable bit")


def _tree_entry(tree: git.Tree, path: str) -> git.Blob | git.Tree | Literal["symlink"] | None:
    """The entry at `path`, "symlink" where a symlink on the way decides it (git does not follow
    them; a checkout does), None when the commit has nothing there."""
    if path in (".", ""):
        return tree
    try:
        return tree / path
    except KeyError:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            try:
                on_the_way = tree / "/".join(parts[:depth])
            except KeyError:
                return None
            if on_the_way.type == "blob" and stat.S_ISLNK(on_the_way.mode):
                return "symlink"
        return None


def session_workdir_name(session_dir: Path) -> str:
    """The session's own subdirectory of a shared --workdir: its name plus a digest of its full
    path, so two sessions named alike (a/s and b/s) never share worktrees."""
    return f"{session_dir.name}-{hashlib.sha256(str(session_dir.resolve()).encode()).hexdigest()[:8]}"


def _make_evaluator(options: RunOptions, repo: git.Repo | None, recipe: Recipe | None, session_dir: Path,
                    builder: Builder | None, executor: Executor | None) -> Evaluator:
    workdir = (Path(options.workdir) / session_workdir_name(session_dir) if options.workdir
               else session_dir / "worktrees")
    if builder is None or executor is None:
        made_builder, made_executor = make_environment(options, repo, recipe, session_dir, workdir)
        builder = builder or made_builder
        executor = executor or made_executor
    if options.prefetch if options.prefetch is not None else bool(options.devices):
        from bisect_npu.build.prefetch import Prefetcher

        builder = Prefetcher(builder, session_dir / "prefetch")
    return Evaluator(builder, executor, session_dir, recipe=recipe, command=options.command,
                     timeout_s=options.timeout_s)


def make_environment(options: RunOptions, repo: git.Repo | None, recipe: Recipe | None, session_dir: Path,
                     workdir: Path) -> tuple[Builder, Executor]:
    """The builder and executor for `--executor local|docker`."""
    env = dict(recipe.environment) if recipe else {}
    if options.package:
        from bisect_npu.build.venv import VenvBuilder, default_venv_cache
        from bisect_npu.execute.local import LocalExecutor

        plan = recipe.install if recipe else InstallPlan()
        return (VenvBuilder(options.package, plan, default_venv_cache(), int(options.cache_size_gb * 2**30)),
                LocalExecutor(env, []))
    assert repo is not None
    if options.executor == "local":
        from bisect_npu.build.local import LocalBuilder
        from bisect_npu.execute.local import LocalExecutor

        build_command = recipe.build.local_command if recipe else []
        python_paths = recipe.build.python_paths if recipe else ["."]
        reuse = recipe.build.reuse_outputs if recipe else True
        return (LocalBuilder(repo, workdir.resolve(), build_command, env,
                             artifacts_dir=session_dir.resolve() / "build-outputs" if reuse else None),
                LocalExecutor(env, python_paths))
    from bisect_npu.build.docker import make_docker_environment

    return make_docker_environment(options, repo, recipe, session_dir)


@contextlib.contextmanager
def make_evaluator(repo_path: str, recipe_path: str | None, command: list[str] | None = None,
                   executor: Literal["local", "docker"] = "local",
                   session_dir: Path | None = None) -> Iterator[Callable[[str], Verdict]]:
    """A commit -> Verdict function outside a bisection (used by `bisect-npu fix --verify`); its
    worktrees, build outputs and containers go when the ``with`` block ends."""
    repo = history.open_repo(repo_path)
    recipe = load_recipe(recipe_path) if recipe_path else None
    options = RunOptions(good="", bad="", repo=repo_path, recipe=recipe_path, command=command, executor=executor)
    session_dir = session_dir or new_session_dir(DEFAULT_ROOT)
    session_dir.mkdir(parents=True, exist_ok=True)
    evaluator = _make_evaluator(options, repo, recipe, session_dir, None, None)

    def evaluate(commit: str) -> Verdict:
        return evaluator.evaluate(commit, recipe.trials.count if recipe else 1, [], lambda r: None, False).verdict

    try:
        yield evaluate
    finally:
        evaluator.close()
