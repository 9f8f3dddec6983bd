"""What a search step costs, measured from a session's journal: an engine start, a full build and
an overlay, each in the search's unit (a trial in noisy mode; a step otherwise, in exact mode and
in the likelihood search, whose steps are one verdict each). The seconds are kept as the journal's
records are folded (`state.MeasuredSeconds`), so a resumed session weighs its choices as the
interrupted one did, without reading its journal again."""

from __future__ import annotations

from bisect_npu import search
from bisect_npu.orchestration.opening.state import MeasuredSeconds
from bisect_npu.recipe.schema import TrialsSpec


def measured_costs(seconds: MeasuredSeconds, trials: TrialsSpec | None, *, noisy: bool, batches: bool,
                   grouped: bool, levels: bool = False) -> tuple[float, float, float]:
    """The load, build and overlay costs a search is told (`noisy`: in trials; else in steps, the
    likelihood and levels searches' too), each only where it is used: an engine start in noisy
    mode, a full build in noisy and levels mode (``levels``: both ask a commit again, so each run
    weighs a new commit's build against one more run of a built one) or where builds are grouped
    by key (``grouped``), an overlay where they are grouped. `trials` is the recipe's settings
    (None for a user command), `batches` whether a case's trials at one commit share an engine
    start."""
    startups, units = (seconds.startups, seconds.trial_runs) if noisy else ([], seconds.step_runs)
    builds = seconds.builds
    return (_load_cost(trials, batches, startups, units) if noisy else 0.0,
            _build_cost(trials, builds, units, grouped) if noisy or levels or grouped else 0.0,
            _overlay_cost(trials, builds, units) if grouped else 0.0)


def _in_units(seconds: list[float], units: list[float]) -> float:
    """Mean `seconds` over the mean seconds of one unit (a trial, a step); 0 until both exist."""
    if not seconds or sum(units) <= 0:
        return 0.0
    return round((sum(seconds) / len(seconds)) / max(sum(units) / len(units), 1e-3), 2)


def _load_cost(trials: TrialsSpec | None, batches: bool, startups: list[float], runs: list[float]) -> float:
    """What an engine start costs, in trials (noisy mode sizes its queries by it): the recipe's
    ``trials.load_cost``, or the mean startup over the mean trial seconds. 0 where trials
    cannot share an engine start (a user command, ``trials.batch: false``)."""
    if trials is None or not batches:
        return 0.0
    if trials.load_cost != "auto":
        return float(trials.load_cost)
    return _in_units(startups, runs)


def _build_cost(trials: TrialsSpec | None, builds: dict[str, list[float]], units: list[float],
               grouped: bool) -> float:
    """What a full build costs in the search's unit (a trial in noisy mode, a step in exact
    mode), which weighs a commit's information against its build: the recipe's
    ``trials.build_cost``, or the mean seconds of the session's full builds (of every fresh
    build where each commit is its own) over the mean seconds of one unit."""
    setting = trials.build_cost if trials else "auto"
    if setting != "auto":
        return float(setting)
    fresh = builds["built"] if grouped else builds["built"] + builds["overlay"]
    return _in_units(fresh, units)


def _overlay_cost(trials: TrialsSpec | None, builds: dict[str, list[float]], units: list[float]) -> float:
    """What an overlay on a built key's image or outputs costs, in the same unit."""
    setting = trials.overlay_cost if trials else "auto"
    if setting != "auto":
        return float(setting)
    return _in_units(builds["overlay"], units)


def told_costs(problem: search.SearchProblem) -> dict[str, float]:
    """What the search weighed its choice by (journaled with each step, shown in the report):
    the costs above 0, in its unit, the number of build groups it knew and how many of them
    had an image when it chose."""
    told = {"load_cost": problem.load_cost, "build_cost": problem.build_cost, "overlay_cost": problem.overlay_cost}
    if problem.build_groups is not None:
        told["build_groups"] = float(len(set(problem.build_groups)))
        told["prebuilt_groups"] = float(len(problem.prebuilt_groups))
    return {name: value for name, value in told.items() if value}
