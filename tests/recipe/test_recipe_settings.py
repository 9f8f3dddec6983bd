"""Settings of a recipe by path: checked against the schema, set with validation, diffed."""

from __future__ import annotations

import pytest

from bisect_npu.errors import UsageError
from bisect_npu.recipe.loader import load_recipe, parse_recipe
from bisect_npu.recipe.settings import (
    Difference,
    apply,
    check_key,
    differences_between,
    differences_from_settings,
    parse_assignment,
    value_of,
)

TWO_CASES = """
name: two
model: {path: "seed:0"}
engine: {backend: mini, args: {async_scheduling: true, override_generation_config: {presence_penalty: 1.5}}}
environment: {HCCL_DETERMINISTIC: "true"}
cases:
  - {id: a, prompt: hi, sampling: {temperature: 0.0, repetition_penalty: 1.3}}
  - {id: b, prompt: ho, sampling: {temperature: 0.0, repetition_penalty: 1.3}}
"""


@pytest.fixture
def recipe():
    return parse_recipe(TWO_CASES)


def test_values_are_yaml_and_null_unsets(recipe) -> None:
    assert parse_assignment("cases[*].sampling.temperature=0.6", "--good-set") == ("cases[*].sampling.temperature", 0.6)
    assert parse_assignment("engine.args.async_scheduling=false", "--good-set")[1] is False
    assert parse_assignment("environment.X=null", "--good-set")[1] is None
    changed = apply(recipe, {"engine.args.async_scheduling": None, "environment.HCCL_DETERMINISTIC": None,
                             "cases[b].sampling.repetition_penalty": None,
                             "engine.args.override_generation_config.presence_penalty": 0.0})
    assert "async_scheduling" not in changed.engine.args and changed.environment == {}
    assert changed.engine.args["override_generation_config"] == {"presence_penalty": 0.0}
    assert [c.sampling.repetition_penalty for c in changed.cases] == [1.3, None]
    assert changed.digest() != recipe.digest() and apply(recipe, {}).digest() == recipe.digest()
    # Unsetting the override's last key drops the override: an empty one still selects the server layer.
    unset = apply(recipe, {"engine.args.override_generation_config.presence_penalty": None})
    assert unset.engine.args == {"async_scheduling": True}


@pytest.mark.parametrize(("key", "message"), [
    ("cases[*].sampling.temprature", "nearest: cases[*].sampling.temperature"),
    ("engine.backnd", "nearest: engine.backend"),
    ("environmnt.X", "nearest: environment"),
    ("cases[c].sampling.seed", "the recipe has no case 'c' (cases: a, b)"),
    ("trials.count", "how the case is judged or built"),
    ("cases[*].sampling.seed.x", "no such key"),
])
def test_unknown_keys_name_the_nearest(recipe, key: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        check_key(recipe, key, "--good-set")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_free_mappings_take_any_key(recipe) -> None:
    for key in ("engine.args.enforce_eager", "engine.args.compilation_config.level", "environment.ANY_NAME",
                "cases[a].sampling.top_k", "model.dtype"):
        check_key(recipe, key, "--good-set")


def test_a_value_of_the_wrong_type_is_one_line(recipe) -> None:
    with pytest.raises(UsageError, match=r"cases\.0\.sampling\.top_k: Input should be a valid integer"):
        differences_from_settings(recipe, {"cases[*].sampling.top_k": "forty"})
    with pytest.raises(UsageError, match="has that value already"):
        differences_from_settings(recipe, {"cases[*].sampling.temperature": 0.0})


def test_cases_that_differ_are_named_one_by_one(recipe) -> None:
    changed = apply(recipe, {"cases[a].sampling.temperature": 0.6})
    with pytest.raises(UsageError, match=r"name each case, cases\[ID\]\.sampling\.temperature"):
        value_of(changed, "cases[*].sampling.temperature")
    assert value_of(changed, "cases[b].sampling.temperature") == 0.0


def test_two_recipes_differ_key_by_key(recipe) -> None:
    good = apply(recipe, {"engine.args.async_scheduling": False, "cases[*].sampling.repetition_penalty": 1.0,
                          "cases[a].sampling.temperature": 0.6, "environment.EXTRA": "1"})
    assert differences_between(recipe, good) == [
        Difference("engine.args.async_scheduling", True, False),
        Difference("environment.EXTRA", None, "1"),
        Difference("cases[*].sampling.repetition_penalty", 1.3, 1.0),
        Difference("cases[a].sampling.temperature", 0.0, 0.6),
    ]
    judged = good.model_copy(update={"trials": good.trials.model_copy(update={"count": 3})})
    with pytest.raises(UsageError, match="differs in trials, which is how the case is judged"):
        differences_between(recipe, judged)


def test_every_bundled_recipe_lists_its_engine_args_as_keys() -> None:
    recipe = load_recipe("qwen3-repetition-penalty-async")
    for key in recipe.engine.args:
        check_key(recipe, f"engine.args.{key}", "--vary")
