"""The ends' earlier results are read with the harness's own readers and checked against the
recipe before they stand for an end: each difference is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.observations import SampleOutcome
from bisect_npu.orchestration.running.earlier_results import (
    FIRST_STAGE,
    control_ids,
    control_stages,
    control_standing,
    disagreement,
    earlier_for,
    earlier_settings,
    given_ends,
    settled_given,
)
from bisect_npu.recipe.loader import load_recipe
from tests.helpers.cli_exit import run_cli

GOOD = "86797d44a7" + "0" * 30
ROWS = [{"id": f"qa-{i:02d}", "question": f"q{i}", "answer": "a"} for i in range(12)]


def lm_eval_samples(path: Path, correct: dict[str, float]) -> None:
    """A samples JSONL as lm-eval --log_samples writes it (doc, doc_id, filtered_resps, the metric)."""
    path.write_text("".join(json.dumps({"doc_id": n, "doc": row, "target": "a", "filtered_resps": [["a"]],
                                        "metrics": ["exact_match"], "exact_match": correct[row["id"]]}) + "\n"
                            for n, row in enumerate(ROWS)))


def recipe_with(tmp_path: Path, earlier: dict[str, object] | None) -> Path:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps({
        "name": "earlier", "model": {"path": "seed:0"},
        "engine": {"backend": "openai", "launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"]},
        "accuracy": {"harness": "lm_eval", "dataset": "data.jsonl", "lm_eval": {"task": "gsm8k"},
                     "sampling": {"temperature": 0.0, "max_tokens": 64},
                     **({"earlier_results": earlier} if earlier is not None else {})},
        "oracle": {"kinds": ["accuracy"]}}))
    return path


def test_lm_evals_samples_stand_for_the_good_end_and_every_difference_is_named(tmp_path: Path) -> None:
    lm_eval_samples(tmp_path / "samples_gsm8k.jsonl", {row["id"]: float(i % 3 != 0) for i, row in enumerate(ROWS)})
    recipe = load_recipe(recipe_with(tmp_path, {
        "good": {"path": "samples_gsm8k.jsonl", "commit": GOOD[:10]},
        "bad": {"path": "samples_gsm8k.jsonl", "commit": "bf9fd6da37", "harness": "command",
                "sampling": {"temperature": 0.6, "max_tokens": 64}}}))
    good = earlier_for(recipe, "good_end", GOOD)
    assert good is not None and good.samples is not None
    assert [s.id for s in good.samples] == [row["id"] for row in ROWS]
    assert [s.correct for s in good.samples][:4] == [0.0, 1.0, 1.0, 0.0]
    bad = earlier_for(recipe, "bad_end", "0" * 40)
    assert bad is not None and bad.samples is None
    assert bad.why_not == ("they ran at bf9fd6da37, this end is 000000000000; they come from harness command, the "
                           "recipe's is lm_eval; sampling temperature was 0.6, the recipe's is 0.0")
    assert earlier_for(recipe, "candidate", GOOD) is None


def test_results_of_another_dataset_are_set_aside_naming_the_ids(tmp_path: Path) -> None:
    lm_eval_samples(tmp_path / "samples_gsm8k.jsonl", {row["id"]: 1.0 for row in ROWS})
    recipe = load_recipe(recipe_with(tmp_path, {"good": {"path": "samples_gsm8k.jsonl", "commit": GOOD[:10]}}))
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({**row, "id": f"x-{row['id']}"}) + "\n" for row in ROWS))
    good = earlier_for(recipe, "good_end", GOOD)
    assert good is not None and good.samples is None
    assert good.why_not == ("the sample ids differ from the dataset's: 12 dataset samples missing (first x-qa-00), "
                            "12 samples not in the dataset (first qa-00)")


def test_the_control_share_is_fixed_per_end_and_at_least_five_samples(tmp_path: Path) -> None:
    ids = [f"s{i}" for i in range(200)]
    chosen = control_ids(ids, 0.1, GOOD)
    assert len(chosen) == 20 and chosen == control_ids(ids, 0.1, GOOD) and chosen != control_ids(ids, 0.1, "f" * 40)
    assert chosen == [i for i in ids if i in set(chosen)]  # in dataset order
    assert len(control_ids(ids[:12], 0.1, GOOD)) == 5


@given(size=st.integers(1, 400), share=st.floats(0.01, 1.0), commit=st.sampled_from([GOOD, "f" * 40]))
@settings(max_examples=60, deadline=None)
def test_the_control_stages_split_the_control_share_half_first(size: int, share: float, commit: str) -> None:
    ids = [f"s{i}" for i in range(size)]
    stages = control_stages(ids, share, commit)
    whole = control_ids(ids, share, commit)
    assert sorted(i for stage in stages for i in stage) == sorted(whole)  # a split: nothing twice, nothing more
    assert all(stage == [i for i in ids if i in set(stage)] for stage in stages)  # each in dataset order
    assert len(stages[0]) == min(len(whole), max(FIRST_STAGE, len(whole) // 2))
    assert stages == control_stages(ids, share, commit)  # the same on a resume


def test_a_control_share_of_five_runs_two_samples_first() -> None:
    """30 samples at a 10% share: 5 control samples, 2 run first and the other 3 only when one
    of those differs (each sample run first costs a round of runs at both ends)."""
    stages = control_stages([f"s{i}" for i in range(30)], 0.1, GOOD)
    assert [len(stage) for stage in stages] == [2, 3]


def outcomes(pattern: list[bool]) -> tuple[list[SampleOutcome], list[SampleOutcome]]:
    """(earlier, control) results over len(pattern) samples, sample i differing where pattern[i]."""
    earlier = [SampleOutcome(id=f"s{i}", correct=1.0) for i in range(len(pattern))]
    control = [SampleOutcome(id=f"s{i}", correct=0.0 if differs else 1.0) for i, differs in enumerate(pattern)]
    return earlier, control


@given(pattern=st.lists(st.booleans(), min_size=5, max_size=40), limit=st.sampled_from([0.0, 0.25, 0.5]))
@settings(max_examples=200, deadline=None)
def test_the_staged_control_check_lets_through_only_what_the_first_stage_could_not_see(
        pattern: list[bool], limit: float) -> None:
    earlier, control = outcomes(pattern)
    first = max(FIRST_STAGE, len(pattern) // 2)
    after_first = control_standing(earlier, control[:first], limit, complete=False)
    staged = after_first if after_first is not None else control_standing(earlier, control, limit, complete=True)
    whole = sum(pattern) <= limit * len(pattern)
    assert staged == (not any(pattern[:first]) or whole)
    if staged and not whole:  # only results whose every differing sample the first stage did not run
        assert not any(pattern[:first]) and any(pattern[first:])
    assert after_first is None or not any(pattern[:first])  # a difference in the first stage runs the rest


def test_a_staged_control_check_sets_aside_results_that_differ_over_the_share() -> None:
    earlier, control = outcomes([False, True, False, True, False])
    assert control_standing(earlier, control[:3], 0.25, complete=False) is None
    assert control_standing(earlier, control, 0.25, complete=True) is False
    earlier, control = outcomes([False, True, False, False, False])
    assert control_standing(earlier, control, 0.25, complete=True) is True


def test_disagreement_counts_the_control_samples_that_flipped(tmp_path: Path) -> None:
    from bisect_npu.observations import SampleOutcome

    earlier = [SampleOutcome(id=f"s{i}", correct=1.0) for i in range(10)]
    control = [SampleOutcome(id="s1", correct=1.0), SampleOutcome(id="s2", correct=0.0),
               SampleOutcome(id="s3", correct=0.75, runs=4)]
    assert disagreement(earlier, control) == (1, 3)


@pytest.mark.parametrize(("given", "said"), [
    (["good:86797d44a7"], "give END=COMMIT:PATH (END good or bad"),
    (["best=86797d44a7:samples_gsm8k.jsonl"], "best before '=' is not an end; name the end the results are of, "
                                               "good or bad"),
    (["good=main:samples_gsm8k.jsonl"], "main is not a commit sha; give the sha (7 to 40 hex digits)"),
    (["good=86797d44a7:runs/missing.jsonl"], "runs/missing.jsonl does not exist; give lm-eval's samples_*.jsonl "
                                             "or its --output_path directory (harness lm_eval, the recipe's)"),
    (["bad=bf9fd6da37:data.jsonl"], "data.jsonl is not what harness lm_eval (the recipe's) writes ("),
    (["bad=bf9fd6da37:samples_gsm8k.jsonl", "bad=bf9fd6da37:samples_gsm8k.jsonl"],
     "names the bad end twice; give each end once"),
])
def test_each_mistake_in_earlier_results_is_one_line_naming_it_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, given: list[str],
        said: str) -> None:
    lm_eval_samples(tmp_path / "samples_gsm8k.jsonl", {row["id"]: 1.0 for row in ROWS})
    recipe = recipe_with(tmp_path, {})
    monkeypatch.chdir(tmp_path)
    options = [word for text in given for word in ("--earlier-results", text)]
    code, out, err = run_cli(["run", "--good", "86797d44a7", "--bad", "bf9fd6da37", "--recipe", str(recipe),
                              "--session", str(tmp_path / "s"), *options], capsys)
    assert code == 2, (out, err)
    assert said in err.strip().splitlines()[-1]
    assert not (tmp_path / "s").exists()  # refused before the session was made


def test_earlier_results_need_an_accuracy_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    lm_eval_samples(tmp_path / "samples_gsm8k.jsonl", {row["id"]: 1.0 for row in ROWS})
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["run", "--good", "86797d44a7", "--bad", "bf9fd6da37", "--cmd", "true",
                              "--earlier-results", "good=86797d44a7:samples_gsm8k.jsonl"], capsys)
    assert code == 2, (out, err)
    assert "--earlier-results gives an accuracy harness's per-sample results: it needs a recipe with an accuracy " \
           "section" in err.strip().splitlines()[-1]


def test_earlier_results_given_replace_the_recipes_for_their_end_only(tmp_path: Path) -> None:
    lm_eval_samples(tmp_path / "samples_gsm8k.jsonl", {row["id"]: 1.0 for row in ROWS})
    recipe = load_recipe(recipe_with(tmp_path, {"good": {"path": "samples_gsm8k.jsonl", "commit": "bf9fd6da37"},
                                                "bad": {"path": "samples_gsm8k.jsonl", "commit": "bf9fd6da37"},
                                                "control_share": 0.5}))
    given = given_ends(settled_given([f"good={GOOD[:12]}:{tmp_path / 'samples_gsm8k.jsonl'}"]))
    settings = earlier_settings(recipe, given)
    assert settings is not None and settings.control_share == 0.5
    assert settings.good is not None and settings.good.commit == GOOD[:12]
    assert settings.bad is not None and settings.bad.commit == "bf9fd6da37"
    good = earlier_for(recipe, "good_end", GOOD, given)
    assert good is not None and good.samples is not None and len(good.samples) == len(ROWS)
    no_section = load_recipe(recipe_with(tmp_path, None))
    assert earlier_settings(no_section, given) is not None  # the option alone: the defaults' control share


def test_a_dataset_the_end_cannot_read_sets_them_aside_naming_it(tmp_path: Path) -> None:
    lm_eval_samples(tmp_path / "samples_gsm8k.jsonl", {row["id"]: 1.0 for row in ROWS})
    recipe = load_recipe(recipe_with(tmp_path, {"good": {"path": "samples_gsm8k.jsonl", "commit": GOOD[:10]}}))
    (tmp_path / "data.jsonl").unlink()
    good = earlier_for(recipe, "good_end", GOOD)
    assert good is not None and good.samples is None
    assert good.why_not.startswith(f"cannot be read (the dataset {tmp_path / 'data.jsonl'} does not exist")
