"""What a session's oracle compares a candidate's observations with: a recipe's golden files, or
the good end's own runs. The good end's runs are the reference, so that end runs before any other
position and is never taken from the verdict store; an accuracy recipe also compares with its bad
end's runs once they exist."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bisect_npu import search
from bisect_npu.oracle.throughput import reference_trials
from bisect_npu.orchestration.environments import load_golden
from bisect_npu.orchestration.evaluate import Evaluator
from bisect_npu.orchestration.state import SessionState
from bisect_npu.recipe.schema import Recipe
from bisect_npu.records import StepRecord


def store_reference(recipe: Recipe | None, base: str) -> str:
    """What a recipe's verdicts are relative to, for the verdict store: the good end where the
    oracle compares against the good end's own runs, else nothing."""
    return base if recipe is not None and recipe.reference.kind == "good_end" else ""


def step_trials(recipe: Recipe | None, as_reference: bool) -> int:
    """A step's trials outside noisy mode: the recipe's count, and more at the good end where its
    mean is a throughput line (`oracle.throughput.reference_trials`)."""
    if recipe is None:
        return 1
    spec = recipe.oracle.throughput
    if as_reference and spec is not None and "throughput" in recipe.oracle.kinds:
        return reference_trials(spec, recipe.trials.count)
    return recipe.trials.count


class References:
    """The reference observations of one session over positions 0 (the good end) to `last`."""

    def __init__(self, recipe: Recipe | None, evaluator: Evaluator, state: SessionState, last: int) -> None:
        self.recipe = recipe
        self.evaluator = evaluator
        self.state = state
        self.last = last
        if recipe is not None and recipe.reference.kind == "golden":
            evaluator.reference = load_golden(recipe)

    @property
    def from_good_end(self) -> bool:
        """Whether the good end's runs are the reference."""
        return bool(self.recipe and self.recipe.reference.kind == "good_end")

    def first(self, queries: Sequence[search.Query]) -> tuple[search.Query | None, list[search.Query]]:
        """The query to run alone before a round (the good end's, when it is the reference) and the
        rest, the good end first."""
        ordered = sorted(queries, key=lambda q: q.index != 0)
        if self.from_good_end and ordered and ordered[0].index == 0:
            return ordered[0], ordered[1:]
        return None, ordered

    def ensure(self, run: Callable[[search.Query], None]) -> None:
        """Give the evaluator the good end's runs as its reference, running that end first where it
        has not run (and the bad end's, for an accuracy recipe, where it has run)."""
        if not self.from_good_end or self.evaluator.reference is not None:
            return
        if not self._steps_at(0):
            run(search.Query(0, step_trials(self.recipe, as_reference=True)))
        self.evaluator.set_reference([t for s in self._steps_at(0) for t in s.trials])
        bad_steps = self._steps_at(self.last)
        if bad_steps and self.evaluator.accuracy is not None and self.evaluator.accuracy.bad_end is None:
            self.evaluator.set_bad_reference([t for s in bad_steps for t in s.trials])

    def _steps_at(self, index: int) -> list[StepRecord]:
        return [step for step in self.state.steps() if step.index == index]
