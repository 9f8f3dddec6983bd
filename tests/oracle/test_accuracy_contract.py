"""The accuracy contract: the recipe's `accuracy` section, SampleOutcome, the per-sample lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.observations import Observation, SampleOutcome
from bisect_npu.oracle.accuracy import SampleFormatError, parse_sample_lines, read_samples_jsonl
from bisect_npu.orchestration.running.probe_requests import probe_request
from bisect_npu.recipe.loader import parse_recipe
from bisect_npu.recipe.schema import ACCURACY_CASE, Recipe

HEAD = "name: acc\nmodel: {path: /models/m}\noracle: {kinds: [accuracy]}\n"
AISBENCH = HEAD + """accuracy:
  harness: aisbench
  dataset: data/aime2024.jsonl
  aisbench: {request_conf: vllm_api_general_chat, dataset_conf: aime2024/aime2024_gen_0_shot_chat_prompt}
  sampling: {temperature: 0.6, top_p: 0.95, max_tokens: 32768}
  reference: both
  baseline: 79.8
  threshold: 10
"""


def test_an_accuracy_recipe_gets_one_case_and_the_good_end_as_reference() -> None:
    recipe = parse_recipe(AISBENCH, "/recipes/r.yaml")
    assert [case.id for case in recipe.cases] == [ACCURACY_CASE]
    assert recipe.cases[0].sampling.temperature == 0.6
    assert recipe.reference.kind == "good_end"
    assert Recipe.model_validate(recipe.model_dump()).cases == recipe.cases  # validated twice: the same


def test_the_probe_request_carries_the_harness_and_the_samples_to_run() -> None:
    recipe = parse_recipe(AISBENCH, "/recipes/r.yaml")
    request = probe_request(recipe, recipe.cases[0], "abc", 0, sample_ids=["3", "7"])
    assert request["accuracy"]["dataset"] == "/recipes/data/aime2024.jsonl"
    assert request["accuracy"]["sample_ids"] == ["3", "7"]
    assert request["accuracy"]["aisbench"]["request_conf"] == "vllm_api_general_chat"
    assert request["case"]["sampling"]["max_tokens"] == 32768
    assert probe_request(recipe, recipe.cases[0], "abc", 0)["accuracy"]["sample_ids"] is None


@pytest.mark.parametrize(("body", "field", "words"), [
    ("accuracy: {harness: lm_eval, dataset: d}", "accuracy", "needs its section `lm_eval`"),
    ("accuracy: {harness: command, dataset: 'https://x/d.jsonl', command: {argv: [x]}}", "accuracy.dataset",
     "nothing is downloaded"),
    ("accuracy: {harness: command, dataset: d, command: {argv: [x]}, reference: baseline}", "accuracy",
     "needs `baseline`"),
    ("accuracy: {harness: command, dataset: d, command: {argv: [x]}, focus: {control: 2.5}}",
     "accuracy.focus.control", "neither a count"),
    ("accuracy: {harness: aisbench, dataset: d, aisbench: {request_conf: general_chat, dataset_conf: x}}",
     "accuracy.aisbench.request_conf", "vllm_api_"),
    ("accuracy: {harness: command, dataset: d, command: {argv: [x]}, lm_eval: {task: gsm8k}}", "accuracy",
     "section `lm_eval` is set"),
    ("accuracy: {harness: command, dataset: d, command: {argv: [x]}, repeats: 0}", "accuracy.repeats", ""),
    ("accuracy: {harness: command, dataset: d, command: {argv: [x]}, confidence: 1.0}", "accuracy.confidence", ""),
])
def test_a_wrong_accuracy_section_names_the_field(body: str, field: str, words: str) -> None:
    with pytest.raises(UsageError, match=f"field '{field}'") as caught:
        parse_recipe(HEAD + body)
    assert words in str(caught.value)


def test_accuracy_kind_and_section_come_together_and_alone() -> None:
    with pytest.raises(UsageError, match="no `accuracy` section"):
        parse_recipe(HEAD)
    with pytest.raises(UsageError, match=r"needs oracle\.kinds"):
        parse_recipe("name: a\nmodel: {path: m}\ncases: [{prompt: p}]\n"
                     "accuracy: {harness: command, dataset: d, command: {argv: [x]}}\n")
    with pytest.raises(UsageError, match="listed alone"):
        parse_recipe(AISBENCH.replace("kinds: [accuracy]", "kinds: [accuracy, repetition]"))
    with pytest.raises(UsageError, match="no `cases`"):
        parse_recipe(AISBENCH + "cases: [{prompt: p}]\n")


def test_a_recipe_without_accuracy_still_needs_a_case() -> None:
    with pytest.raises(UsageError, match="`cases` needs at least one"):
        parse_recipe("name: a\nmodel: {path: m}\n")


def test_sample_lines_parse_and_pool_runs_of_one_id() -> None:
    lines = ['{"id": 7, "correct": true, "prompt": "p", "output": "o", "target": "t"}', "",
             '{"id": "7", "correct": 0}', '{"id": "8", "correct": 0.25, "runs": 4, "finish_reason": "length"}']
    seven, eight = parse_sample_lines(lines, "s.jsonl")
    assert (seven.id, seven.runs, seven.correct, seven.prompt) == ("7", 2, 0.5, "p")
    assert (eight.correct_runs, eight.finish_reason) == (1.0, "length")


@pytest.mark.parametrize(("line", "words"), [
    ("not json", "not a JSON line"),
    ("[1, 2]", "a JSON object"),
    ('{"correct": 1}', "field 'id'"),
    ('{"id": "a", "correct": 1.5}', "field 'correct'"),
    ('{"id": "a", "correct": 1, "runs": 0}', "field 'runs'"),
    ('{"id": "a", "correct": NaN}', "field 'correct'"),
])
def test_a_line_that_does_not_parse_names_file_and_line(line: str, words: str) -> None:
    with pytest.raises(SampleFormatError, match=r"out\.jsonl:2: ") as caught:
        parse_sample_lines(['{"id": "ok", "correct": 1}', line], "out.jsonl")
    assert words in str(caught.value)
    assert isinstance(caught.value, InfrastructureError)  # exit 5, never a verdict


def test_a_missing_or_empty_sample_file_is_infrastructure(tmp_path: Path) -> None:
    with pytest.raises(SampleFormatError, match="wrote no per-sample file"):
        read_samples_jsonl(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SampleFormatError, match="no sample lines"):
        read_samples_jsonl(tmp_path / "empty.jsonl")


def test_old_observations_read_without_samples_and_new_ones_with() -> None:
    assert Observation.model_validate({"text": "x"}).samples is None
    obs = Observation.model_validate({"samples": [{"id": "1", "correct": 1}]})
    assert obs.samples == [SampleOutcome(id="1", correct=1.0)]
