"""A failing vllm-ascend nightly's own outputs stand for the bad end: the checkout it ran in, laid
out as its single-node test leaves it (AISBench runs under outputs/default/<TIMESTAMP>, the
benchmark JSON under benchmark_results/), read per sample and checked against the nightly case
the end runs (its commit, model, dataset, output length and batch size)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import git
import pytest

from bisect_npu.builders.local import LocalBuilder
from bisect_npu.errors import UsageError
from bisect_npu.nightly.cases import import_case, read_case_file
from bisect_npu.orchestration.running.earlier_results import check_given, check_models, earlier_for, given_ends
from bisect_npu.orchestration.session import Session
from bisect_npu.recipe.schema import EarlierEndSpec, EarlierResultsSpec, Recipe
from tests.helpers.asked import spec_of
from tests.helpers.cli_exit import run_cli
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.npu_accuracy import HarnessStandIn
from tests.helpers.paths import REPO_ROOT

BAD = "bf9fd6da37" + "1" * 30
RUN = "20261203_101500"
MODEL_ABBR = "vllm-api-general-chat"  # vllm_api_general_chat's abbr: the nightly's request_conf
CASE = """\
test_cases:
  - name: "tiny"
    model: "vllm-ascend/Tiny-W8A8"
    server_cmd: ["--max-num-seqs", "4"]
    benchmarks:
      acc:
        case_type: accuracy
        dataset_path: vllm-ascend/gsm8k-lite.jsonl
        request_conf: vllm_api_general_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_noncot_chat_prompt
        max_out_len: 64
        batch_size: 4
        baseline: 90
        threshold: 5
      perf:
        case_type: performance
        dataset_path: vllm-ascend/GSM8K-in3500-bs400
        max_out_len: 48
        batch_size: 4
        baseline: 800
        threshold: 0.97
