"""Every comparison of two observations is of one case: a reference of another prompt or model
vocabulary is refused in one line naming what differs (judge: 128, no verdict; align: 2), while a
golden of the same case from another backend, and a prompt that a regression changed within one
recipe's run, are still judged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bisect_npu import oracle
from bisect_npu.alignment.align import align_records
from bisect_npu.alignment.record import read_record
from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation
from bisect_npu.probe.request import case_input_digest, new_observation
from bisect_npu.recipe.loader import load_recipe
from tests.helpers.cli_exit import run_cli
from tests.helpers.records import make_record

RECIPE = "demo-rope-longseq"
IDENTITY = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "tokenizer": "0123456789abcdef"}
PROMPT = "please repeat the story of the old man and the sea"


def observation(*, recipe: str = RECIPE, run_digest: str | None = None, case_id: str = "long-generation",
                prompt: str = PROMPT, prompt_ids: list[int] | None = None, identity: dict[str, Any] | None = None,
                output: list[int] | None = None) -> Observation:
    """An observation as the probe pre-fills it from its request, with a run's ids filled in."""
    digest = load_recipe(RECIPE).run_digest() if run_digest is None and recipe == RECIPE else (run_digest or "")
    raw = new_observation({"recipe": recipe, "run_digest": digest, "case_id": case_id,
                           "case": {"prompt": prompt, "sampling": {"temperature": 0.0}}})
    raw.update(prompt_token_ids=prompt_ids or [5, 6, 7, 8], output_token_ids=output or [1, 2, 3, 4],
               top_logprobs=None)
    raw["extra"]["model_identity"] = identity or IDENTITY
    return Observation.model_validate(raw)


def write(path: Path, obs: Observation) -> str:
    path.write_text(obs.model_dump_json(), encoding="utf-8")
    return str(path)


def without_case_input(obs: Observation) -> Observation:
    """As a probe of before the case input digest wrote it."""
    copy = obs.model_copy(deep=True)
    copy.extra.pop("case_input")
    return copy


@pytest.mark.parametrize(("reference", "named"), [
    (observation(recipe="demo-presence-penalty", run_digest="other", prompt="tell me about the sea",
                 prompt_ids=[9, 10], identity={**IDENTITY, "vocab_size": 512, "tokenizer": "fedcba9876543210"},
                 output=[7, 7, 7]), "the model vocabulary (vocab_size 256 vs reference 512, tokenizer"),
    (observation(recipe="demo-presence-penalty", run_digest="other", prompt="tell me about the sea",
                 prompt_ids=[9, 10], output=[7, 7, 7]), "the prompt (case input digest"),
    (without_case_input(observation(recipe="demo-presence-penalty", run_digest="other", prompt_ids=[5, 9, 10],
                                    output=[7, 7, 7])), "the prompt token ids (from index 1; 4 ids vs reference 3)"),
], ids=["another-vocabulary", "another-prompt", "another-prompt-ids"])
def test_judge_refuses_a_reference_of_another_case(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    reference: Observation, named: str) -> None:
    obs = observation()
    if "case_input" not in reference.extra:
        obs = without_case_input(obs)
    code, out, err = run_cli(["judge", "--recipe", RECIPE, "--reference", write(tmp_path / "ref.json", reference),
                              write(tmp_path / "obs.json", obs)], capsys)
    assert code == 128 and not out, (code, out, err)
    assert named in err and "recipe demo-presence-penalty" in err and len(err.strip().splitlines()) == 1


def test_judge_refuses_references_none_of_which_is_of_the_case(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    reference = observation(recipe="demo-presence-penalty", run_digest="other", case_id="penalty")
    code, _, err = run_cli(["judge", "--recipe", RECIPE, "--reference", write(tmp_path / "ref.json", reference),
                            write(tmp_path / "obs.json", observation())], capsys)
    assert code == 128 and "no reference of case long-generation" in err and "penalty" in err


def test_a_golden_of_another_backend_of_the_same_case_is_judged(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    golden = observation(recipe="demo-golden-transformers", run_digest="hf", output=[1, 2, 9, 9])
    code, out, _ = run_cli(["judge", "--recipe", RECIPE, "--reference", write(tmp_path / "ref.json", golden),
                            write(tmp_path / "obs.json", observation())], capsys)
    assert code == 1 and "mismatch at token 2" in out


@pytest.mark.parametrize("old_probe", [False, True])
def test_a_prompt_a_regression_changed_within_one_run_is_a_finding(old_probe: bool) -> None:
    """One recipe at one run digest, the same case input: ids that differ are the prompt stage's
    finding (a chat template or tokenizer regression), not another case."""
    good, bad = observation(), observation(prompt_ids=[5, 6, 99, 8])
    if old_probe:
        good, bad = without_case_input(good), without_case_input(bad)
    cfg = load_recipe(RECIPE).oracle.model_copy(update={"kinds": ["stages"]})
    verdict = oracle.judge_observation(cfg, bad, good)
    assert verdict.kind.value == "bad" and "prompt_token_ids" in verdict.reason


def test_the_case_input_digest_is_the_prompt_not_its_sampling() -> None:
    assert case_input_digest({"prompt": "a", "sampling": {"seed": 1}}) == case_input_digest({"prompt": "a"})
    assert case_input_digest({"prompt": "a"}) != case_input_digest({"prompt": "b"})
    assert case_input_digest({"messages": [{"role": "user", "content": "a"}]}) != case_input_digest({"prompt": "a"})


def test_align_refuses_a_case_whose_observations_ran_another_prompt(tmp_path: Path) -> None:
    reference = make_record(tmp_path / "ref")
    candidate = make_record(tmp_path / "cand")
    for record, prompt in ((reference, "hello"), (candidate, "good bye")):
        path = record / "obs-c-t0.json"
        raw = Observation.model_validate_json(path.read_text())
        raw.extra["case_input"] = case_input_digest({"prompt": prompt})
        path.write_text(raw.model_dump_json())
    with pytest.raises(UsageError, match="another case than the observation of case c: it differs in the prompt"):
        align_records(read_record(reference), read_record(candidate))
