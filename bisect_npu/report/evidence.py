"""The evidence behind a session's answer in words, and the run facts a reader weighs it by (the
NPU host type, the candidates' own switches)."""

from __future__ import annotations

from statistics import fmean, stdev

from bisect_npu.level import MergeLevel
from bisect_npu.oracle.throughput import ThroughputConfig
from bisect_npu.records import EndRecord
from bisect_npu.report.case import recipe_of
from bisect_npu.report.view import SessionView, StepView


def evidence_summary(view: SessionView) -> list[str]:
    """The evidence behind the answer in words (the journal keeps the raw figures): in exact mode
    the steps that bracket the culprit, in noisy mode both commits' trials with 95% intervals and
    the posterior (a best guess below the confidence asked: its own), and for ends judged wrong
    what each end showed (in levels mode: its runs, the
    line and the nightly's earlier runs, `levels_ends_lines`). Noisy figures count
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
    if end.status == "ends_wrong" and "under_line" in figures:
        return levels_ends_lines(view, figures, flipped)
    if end.status == "narrowed" and end.best_guess is not None:  # the commit it leaned to, below the confidence
        end = end.model_copy(update={"index": int(figures["best_guess"]), "culprit": end.best_guess})
    elif end.status != "found":
        return []
    found = "the best guess" if end.status == "narrowed" else "the fix" if flipped else "the culprit"
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
    if "good_mean" in figures and "runs" in figures:  # levels mode: one model over every run
        return _levels_lines(view, end, found, flipped)
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


def _levels_lines(view: SessionView, end: EndRecord, found: str, flipped: bool) -> list[str]:
    """The levels search's answer: its posterior against the confidence asked (and so why it
    stopped), both sides' means (`flipped`, a fix: the old side's, low, as a share of the fixed
    side's), and the runs it spent, one a step, at the culprit and its parent."""
    figures = end.figures
    runs_at: dict[int, int] = {}
    for step in view.steps:
        if step.verdict in ("good", "bad"):
            runs_at[step.index] = runs_at.get(step.index, 0) + 1
    culprit = end.index if end.index is not None else -1
    asked = figures.get("confidence_asked")
    why = ""
    if asked is not None and figures["posterior"] >= asked:
        why = f"the search stopped when it reached the {_percent(asked)} asked"
    elif asked is not None:
        why = (f"the search stopped short of the {_percent(asked)} asked: the commits around it reached their runs "
               "cap or were skipped")
    good = (figures["good_mean"], "old" if flipped else "good")
    bad = (figures["bad_mean"], "fixed" if flipped else "bad")
    (high, high_name), (low, low_name) = (bad, good) if flipped else (good, bad)
    share = low / high if high else float("nan")
    return [f"posterior that this is the first {'fixed' if flipped else 'bad'} commit: "
            f"{_percent(figures['posterior'])}" + (f"; {why}" if why else ""),
            f"the {high_name} side's mean {high:.1f} tokens/s, the {low_name} side's {low:.1f} "
            f"({share:.1%} of it; every run of every commit weighed together, the spread estimated from them)",
            f"{figures['runs']:.0f} runs in all, one a step: {runs_at.get(culprit, 0)} at {found}, "
            f"{runs_at.get(culprit - 1, 0)} at its parent, {len(runs_at)} commits run",
            *earlier_lines(figures, flipped, earlier_source(view))]


_NIGHTLY = {"good": "the last good nightly's", "bad": "the failing nightly's"}  # whose earlier runs, by end


def earlier_lines(figures: dict[str, float], flipped: bool = False, source: str = "") -> list[str]:
    """The earlier runs the levels search counted (`oracle.throughput.earlier_runs`), one line an end
    (`flipped`, a fix: the failing nightly's at the old end, the good one's at the new end), then
    where they were measured (`source`: for `--nightly-result`, each file and the model it served),
    so a reader can check the evidence is the case's."""
    at = {"good": "new", "bad": "old"} if flipped else {"good": "good", "bad": "bad"}
    lines = [f"{_NIGHTLY[end]} {_runs_said(count, figures[f'earlier_{end}_mean'])} counted as "
             f"{'a run' if count == 1 else 'runs'} at the {at[end]} end (as far as the baseline's host is this one: "
             "a value of another host costs runs, not the answer)"
             for end in ("good", "bad") if (count := figures.get(f"earlier_{end}_runs")) is not None]
    return [*lines, f"where they were measured: {source}"] if lines and source else lines


