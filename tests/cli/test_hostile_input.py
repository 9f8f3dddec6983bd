"""Inputs that used to end in a traceback, gigabytes or a silent wrong reading end in one line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bisect_npu.cli import NOT_A_VERDICT_EXIT, main
from bisect_npu.errors import UsageError
from bisect_npu.journal import Journal
from bisect_npu.observations import Observation
from bisect_npu.recipe.loader import MAX_DEPTH, MAX_RECIPE_BYTES, load_recipe, parse_recipe

HEAD = "name: hostile\nmodel: {path: /m}\ncases: [{prompt: p}]\n"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return int(exc.value.code or 0), capsys.readouterr().err


def test_a_yaml_alias_bomb_is_refused_at_once() -> None:
    """Nine levels of nine aliases: 1.2 KB that expands to 387 million values."""
    bomb = 'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for level in range(1, 9):
        bomb += f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]\n"
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"bomb.yaml:\d+:\d+: .*once its aliases are expanded"):
        parse_recipe(HEAD + bomb, source="bomb.yaml")
    assert time.monotonic() - started < 2


def test_aliases_within_bounds_still_work() -> None:
    recipe = parse_recipe(HEAD.replace("cases: [{prompt: p}]", "cases: [{id: a, messages: &m [{role: user, content: "
                                                                "hi}]}, {id: b, messages: *m}]"))
    assert recipe.cases[0].messages == recipe.cases[1].messages


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    with pytest.raises(UsageError, match="an alias refers to the node that contains it"):
        parse_recipe(HEAD + "environment: &loop [*loop]\n")


@pytest.mark.parametrize("deep", ["[" * 5000 + "]" * 5000, "{a: " * 100 + "1" + "}" * 100,
                                  "\n" + "\n".join("  " * i + "a:" for i in range(1, 200))])
def test_deep_nesting_is_refused(deep: str) -> None:
    with pytest.raises(UsageError, match=f"nested deeper than {MAX_DEPTH} levels"):
        parse_recipe(HEAD + "environment: " + deep + "\n", source="deep.yaml")


def test_duplicate_keys_are_errors_naming_the_key_and_both_lines() -> None:
    with pytest.raises(UsageError, match=r"dup.yaml:6:3: .*duplicate key 'count' \(first at line 5\)"):
        parse_recipe(HEAD + "trials:\n  count: 2\n  count: 3\n", source="dup.yaml")


def test_merge_keys_may_override_what_they_merge() -> None:
    recipe = parse_recipe(
        HEAD.replace("cases: [{prompt: p}]", "cases: [{id: a, prompt: p, sampling: &s {max_tokens: 8, seed: 1}}, "
                                             "{id: b, prompt: q, sampling: {<<: *s, max_tokens: 9}}]"))
    assert (recipe.cases[1].sampling.max_tokens, recipe.cases[1].sampling.seed) == (9, 1)


def test_a_large_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "large.yaml"
    path.write_text(HEAD + "description: '" + "x" * MAX_RECIPE_BYTES + "'\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"large\.yaml: larger than 256 KB"):
        load_recipe(path)


@pytest.mark.parametrize("value", ["true", "false", "1.0", "'2'"])
def test_counts_are_whole_numbers_not_booleans(value: str) -> None:
    with pytest.raises(UsageError, match=r"field 'trials\.count': Input should be a valid integer"):
        parse_recipe(HEAD + f"trials: {{count: {value}}}\n")


def write_observation(tmp_path: Path, raw: str) -> Path:
    path = tmp_path / "obs.json"
    path.write_text(raw, encoding="utf-8")
    return path


@pytest.mark.parametrize(("raw", "needle"), [
    ('{"extra": ' + "[" * 100_000 + "]" * 100_000 + "}", "JSON nested too deeply"),
    (json.dumps({"output_token_ids": [10**30]}), "field 'output_token_ids.0': Input should be less than 2147483648"),
    (json.dumps({"output_token_ids": [True]}), "field 'output_token_ids.0': Input should be a valid integer"),
    (json.dumps({"top_logprobs": [[[10**30, -1.0]]]}), "field 'top_logprobs.0.0.0'"),
    (json.dumps({"schema_version": 999}), "schema 999 is newer than this bisect-npu reads (1)"),
    (json.dumps({"schema_version": True}), "field 'schema_version'"),
])
def test_observations_that_cannot_be_judged_are_one_line(raw: str, needle: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write_observation(tmp_path, raw)
    with pytest.raises(UsageError) as refused:
        Observation.load(path)
    assert needle in str(refused.value)
    code, err = run_cli(["judge", "--recipe", "demo-presence-penalty", str(path)], capsys)
    assert code == NOT_A_VERDICT_EXIT and needle in err and len(err.strip().splitlines()) == 1


def test_an_observation_of_the_current_schema_loads(tmp_path: Path) -> None:
    path = write_observation(tmp_path, json.dumps({"schema_version": 1, "output_token_ids": [0, 2**31 - 1]}))
    assert Observation.load(path).output_token_ids == [0, 2**31 - 1]


@pytest.mark.parametrize(("argv", "needle"), [
    (["simulate", "--good", "a", "--bad", "b", "--culprit", "c", "--seed", "-1"], "'--seed': -1 is not in the range"),
    (["demo", "--case", ""], "'--case': is empty"),
    (["demo", "--case", "  "], "'--case': is empty"),
])
def test_options_out_of_range_are_usage_errors(argv: list[str], needle: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(argv, capsys)
    assert code == 2 and needle in err and "Traceback" not in err


def test_a_journal_line_whose_type_is_not_text_is_corrupt(tmp_path: Path) -> None:
    """Found by the fuzz test: `{"type": []}` reached a set lookup and ended in a TypeError."""
    header = {"type": "header", "options": {"good": "a", "bad": "b"},
              "range": {"kind": "commits", "good": "a", "bad": "b", "base": "a", "good_ref": "a", "bad_ref": "b",
                        "candidates": ["b"]}}
    (tmp_path / "journal.jsonl").write_text(json.dumps(header) + '\n{"type": []}\n{"type": "end"}\n', encoding="utf-8")
    with pytest.raises(UsageError, match=r"journal\.jsonl:2: not a valid journal line"):
        Journal.open(tmp_path, read_only=True)
