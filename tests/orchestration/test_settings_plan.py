"""What a settings search is asked, checked before anything runs: the differences and --vary values."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from bisect_npu.errors import UsageError
from bisect_npu.orchestration.settings_search import SettingsQuestion, parse_vary, plan_differences
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.settings import Difference
from tests.helpers.gitrepo import make_one_commit_repo

BAD = "demo-async-penalty"


def plan(**given: object) -> tuple[list[Difference], dict[str, list[object]]]:
    return plan_differences(load_recipe(BAD), SettingsQuestion(**given))  # type: ignore[arg-type]


def test_vary_keys_come_first_with_their_further_values() -> None:
    assert parse_vary("cases[*].sampling.temperature=0.0,0.3,1") == ("cases[*].sampling.temperature", [0.0, 0.3, 1])
    differences, further = plan(good_set=["cases[*].sampling.logprobs=3"],
                                vary=["cases[*].sampling.temperature=0.3,1"])
    assert differences == [Difference("cases[*].sampling.temperature", 0.0, 0.3),
                           Difference("cases[*].sampling.logprobs", 5, 3)]
    assert further == {"cases[*].sampling.temperature": [1]}


def test_a_good_recipe_adds_the_keys_it_differs_in(tmp_path: Path) -> None:
    raw = yaml.safe_load(Path(load_recipe(BAD).source or "").read_text())
    raw["engine"]["args"]["async_scheduling"] = False
    raw["cases"][0]["sampling"]["repetition_penalty"] = 1.0
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(raw))
    differences, _ = plan(good_recipe=str(good), good_set=["cases[*].sampling.logprobs=3"])
    assert [d.key for d in differences] == ["cases[*].sampling.logprobs", "engine.args.async_scheduling",
                                            "cases[repeat-story].sampling.repetition_penalty"]


@pytest.mark.parametrize(("given", "message"), [
    ({}, "needs a good variant that differs from the recipe"),
    ({"good_set": ["cases[*].sampling.seed=1", "cases[*].sampling.seed=2"]}, "given twice"),
    ({"good_set": ["temperature"]}, "write KEY=VALUE"),
    ({"vary": ["cases[*].sampling.tempreature=0,1"]}, "nearest: cases[*].sampling.temperature"),
])
def test_what_cannot_be_searched_is_one_line(given: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]").replace("*", r"\*")):
        plan(**given)


def test_an_output_length_against_the_good_variants_output_is_refused() -> None:
    """rope-longseq's trigger is its output length (the drift starts past position 128); its tokens
    are compared with the good variant's, which at a shorter length ends before the drift and
    mismatches any longer output by its length alone: the search refuses the key."""
    recipe = load_recipe("demo-rope-longseq")
    request = SettingsQuestion(good_set=["cases[*].sampling.max_tokens=100", "cases[*].sampling.logprobs=3"])
    with pytest.raises(UsageError, match=r"^cases\[\*\]\.sampling\.max_tokens: the recipe's output is compared with "
                                         r"the good variant's .* at max_tokens 100 has no tokens past that; .*: give "
                                         r"--reference-at REF \(a commit where the case is good"):
        plan_differences(recipe, request)
    with_reference = dataclasses.replace(request, reference_at="v0.9.0")  # each configuration against itself there
    assert [d.key for d in plan_differences(recipe, with_reference)[0]] == ["cases[*].sampling.max_tokens",
                                                                            "cases[*].sampling.logprobs"]
    assert [d.key for d in plan_differences(recipe, SettingsQuestion(
        good_set=["cases[*].sampling.logprobs=3"]))[0]] == [
        "cases[*].sampling.logprobs"]
    async_penalty = plan(good_set=["cases[*].sampling.max_tokens=100"])[0]  # no reference: the length is a key
    assert [d.key for d in async_penalty] == ["cases[*].sampling.max_tokens"]


def throughput_recipe(tmp_path: Path) -> str:
    """demo-async-penalty served under load, its throughput judged against the good end's."""
    raw = yaml.safe_load(Path(load_recipe(BAD).source or "").read_text())
    raw["engine"].update(backend="openai", launcher=["{python}", "-m", "{probe}.serve_mini", "{model}"],
                         load={"concurrency": 4, "requests": 8})
    raw["oracle"] = {"kinds": ["throughput"], "throughput": {"reference": "good_end"}}
    raw["reference"] = {"kind": "good_end"}
    path = tmp_path / "throughput.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize(("setting", "what"), [("engine.load.concurrency=1", "the load"),
                                               ("engine.load.requests=1", "the load"),
                                               ("cases[*].sampling.max_tokens=64", "the output length")])
def test_a_throughput_against_the_good_variants_is_refused_for_load_and_length(tmp_path: Path, setting: str,
                                                                              what: str) -> None:
    """A throughput compared with the good end's changes with the load and the output length at any
    commit: against the good variant at the same commit the search would name the key anywhere."""
    path = throughput_recipe(tmp_path)
    request = SettingsQuestion(good_set=[setting, "engine.args.async_scheduling=false"])
    key = setting.partition("=")[0]
    with pytest.raises(UsageError, match=f"^{re.escape(key)}: the recipe's throughput is compared with the good "
                                         f"variant's .* {what} changes the throughput at any commit: give "
                                         "--reference-at REF"):
        plan_differences(load_recipe(path), request)
    assert len(plan_differences(load_recipe(path), dataclasses.replace(request, reference_at="v0.9.0"))[0]) == 2
    async_only = SettingsQuestion(good_set=["engine.args.async_scheduling=false"])
    assert [d.key for d in plan_differences(load_recipe(path), async_only)[0]] == ["engine.args.async_scheduling"]


@pytest.mark.parametrize("argv", [
    ["settings", "--at", "v1", "--recipe", BAD, "--good-set", "engine.args.async_scheduling=false"],
    ["run", "--good", "v1", "--bad", "v1", "--recipe", BAD, "--settings", "engine.args.async_scheduling=false"],
])
def test_settings_under_ray_is_one_line_naming_the_cause(tmp_path: Path, argv: list[str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before anything runs (Ray need not be installed): the cause and the next step."""
    from bisect_npu.cli import main

    repo = make_one_commit_repo(tmp_path / "repo")
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--repo", str(repo), "--executor", "ray", "--session", str(tmp_path / "session"),
              "--no-verdict-store"])
    assert exited.value.code == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bisect-npu: error:")]
    assert len(error) == 1, error
    assert "--executor ray: a settings search runs every configuration on one build of its commit" in error[0]
    assert "search with --executor local or docker" in error[0]
    assert not (tmp_path / "session" / "journal.jsonl").exists()
