"""The ends' earlier results are read with the harness's own readers and checked against the
recipe before they stand for an end: each difference is named."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_npu.orchestration.earlier_results import control_ids, disagreement, earlier_for
from bisect_npu.recipe.loader import load_recipe

GOOD = "86797d44a7" + "0" * 30
ROWS = [{"id": f"qa-{i:02d}", "question": f"q{i}", "answer": "a"} for i in range(12)]


def lm_eval_samples(path: Path, correct: dict[str, float]) -> None:
    """A samples JSONL as lm-eval --log_samples writes it (doc, doc_id, filtered_resps, the metric)."""
    path.write_text("".join(json.dumps({"doc_id": n, "doc": row, "target": "a", "filtered_resps": [["a"]],
                                        "metrics": ["exact_match"], "exact_match": correct[row["id"]]}) + "\n"
                            for n, row in enumerate(ROWS)))


def recipe_with(tmp_path: Path, earlier: dict[str, object]) -> Path:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps({
        "name": "earlier", "model": {"path": "seed:0"},
        "engine": {"backend": "openai", "launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"]},
        "accuracy": {"harness": "lm_eval", "dataset": "data.jsonl", "lm_eval": {"task": "gsm8k"},
                     "sampling": {"temperature": 0.0, "max_tokens": 64}, "earlier_results": earlier},
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


def test_disagreement_counts_the_control_samples_that_flipped(tmp_path: Path) -> None:
    from bisect_npu.contracts import SampleOutcome

    earlier = [SampleOutcome(id=f"s{i}", correct=1.0) for i in range(10)]
    control = [SampleOutcome(id="s1", correct=1.0), SampleOutcome(id="s2", correct=0.0),
               SampleOutcome(id="s3", correct=0.75, runs=4)]
    assert disagreement(earlier, control) == (1, 3)