def levels_ends_lines(view: SessionView, figures: dict[str, float], flipped: bool) -> list[str]:
    """Why a levels session judged its ends wrong (exit 4): each end's own runs (count, mean,
    spread), the line the end with the symptom was held to (`threshold` x the other end's mean; in
    a fix search, `flipped`, the new end's), how likely the session's runs make it that the end's
    mean lies under it (`under_line`), the nightly's earlier runs as the end record keeps them
    (report.json's evidence has the same figures), and, where the recipe is still the one the
    session ran, the published baseline and where the earlier runs were measured. The earlier runs
    are not weighed in judging the ends (an earlier run may be another host's), so a nightly that
    failed beside a bad end that ran fast here says the two were not measured alike."""
    n = len(view.range.candidates)
    shows, draws = (0, n) if flipped else (n, 0)  # the end that should show the symptom, the end drawing the line
    names = {0: "the old end" if flipped else "the good end", n: "the new end" if flipped else "the bad end"}
    runs = {end: _end_runs(view, end) for end in (0, n)}
    lines = [f"{names[end]}: {_spread_said(runs[end])}" for end in (0, n)]
    threshold = next((s.figures["threshold"] for s in view.steps
                      if s.index in (0, n) and isinstance(s.figures.get("threshold"), int | float)), None)
    line = (f"{threshold:g} x {names[draws]}'s mean = {threshold * fmean(runs[draws]):.1f} tokens/s"
            if threshold is not None and runs[draws] else f"the recipe's threshold x {names[draws]}'s mean")
    lines.append(f"the line: {line}; P({names[shows]}'s mean is under it, from every run of the session) = "
                 f"{_percent(figures['under_line'])}")
    throughput = _session_throughput(view)
    if throughput is not None and throughput.baseline is not None:
        lines.append(f"the recipe's published baseline: {throughput.baseline:.1f} tokens/s (the search's prior "
                     "for the level without the symptom, as far as its host is this one; the line is drawn from "
                     "the runs)")
    at = {"good": names[n if flipped else 0], "bad": names[0 if flipped else n]}
    earlier = [f"{_NIGHTLY[end]} {_runs_said(count, figures[f'earlier_{end}_mean'])} at {at[end]}, not weighed in "
               "judging the ends (they are judged on this session's runs alone: an earlier run may be another "
               "host's)" for end in ("good", "bad") if (count := figures.get(f"earlier_{end}_runs")) is not None]
    source = earlier_source(view)
    return [*lines, *earlier, f"where they were measured: {source}"] if earlier and source else [*lines, *earlier]


def _end_runs(view: SessionView, index: int) -> list[float]:
    """The tokens/s of every run journaled at a position (its steps' `throughput_samples`)."""
    values: list[float] = []
    for step in view.steps:
        samples = step.figures.get("throughput_samples")
        if step.index == index and step.verdict != "skip" and isinstance(samples, list):
            values += [float(v) for v in samples if isinstance(v, int | float) and not isinstance(v, bool)]
    return values


def _spread_said(values: list[float]) -> str:
    if not values:
        return "no run measured"
    if len(values) == 1:
        return f"1 run, {values[0]:.1f} tokens/s (one run: no spread of its own)"
    return (f"{len(values)} runs, mean {fmean(values):.1f} tokens/s, spread {stdev(values):.1f} "
            f"(standard deviation; {min(values):.1f}-{max(values):.1f})")


def _session_throughput(view: SessionView) -> ThroughputConfig | None:
    """The recipe's `oracle.throughput` as the session ran it: None where the recipe has none, is
    gone, or changed since (its digest differs from the journal's: it may name other runs)."""
    recipe = recipe_of(view)
    if recipe is None or view.header.recipe_digest not in (None, recipe.digest()):
        return None
    return recipe.oracle.throughput


def earlier_source(view: SessionView) -> str:
    """The recipe's `earlier_runs.source` as the session ran it (`_session_throughput`): empty where
    it gives none."""
    throughput = _session_throughput(view)
    earlier = throughput.earlier_runs if throughput is not None else None
    return earlier.source if earlier is not None else ""


def _runs_said(count: float, mean: float) -> str:
    return f"{mean:.0f} tokens/s" if count == 1 else f"{count:.0f} runs averaging {mean:.0f} tokens/s"


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