"""
ROWS = [{"id": f"gsm-{i:02d}", "question": f"q{i}", "answer": str(i)} for i in range(8)]
CORRECT = [True, False, True, True, False, True, False, True]


def nightly_recipe(tmp_path: Path) -> Recipe:
    """The case's accuracy benchmark as `run --nightly-case` imports it, its dataset on this host."""
    data = tmp_path / "datasets"
    (data / "vllm-ascend").mkdir(parents=True)
    (data / "vllm-ascend" / "gsm8k-lite.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    path = "tests/e2e/nightly/single_node/models/configs/Tiny-W8A8.yaml"
    return import_case(read_case_file(CASE, path), path, "tiny", "acc", str(data))


def nightly_checkout(root: Path, *, commit: str = BAD, max_out_len: int = 64, details: bool = True,
                     rows: list[dict[str, Any]] = ROWS, correct: list[bool] = CORRECT,
                     model: str = "vllm-ascend/Tiny-W8A8", dataset: str = "gsm8k-lite.jsonl") -> Path:
    """The vllm-ascend checkout a single-node nightly ran in, as it leaves it: the accuracy
    benchmark's AISBench run over `rows` (and the performance one's, which has no results/), and
    the JSON its test writes for the job."""
    run = root / "outputs" / "default" / RUN
    (run / "results" / MODEL_ABBR).mkdir(parents=True)
    (run / "predictions" / MODEL_ABBR).mkdir(parents=True)
    (run / "summary").mkdir()
    result: dict[str, Any] = {"accuracy": 100.0 * sum(correct) / len(correct)}
    if details:
        result["details"] = [{"pred": [str(i) if ok else "0"], "answer": [str(i)], "correct": [ok]}
                             for i, ok in enumerate(correct)]
    (run / "results" / MODEL_ABBR / "gsm8k.json").write_text(json.dumps(result))
    (run / "predictions" / MODEL_ABBR / "gsm8k.jsonl").write_text("".join(
        json.dumps({"id": i, "origin_prompt": row["question"], "prediction": row["answer"] if correct[i] else "0",
                    "gold": row["answer"]}) + "\n" for i, row in enumerate(rows)))
    (run / "summary" / f"summary_{RUN}.csv").write_text(f"dataset,version,metric,mode,{MODEL_ABBR}\n"
                                                        f"gsm8k,1d7fe4,accuracy,gen,{result['accuracy']:.2f}\n")
    (root / "outputs" / "default" / "20261203_103000" / "performances" / MODEL_ABBR).mkdir(parents=True)
    (root / "benchmark_results").mkdir()
    (root / "benchmark_results" / "tiny.json").write_text(json.dumps({
        "model_name": model, "hardware": "A3", "dtype": "w8a8", "feature": [],
        "vllm_version": "0.20.2", "vllm_ascend_version": commit,
        "tasks": [{"name": dataset, "metrics": {"accuracy": round(result["accuracy"], 4)},
                   "test_input": {"max_out_len": max_out_len, "batch_size": 4},
                   "target": {"baseline": 90, "threshold": 5}, "pass_fail": "fail"},
                  {"name": "GSM8K-in3500-bs400", "metrics": {"Output_Token_Throughput(OTT)": 612.5},
                   "test_input": {"max_out_len": 48, "batch_size": 4}, "pass_fail": "fail"}],
        "serve_cmd": {"mix": "vllm serve vllm-ascend/Tiny-W8A8 --max-num-seqs 4"}, "environment": {},
        "pass_fail": "fail"}))
    return root


def test_the_failing_nightlys_checkout_stands_for_the_bad_end(tmp_path: Path) -> None:
    recipe = nightly_recipe(tmp_path)
    work = nightly_checkout(tmp_path / "vllm-ascend")
    given = given_ends([f"bad={BAD[:10]}:{work}"])
    check_given([f"bad={BAD[:10]}:{work}"], recipe)
    bad = earlier_for(recipe, "bad_end", BAD, given)
    assert bad is not None and bad.samples is not None, bad
    expected = [(row["id"], float(ok)) for row, ok in zip(ROWS, CORRECT, strict=True)]
    assert [(s.id, s.correct) for s in bad.samples] == expected
    assert bad.samples[1].output == "0" and bad.samples[1].target == "1"
    for named in (work / "outputs" / "default", work / "outputs" / "default" / RUN):  # the run, or the directory above
        again = earlier_for(recipe, "bad_end", BAD, given_ends([f"bad={BAD[:10]}:{named}"]))
        assert again is not None and again.samples == bad.samples


def test_what_the_nightlys_json_says_against_the_case_is_named_and_sets_them_aside(tmp_path: Path) -> None:
    recipe = nightly_recipe(tmp_path)
    other = "86797d44a7" + "2" * 30
    work = nightly_checkout(tmp_path / "vllm-ascend", commit=other, max_out_len=128)
    bad = earlier_for(recipe, "bad_end", BAD, given_ends([f"bad={BAD[:10]}:{work}"]))
    assert bad is not None and bad.samples is None
    assert bad.why_not == (f"the nightly ran at {other[:12]} (tiny.json), this end is {BAD[:12]}; "
                           "the nightly's max_out_len was 128, the case's is 64")


def test_a_nightly_run_without_per_sample_details_says_how_to_score_it_again(tmp_path: Path) -> None:
    recipe = nightly_recipe(tmp_path)
    work = nightly_checkout(tmp_path / "vllm-ascend", details=False)
    with pytest.raises(UsageError, match=rf"the nightly runs it without --dump-eval-details\); score its predictions "
                                         rf"again where it ran: .*`-m eval --reuse {RUN} --dump-eval-details`"):
        check_given([f"bad={BAD[:10]}:{work}"], recipe)


def test_a_checkout_with_two_accuracy_runs_asks_for_the_one_of_this_benchmark(tmp_path: Path) -> None:
    recipe = nightly_recipe(tmp_path)
    work = nightly_checkout(tmp_path / "vllm-ascend")
    (work / "outputs" / "default" / "20261203_110000" / "results" / MODEL_ABBR).mkdir(parents=True)
    with pytest.raises(UsageError, match=rf"holds 2 AISBench runs \({RUN}, 20261203_110000\); give the one of this "
                                         "benchmark, e.g. "):
        check_given([f"bad={BAD[:10]}:{work}"], recipe)


DEMO_DATASETS = REPO_ROOT / "bisect_npu" / "recipes" / "data"


@pytest.mark.e2e
def test_a_nightly_case_run_refuses_a_checkout_without_details_or_of_another_model_before_anything_runs(
        demo_upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from bisect_npu.demo import nightly as demo_nightly

    repo, manifest = demo_upstream
    truth = manifest.case(demo_nightly.DEMO_CASE)
    rows = [json.loads(line) for line in (DEMO_DATASETS / "demo-accuracy" / "qa.jsonl").read_text().splitlines()
            if line.strip()]
    work = nightly_checkout(tmp_path / "vllm-ascend", commit=truth.bad_sha, max_out_len=4, details=False, rows=rows,
                            correct=[i % 2 == 0 for i in range(len(rows))], model="seed:0", dataset="qa.jsonl")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["run", "--repo", str(repo), "--good", truth.good_sha, "--bad", truth.bad_sha,
                              "--nightly-case", f"{demo_nightly.CASE_PATH}::{demo_nightly.CASE_NAME}::acc",
                              "--nightly-datasets", str(DEMO_DATASETS), "--session", str(tmp_path / "s"),
                              "--earlier-results", f"bad={truth.bad_sha}:vllm-ascend"], capsys)
    assert code == 2, (out, err)
    line = err.strip().splitlines()[-1]
    assert f"--earlier-results bad={truth.bad_sha}:{work}: " in line
    assert "holds AISBench's aggregate score only (the nightly runs it without --dump-eval-details)" in line
    assert f"`-m eval --reuse {RUN} --dump-eval-details`" in line
    assert not (tmp_path / "s").exists()
    nightly_checkout(tmp_path / "other", commit=truth.bad_sha, max_out_len=4, rows=rows, model="another/Model",
                     correct=[True] * len(rows), dataset="qa.jsonl")  # another model's run, with its details
    code, out, err = run_cli(["run", "--repo", str(repo), "--good", truth.good_sha, "--bad", truth.bad_sha,
                              "--nightly-case", f"{demo_nightly.CASE_PATH}::{demo_nightly.CASE_NAME}::acc",
                              "--nightly-datasets", str(DEMO_DATASETS), "--session", str(tmp_path / "s"),
                              "--earlier-results", f"bad={truth.bad_sha}:other"], capsys)
    assert code == 2 and "the nightly served another/Model, the case " in err.strip().splitlines()[-1], (out, err)
    assert not (tmp_path / "s").exists()


def test_a_nightly_of_another_model_is_refused_before_anything_runs_and_one_naming_none_is_read(
        tmp_path: Path) -> None:
    """A checkout whose benchmark JSON says it served another model than the case's is another
    case's run (the same dataset and inputs, another model): refused naming both models and what to
    give, up front (given on the command line or in the recipe) and at the end's step alike, as
    `--nightly-result` refuses one; a JSON naming no model is read."""
    recipe = nightly_recipe(tmp_path)
    other = nightly_checkout(tmp_path / "other", model="vllm-ascend/Qwen3-32B-W8A8")
    given = f"bad={BAD[:10]}:{other}"
    refused = (rf"--earlier-results {given}: {other}/benchmark_results/tiny.json: the nightly served "
               rf"vllm-ascend/Qwen3-32B-W8A8, the case {recipe.name} serves {recipe.model.path}; its results are "
               rf"not a run of this case: give the checkout of the nightly job that ran {recipe.name} "
               r"\(--earlier-results END=COMMIT:PATH\), or the --nightly-case of the model it served")
    with pytest.raises(UsageError, match=refused):
        check_models(recipe, [given])
    assert recipe.accuracy is not None
    own = recipe.model_copy(update={"accuracy": recipe.accuracy.model_copy(update={
        "earlier_results": EarlierResultsSpec(bad=EarlierEndSpec(path=str(other), commit=BAD[:10]))})})
    with pytest.raises(UsageError, match=r"^the recipe's earlier_results\.bad: .* the nightly served vllm-ascend/"):
        check_models(own)
    with pytest.raises(UsageError, match="its results are not a run of this case"):
        earlier_for(recipe, "bad_end", BAD, given_ends([given]))
    unnamed = nightly_checkout(tmp_path / "unnamed", model="")
    check_models(recipe, [f"bad={BAD[:10]}:{unnamed}"])
    read = earlier_for(recipe, "bad_end", BAD, given_ends([f"bad={BAD[:10]}:{unnamed}"]))
    assert read is not None and read.samples is not None and len(read.samples) == len(ROWS)


def test_a_resume_refuses_a_nightly_replaced_since_by_another_models(tmp_path: Path) -> None:
    """A resumed session makes the up-front model check a new one makes: the nightly checkout the
    session started with, its benchmark JSON since rewritten by another model's job, is refused
    before anything runs (naming both models, and how to go on), where the same checkout resumes."""
    recipe = tmp_path / "tiny-acc.json"
    recipe.write_text(json.dumps(nightly_recipe(tmp_path).model_dump(mode="json", exclude_none=True)))
    shas = make_linear_repo(tmp_path / "repo", 3, culprit=2)
    work = nightly_checkout(tmp_path / "vllm-ascend", commit=shas[-1])
    spec = spec_of(good=shas[0], bad=shas[-1], repo=str(tmp_path / "repo"), recipe=str(recipe), propose_fix=False,
                   earlier_results=[f"bad={shas[-1]}:{work}"])

    def builder(name: str) -> LocalBuilder:
        return LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / name, ["true"])

    Session.start(spec, session_dir=tmp_path / "s", builder=builder("w0"), executor=HarnessStandIn()).close()
    Session.resume(tmp_path / "s", builder=builder("w1"), executor=HarnessStandIn()).close()
    served = work / "benchmark_results" / "tiny.json"
    served.write_text(json.dumps({**json.loads(served.read_text()), "model_name": "vllm-ascend/Qwen3-32B-W8A8"}))
    with pytest.raises(UsageError, match=r"^--earlier-results bad=.*: the nightly served vllm-ascend/Qwen3-32B-W8A8, "
                                         r"the case tiny-acc serves vllm-ascend/Tiny-W8A8; .*; to resume, put back the "
                                         r"nightly's results the session started with, or start a new session"):
        Session.resume(tmp_path / "s", builder=builder("w2"), executor=HarnessStandIn())
