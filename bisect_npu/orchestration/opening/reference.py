"""What a search's oracle compares a run with: a recipe's golden files, or the good side's own runs
(a commit search's good end, a settings search's good variant). The good side's runs are the
reference, so it runs before anything compared with it and is never taken from the verdict store;
an accuracy recipe also compares with the bad end's runs once they exist."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from bisect_npu import search
from bisect_npu.oracle.throughput import reference_trials
from bisect_npu.orchestration.opening.environments import load_golden
from bisect_npu.orchestration.running.evaluate import Evaluator
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import CandidateRange, TrialRun

# The trials journaled for one side of a search; None where that side has not run.
SideRuns = Callable[[], list[TrialRun] | None]


def store_reference(recipe: Recipe | None, candidates: CandidateRange, find_fix: bool) -> str:
    """What a recipe's verdicts are relative to, for the verdict store: the end whose runs the
    oracle compares against (the good end as tested; a fix search's throughput line, the new end:
    `reference_at_new_end`), else nothing."""
    if recipe is None or recipe.reference.kind != "good_end":
        return ""
    return candidates.bad if reference_at_new_end(recipe, find_fix) else candidates.base


def reference_at_new_end(recipe: Recipe | None, find_fix: bool) -> bool:
    """Whether a commit search's reference end is its new end (position n): a fix search
    (--find-fix) of a throughput line drawn from an end. The old end is the broken one there and
    never lies under the line its own runs draw; the symptom is the old level under the line the
    restored one draws, as a regression's is the new level under the good end's."""
    return find_fix and recipe is not None and recipe.oracle.line_from_end() is not None


def step_trials(recipe: Recipe | None, as_reference: bool, levels: bool = False) -> int:
    """A step's trials outside noisy mode: the recipe's count, and more at the good end where its
    mean is a throughput line (`oracle.throughput.reference_trials`); one in levels mode, where the
    search asks each run where it teaches most."""
    if recipe is None or levels:
        return 1
    if as_reference and (spec := recipe.oracle.line_from_end()) is not None:
        return reference_trials(spec, recipe.trials.count)
    return recipe.trials.count


class References:
    """The reference observations of one search, whatever it tests: `good_runs` reads its good
    side's journaled trials (in a fix search of a throughput line, the new end's: the side whose line
    the other lies under), `bad_runs` the other side's (where an accuracy recipe compares with them)."""

    def __init__(self, recipe: Recipe | None, evaluator: Evaluator, good_runs: SideRuns,
                 bad_runs: SideRuns | None = None, at: int = 0) -> None:
        self.recipe = recipe
        self.at = at  # a commit search's reference position: the good end, or a fix search's new end
        self.evaluator = evaluator
        self.good_runs = good_runs
        self.bad_runs = bad_runs
        if recipe is not None and recipe.reference.kind == "golden":
            evaluator.reference = load_golden(recipe)

    @classmethod
    def at_end(cls, recipe: Recipe | None, evaluator: Evaluator, runs_at: Callable[[int], list[TrialRun] | None],
               at: int, n: int) -> References:
        """A commit search's references: the runs journaled at its reference end `at` (0, or a fix
        search's new end n) and at the other end, `runs_at(index)` reading a position's."""
        return cls(recipe, evaluator, functools.partial(runs_at, at), functools.partial(runs_at, n - at), at=at)

    @property
    def from_good_end(self) -> bool:
        """Whether the good side's runs are the reference."""
        return bool(self.recipe and self.recipe.reference.kind == "good_end")

    def first(self, queries: Sequence[search.Query]) -> tuple[search.Query | None, list[search.Query]]:
        """The query to run alone before a commit search's round (the reference position's, `at`, when
        its runs are the reference) and the rest, that position first."""
        ordered = sorted(queries, key=lambda q: q.index != self.at)
        if self.from_good_end and ordered and ordered[0].index == self.at:
            return ordered[0], ordered[1:]
        return None, ordered

    def ensure(self, run_good: Callable[[int], None]) -> None:
        """Give the evaluator the good side's runs as its reference, running that side first (with
        the recipe's trials, `run_good(trials)`) where it has not run (and the bad side's, for an
        accuracy recipe or throughput steps weighed against it, where it has run)."""
        if not self.from_good_end or self.evaluator.reference is not None:
            return
        good = self.good_runs()
        if good is None:
            run_good(step_trials(self.recipe, as_reference=True))
            good = self.good_runs() or []
        self.evaluator.set_reference(good)
        bad = self.bad_runs() if self.bad_runs is not None else None
        if bad and (self.evaluator.accuracy is None or self.evaluator.accuracy.bad_end is None):
            self.evaluator.set_bad_reference(bad)
