"""Which settings trigger it: delta debugging (ddmin, Zeller and Hildebrandt 2002) over the keys a
bad configuration and a good variant differ in.

Key i is one difference (a recipe path, its bad value and its good value). A configuration is the
set of keys at their bad value, the others at the good variant's: the empty set is the good
variant, the full set the bad case. ddmin looks for a failing configuration that is 1-minimal:
setting any one of its keys back to the good value makes it pass. That set is the trigger.

A pure function like the commit search: ``decide_ddmin(problem, evidence)`` replays ddmin from
the start against the verdicts the evidence holds, and asks for the first configuration it has no
verdict of yet. So a configuration is never asked twice once it has a verdict, and a resumed
search that rebuilds the evidence from its journal (in any order) takes exactly the same path.

Three outcomes, as Zeller's ddmin has them: a configuration reads as failing, passing, or
unresolved (a skip: its runs could not be judged, such as the host's failures once its retries
are spent). An unresolved configuration is never taken for a pass where the answer needs one: the
trigger is named only when it and each configuration its 1-minimality rests on were judged;
otherwise the search answers `Unresolved`, naming the configurations that stand in the way (the
caller runs them again once their cause is gone, or says the trigger cannot be named).

Noisy mode reads a configuration from trial counts: bad when its failures look like the bad
case's rate, good when like the good variant's (both rates learned from the two ends' trials,
on the noisy commit search's grid prior), more trials otherwise, up to a cap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from bisect_npu.defaults import CONFIDENCE
from bisect_npu.search.exact import commit_verdict
from bisect_npu.search.noisy import LOG_1MR, LOG_R, PRIOR_P, PRIOR_Q, ends_change_probability
from bisect_npu.search.types import EndsWrong, Evidence, Outcome

Configuration = frozenset[int]


@dataclass(frozen=True)
class SettingsProblem:
    """What the settings search is asked: ``keys`` differences (0..keys-1), the mode, and in noisy
    mode how sure a configuration's reading must be (``confidence``), how many trials one query
    asks (``batch``: they share one engine start) and the most one configuration may take; ``slots``:
    how many configurations may run at once."""

    keys: int
    mode: Literal["exact", "noisy"] = "exact"
    confidence: float = CONFIDENCE
    batch: int = 1
    max_trials: int = 64
    slots: int = 1

    def __post_init__(self) -> None:
        if self.keys < 1:
            raise ValueError(f"a settings search needs at least one differing key, got {self.keys}")
        if not 0.5 < self.confidence < 1.0:
            raise ValueError("confidence must lie in (0.5, 1)")
        if self.batch < 1 or self.max_trials < 1 or self.slots < 1:
            raise ValueError("batch, max_trials and slots must be >= 1")

    @property
    def bad(self) -> Configuration:
        """The bad case: every key at its bad value."""
        return frozenset(range(self.keys))

    @property
    def good(self) -> Configuration:
        """The good variant: every key at its good value."""
        return frozenset()


@dataclass(frozen=True)
class Ask:
    """Run this configuration (``trials`` trials, one engine start); with more than one slot, also
    the configurations ``alongside`` at once: those the search asks next, in order, where the ones
    before them read as a pass (a guess that costs a run where it misses, never a wrong answer: the
    search reads only the evidence)."""

    configuration: Configuration
    trials: int = 1
    alongside: tuple[Ask, ...] = ()


@dataclass(frozen=True)
class Trigger:
    """The answer: a 1-minimal failing configuration, and the reading of every one tested."""

    keys: Configuration
    readings: dict[Configuration, Outcome] = field(default_factory=dict)


@dataclass(frozen=True)
class Unresolved:
    """No trigger without these configurations: ddmin ended on a trigger whose 1-minimality rests
    on them (`rests_on`), and they could not be judged."""

    configurations: tuple[Configuration, ...]
    trigger: Configuration = frozenset()


SettingsDecision = Ask | Trigger | EndsWrong | Unresolved


class _Unknown(Exception):
    """Raised inside the replay at the first configuration the evidence cannot read yet."""

    def __init__(self, ask: Ask) -> None:
        super().__init__(ask)
        self.ask = ask


def worst_case_tests(keys: int) -> int:
    """The most configurations one search runs: ddmin's worst case, (n² + 7n) / 2 (Zeller and
    Hildebrandt), plus the two ends."""
    return (keys * keys + 7 * keys) // 2 + 2


def decide_ddmin(problem: SettingsProblem, evidence: Mapping[Configuration, Evidence]) -> SettingsDecision:
    """The next configuration to run, the trigger, or the ends judged wrong (same inputs, same answer)."""
    outside = [c for c in evidence if not c <= problem.bad]
    if outside:
        raise ValueError(f"evidence for configurations with keys outside 0..{problem.keys - 1}")
    ends = _ends(problem, evidence)
    if ends is not None:
        return ends
    readings: dict[Configuration, Outcome] = {problem.bad: "bad", problem.good: "good"}

    def read(configuration: Configuration) -> Outcome | None:
        if configuration not in readings and (outcome := reading(problem, evidence, configuration)) is not None:
            readings[configuration] = outcome
        return readings.get(configuration)

    def ask(configuration: Configuration) -> Ask:
        room = problem.max_trials - evidence.get(configuration, Evidence()).trials
        return Ask(configuration, 1 if problem.mode == "exact" else min(problem.batch, room))

    def first_failing(candidates: list[list[int]]) -> list[int] | None:
        """The first candidate read as failing; at the first that cannot be read yet, the ask for it
        and for the unread ones after it up to the slots (a candidate read as failing ends the scan:
        nothing past it is asked whatever the unread ones before it read)."""
        for at, candidate in enumerate(candidates):
            outcome = read(frozenset(candidate))
            if outcome == "bad":
                return candidate
            if outcome is None:
                alongside: list[Ask] = []
                for later in candidates[at + 1:]:
                    if len(alongside) >= problem.slots - 1 or (seen := read(frozenset(later))) == "bad":
                        break
                    if seen is None:
                        alongside.append(ask(frozenset(later)))
                raise _Unknown(replace(ask(frozenset(candidate)), alongside=tuple(alongside)))
        return None

    try:
        trigger = _ddmin(sorted(problem.bad), first_failing)
    except _Unknown as unknown:
        return unknown.ask
    found = Trigger(frozenset(trigger), dict(readings))
    unjudged = tuple(c for c in rests_on(problem, found) if readings.get(c) not in ("good", "bad"))
    return Unresolved(unjudged, found.keys) if unjudged else found


def rests_on(problem: SettingsProblem, decision: SettingsDecision) -> tuple[Configuration, ...]:
    """The configurations an answer rests on: the trigger (it fails) and each with one of its keys
    back at the good value (each passes: the trigger is 1-minimal), the good variant for a trigger
    of one key; the end judged wrong; none for an ask or an unresolved end."""
    if isinstance(decision, Trigger):
        return (decision.keys, *(decision.keys - {key} for key in sorted(decision.keys)))
    if isinstance(decision, EndsWrong):
        return (problem.good if decision.which == "good" else problem.bad,)
    return ()


def _ddmin(keys: list[int], first_failing: Callable[[list[list[int]]], list[int] | None]) -> list[int]:
    """Zeller's ddmin on a failing ``keys``: reduce to a failing part, else to a failing complement,
    else split finer; done when every single-key complement passes. Parts are contiguous runs of
    the sorted keys, as equal as can be, so the path is deterministic."""
    granularity = 2
    while len(keys) >= 2:
        parts = _split(keys, granularity)
        reduced = first_failing(parts)
        if reduced is not None:
            keys, granularity = reduced, 2
            continue
        # With two parts the complements are the parts themselves, tested just now.
        complements = [] if granularity == 2 else [[k for k in keys if k not in part] for part in parts]
        reduced = first_failing(complements)
        if reduced is not None:
            keys, granularity = reduced, max(granularity - 1, 2)
            continue
        if granularity >= len(keys):
            break
        granularity = min(len(keys), 2 * granularity)
    return keys


def _split(keys: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(keys), parts)
    out, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        out.append(keys[start:end])
        start = end
    return out


def _ends(problem: SettingsProblem, evidence: Mapping[Configuration, Evidence]) -> SettingsDecision | None:
    """The bad case first, then the good variant; EndsWrong when either does not show its side."""
    bad, good = evidence.get(problem.bad, Evidence()), evidence.get(problem.good, Evidence())
    if problem.mode == "exact":
        sides: tuple[tuple[Configuration, Evidence, Literal["good", "bad"]], ...] = (
            (problem.bad, bad, "bad"), (problem.good, good, "good"))
        for configuration, seen, side in sides:
            verdict = commit_verdict(seen)
            if verdict is None:  # with slots, the good variant beside the bad case where neither has run
                both = side == "bad" and problem.slots > 1 and commit_verdict(good) is None
                return Ask(configuration, alongside=(Ask(problem.good),) if both else ())
            if verdict == "skip":
                return EndsWrong(side, {"skipped": 1.0})
            if verdict != side:
                return EndsWrong(side)
        return None
    if bad.skipped and not bad.trials:
        return EndsWrong("bad", {"skipped": 1.0})
    if good.skipped and not good.trials:
        return EndsWrong("good", {"skipped": 1.0})
    change = ends_change_probability({0: good, 1: bad}, 1)
    figures = {"bad_trials": float(bad.trials), "bad_failed": float(bad.bad), "good_trials": float(good.trials),
               "good_failed": float(good.bad), "change_probability": change}
    which: Literal["good", "bad"] = "bad" if bad.bad == 0 else "good"
    if 1.0 - change >= problem.confidence:
        return EndsWrong(which, figures)
    if bad.bad >= 1 and good.good >= 1 and change >= problem.confidence:
        return None
    end = problem.bad if bad.bad == 0 or (good.good >= 1 and bad.trials <= good.trials) else problem.good
    room = problem.max_trials - evidence.get(end, Evidence()).trials
    if room <= 0:
        return EndsWrong(which, figures)
    return Ask(end, min(problem.batch, room))


def bad_probability(problem: SettingsProblem, evidence: Mapping[Configuration, Evidence], seen: Evidence) -> float:
    """P(trials `seen` fail at the bad case's rate rather than the good variant's), each rate's
    posterior from that end's trials in `evidence` on the noisy search's grid prior."""
    bad_end, good_end = evidence.get(problem.bad, Evidence()), evidence.get(problem.good, Evidence())
    likelihood = seen.bad * LOG_R + seen.good * LOG_1MR

    def log_predictive(end: Evidence, prior: np.ndarray) -> float:
        log_w = np.log(np.maximum(prior, 1e-300)) + end.bad * LOG_R + end.good * LOG_1MR
        log_w -= log_w.max()
        weights = np.exp(log_w)
        weights /= weights.sum()
        joint = np.log(np.maximum(weights, 1e-300)) + likelihood
        top = joint.max()
        return float(top + np.log(np.exp(joint - top).sum()))

    difference = log_predictive(good_end, PRIOR_Q) - log_predictive(bad_end, PRIOR_P)
    return float(1.0 / (1.0 + np.exp(np.clip(difference, -700.0, 700.0))))


def reading(problem: SettingsProblem, evidence: Mapping[Configuration, Evidence],
            configuration: Configuration) -> Outcome | None:
    """What the search reads from a configuration's evidence: good, bad, skip, or None (run it, or
    run more trials)."""
    return read_trials(problem, evidence, evidence.get(configuration, Evidence()))


def read_trials(problem: SettingsProblem, evidence: Mapping[Configuration, Evidence], seen: Evidence) -> Outcome | None:
    """The reading of trials `seen` given the ends in `evidence` (also of a configuration outside
    the search, such as a further --vary value). Noisy mode decides at ``confidence`` and, at the
    trial cap, by the likelier side."""
    if problem.mode == "exact":
        return commit_verdict(seen)
    if not seen.trials:
        return "skip" if seen.skipped else None
    p_bad = bad_probability(problem, evidence, seen)
    if p_bad >= problem.confidence:
        return "bad"
    if p_bad <= 1.0 - problem.confidence:
        return "good"
    if seen.trials >= problem.max_trials:
        return "bad" if p_bad >= 0.5 else "good"
    return None
