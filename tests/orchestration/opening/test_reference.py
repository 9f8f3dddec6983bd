"""Which end's runs draw a throughput line (`OracleConfig.line_from_end`), and the three questions
that rest on it answered alike: does the session search in levels mode (`levels_search`), do
its steps stop when sure (`until_sure`), is a fix search's reference its new end
(`reference_at_new_end`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_npu.orchestration.opening.reference import reference_at_new_end
from bisect_npu.orchestration.running.evaluate import levels_search, until_sure
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from tests.helpers.npu_throughput import perf_recipe


def _changed(recipe: Recipe, reference: str, kinds: list[str]) -> Recipe:
    assert recipe.oracle.throughput is not None
    line = recipe.oracle.throughput.model_copy(update={"reference": reference})
    return recipe.model_copy(update={"oracle": recipe.oracle.model_copy(update={"throughput": line, "kinds": kinds})})


@pytest.mark.parametrize(("search", "reference", "kinds", "from_end"), [
    ("levels", "good_end", ["throughput"], True),
    ("per_step", "good_end", ["throughput"], True),
    ("levels", "baseline", ["throughput"], False),  # the published baseline's line: no end's runs
    ("levels", "good_end", ["repetition"], False),  # throughput configured but not judged
])
def test_the_line_drawn_from_an_end_answers_each_question(tmp_path: Path, search: str, reference: str,
                                                          kinds: list[str], from_end: bool) -> None:
    recipe = _changed(load_recipe(perf_recipe(tmp_path / "r.yaml", search)), reference, kinds)
    assert (recipe.oracle.line_from_end() is not None) == from_end
    assert levels_search(recipe) == (from_end and search == "levels")
    assert until_sure(recipe) == from_end  # `sequential` (its default); levels mode is asked first
    assert reference_at_new_end(recipe, find_fix=True) == from_end
    assert not reference_at_new_end(recipe, find_fix=False)
    assert not (levels_search(None) or until_sure(None) or reference_at_new_end(None, find_fix=True))
