"""`--nightly-result`: the throughput a nightly measured at an end, put into the performance
benchmark's recipe as `oracle.throughput.earlier_runs` (the levels search counts it as a run)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import git
import pytest

from bisect_npu.errors import UsageError
from bisect_npu.nightly.at_commit import CaseBenchmark, nightly_results, settle_run, with_earlier_runs
from bisect_npu.nightly.cases import CaseRef, import_case, pick_benchmark, picked_case, read_case_file
from bisect_npu.nightly.outputs import OTT
from bisect_npu.recipe.loader import load_recipe
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.npu_throughput import CASE_PATH, PERF_CASE
from tests.helpers.paths import DATA


def test_the_values_given_per_end_become_the_recipes_earlier_runs() -> None:
    earlier, said = nightly_results(["bad=951.2", "good=1003 token/s", "bad=948"])
    assert said == [] and earlier is not None and earlier.bad == [951.2, 948.0] and earlier.good == [1003.0]
    recipe = import_case(read_case_file(PERF_CASE, CASE_PATH), CASE_PATH, "speed-a2", "perf")
    changed = with_earlier_runs(recipe, earlier, CaseRef.parse(f"{CASE_PATH}::speed-a2::perf"))
    assert changed.oracle.throughput is not None
    assert changed.oracle.throughput.earlier_levels() == ((1003.0,), (951.2, 948.0))
    assert changed.digest() != recipe.digest()  # a resume finds the recipe it ran
    assert nightly_results([]) == (None, [])


@pytest.mark.parametrize(("text", "said"), [("951", "END=TOKENS_PER_S"), ("worst=951", "END=TOKENS_PER_S"),
                                            ("bad=fast", "fast is not a number of tokens/s nor a nightly's"),
                                            ("bad=-951", "positive number"), ("bad=0", "positive number")])
def test_what_is_no_end_or_no_throughput_is_refused_naming_the_form(text: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        nightly_results([text])


# -- read from the nightly's benchmark_results JSON ------------------------------------------------

PERF = {"case_type": "performance", "dataset_path": "vllm-ascend/GSM8K-in3500-bs400", "num_prompts": 304,
        "batch_size": 76, "baseline": 1000, "threshold": 0.97}
BENCHMARK = CaseBenchmark("speed-a2", "perf", PERF)
BAD = "86797d44a7" + "1" * 30


def nightly_json(folder: Path, name: str = "speed-a2", commit: str = BAD, ott: Any = 951.2,
                 batch_size: int = 76, model: str | None = "tiny") -> Path:
    """A benchmark_results JSON in the shape the nightly's test_single_node.py writes: an accuracy
    task and the performance one (its AISBench figures, units stripped, under the nightly's names);
    `model` its `model_name` (None: the key left out)."""
    metrics: dict[str, Any] = {"Benchmark_Duration(BD)": 512.3, "Input_Token_Throughput(ITT)": 2100.5}
    if ott is not None:
        metrics[OTT] = ott
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({
        **({"model_name": model} if model is not None else {}), "hardware": "A2", "dtype": "bf16",
        "feature": ["aclgraph"], "vllm_version": "0.20.2",
        "vllm_ascend_version": commit,
        "tasks": [{"name": "gsm8k-lite", "metrics": {"accuracy": 88.1}, "test_input": {"max_out_len": 64},
                   "target": {"baseline": 90, "threshold": 5}, "pass_fail": "pass"},
                  {"name": "GSM8K-in3500-bs400", "metrics": metrics,
                   "test_input": {"num_prompts": 304, "batch_size": batch_size},
                   "target": {"baseline": 1000, "threshold": 0.97}, "pass_fail": "fail"}],
        "serve_cmd": {"mix": "vllm serve tiny"}, "environment": {}, "pass_fail": "fail"}, indent=2))
    return path


def test_the_failing_nightlys_json_gives_the_bad_ends_value_by_file_folder_or_checkout(tmp_path: Path) -> None:
    file = nightly_json(tmp_path / "checkout" / "benchmark_results")
    for given in (file, file.parent, tmp_path / "checkout"):
        earlier, said = nightly_results([f"bad={given}", "good=1003"], BENCHMARK, {"bad": BAD, "good": None})
        assert earlier is not None and earlier.bad == [951.2] and earlier.good == [1003.0]
        assert said == [f"--nightly-result bad={given}: 951.2 tokens/s ({OTT}) from {file} (model_name tiny)"]
        assert earlier.source == f"--nightly-result bad={file.resolve()} (model_name tiny); good=1003"
    assert nightly_results([f"bad={file}"], BENCHMARK, {"bad": None})[0] is not None  # the end's commit not known yet


def test_aisbenchs_own_figure_with_its_unit_is_read_and_another_unit_refused(tmp_path: Path) -> None:
    file = nightly_json(tmp_path, ott="951.2 token/s")
    earlier, _ = nightly_results([f"bad={file}"], BENCHMARK)
    assert earlier is not None and earlier.bad == [951.2]
    nightly_json(tmp_path, ott="12.5 ms")
    with pytest.raises(UsageError, match=r"speed-a2.json: Output_Token_Throughput\(OTT\) is '12.5 ms', in ms, "
                                         "not tokens/s"):
        nightly_results([f"bad={file}"], BENCHMARK)


@pytest.mark.parametrize(("write", "said"), [
    (lambda d: None, r"does not exist; give the nightly's benchmark_results JSON"),
    (lambda d: d.mkdir(), r"holds no benchmark_results JSON"),
    (lambda d: nightly_json(d, ott=None), r"the task GSM8K-in3500-bs400 has no Output_Token_Throughput\(OTT\) in "
                                          r"speed-a2.json \(Benchmark_Duration\(BD\), Input_Token_Throughput"),
    (lambda d: nightly_json(d, batch_size=4), r"no task GSM8K-in3500-bs400 \(benchmark perf of speed-a2\) in "
                                              r"speed-a2.json \(their tasks: GSM8K-in3500-bs400, gsm8k-lite\)"),
    (lambda d: nightly_json(d, commit="0123456789ab"), r"the nightly ran at 0123456789ab, this end is 86797d44a711; "
                                                       r"its throughput is not a run of this end"),
])
def test_a_json_that_does_not_give_this_ends_throughput_is_refused_naming_why(
        tmp_path: Path, write: Callable[[Path], object], said: str) -> None:
    write(tmp_path / "results")
    with pytest.raises(UsageError, match=said):
        nightly_results([f"bad={tmp_path / 'results'}"], BENCHMARK, {"bad": BAD})


def test_a_file_of_another_model_is_refused_naming_both_and_one_naming_none_is_read(tmp_path: Path) -> None:
    """Its task may share the case's dataset and inputs (as the nightly's cases of one dataset do):
    the `model_name` tells it is another case's run; a hub id and a local copy ending in it agree."""
    of_case = CaseBenchmark("speed-a2", "perf", PERF, "Org/Tiny")
    file = nightly_json(tmp_path / "other", model="Org/Big")
    with pytest.raises(UsageError, match=r"speed-a2.json: the nightly served Org/Big, the case speed-a2 serves "
                                         r"Org/Tiny; its throughput is not a run of this case: give the JSON of "
                                         r"the nightly job that ran speed-a2 \(--nightly-result END=PATH\)"):
        nightly_results([f"bad={file}"], of_case, {"bad": BAD})
    for served in ("Org/Tiny", "/models/Org/Tiny"):
        earlier, _ = nightly_results([f"bad={nightly_json(tmp_path / 'own', model=served)}"], of_case, {"bad": BAD})
        assert earlier is not None and earlier.bad == [951.2] and f"(model_name {served})" in earlier.source
    unnamed = nightly_json(tmp_path / "unnamed", model=None)
    earlier, said = nightly_results([f"bad={unnamed}"], of_case, {"bad": BAD})
    assert earlier is not None and earlier.bad == [951.2]
    assert said == [f"--nightly-result bad={unnamed}: 951.2 tokens/s ({OTT}) from {unnamed} (no model_name: its "
                    "model not checked)"]  # the line printed before the build says so too
    assert earlier.source == f"--nightly-result bad={unnamed.resolve()} (no model_name: its model not checked)"


def test_of_several_files_the_one_run_at_the_end_else_the_cases_own_is_read_and_said(tmp_path: Path) -> None:
    nightly_json(tmp_path, "other-job", commit="0123456789ab", ott=700.0)
    nightly_json(tmp_path, "speed-a2", ott=951.2)
    earlier, said = nightly_results([f"bad={tmp_path}"], BENCHMARK, {"bad": BAD})
    assert earlier is not None and earlier.bad == [951.2]
    assert said[0].endswith("(model_name tiny; of 2 files with task GSM8K-in3500-bs400, the one run at 86797d44a711)")
    earlier, said = nightly_results([f"bad={tmp_path}"], BENCHMARK, {"bad": None})
    assert earlier is not None and earlier.bad == [951.2]
    assert said[0].endswith("(model_name tiny; of 2 files with task GSM8K-in3500-bs400, the one named after case "
                            "speed-a2)")
    (tmp_path / "speed-a2.json").rename(tmp_path / "job-2.json")
    with pytest.raises(UsageError, match=r"2 tasks GSM8K-in3500-bs400 in job-2.json \(model tiny, ran 86797d44a711"
                                         r"\), other-job.json \(model tiny, ran 0123456789ab\), none told apart by "
                                         "its commit, by the case's name speed-a2 or by its model tiny; give the one "
                                         "file: --nightly-result END=.*job-2.json, say"):
        nightly_results([f"bad={tmp_path}"], CaseBenchmark("speed-a2", "perf", PERF, "tiny"), {"bad": None})


def test_run_reads_the_json_into_the_bad_ends_recipe_and_says_which_file(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    shas = make_linear_repo(tmp_path / "up", 3, files=lambda i: {CASE_PATH: PERF_CASE})
    file = nightly_json(tmp_path / "nightly", commit=shas[-1])
    settled = settle_run(str(tmp_path / "up"), "HEAD", shas[0], f"{CASE_PATH}::speed-a2::perf", None, None, None,
                         None, "single_node", None, results=(f"bad={tmp_path / 'nightly'}",))
    assert settled.recipe is not None
    throughput = load_recipe(settled.recipe).oracle.throughput
    assert throughput is not None and throughput.earlier_runs is not None
    assert throughput.earlier_runs.bad == [951.2] and str(file.resolve()) in throughput.earlier_runs.source
    assert settled.owed[0] == (f"--nightly-result bad={tmp_path / 'nightly'}: 951.2 tokens/s ({OTT}) from {file} "
                               "(model_name tiny)")
    # under --find-fix the failing nightly ran at the old end (--good): its file is read for that commit
    old = nightly_json(tmp_path / "old", commit=shas[0])
    fix = settle_run(str(tmp_path / "up"), "HEAD", shas[0], f"{CASE_PATH}::speed-a2::perf", None, None, None,
                     None, "single_node", None, results=(f"bad={old}",), find_fix=True)
    assert fix.owed[0] == f"--nightly-result bad={old}: 951.2 tokens/s ({OTT}) from {old} (model_name tiny)"
    with pytest.raises(UsageError, match=f"the nightly ran at {shas[-1][:12]}, this end is {shas[0][:12]}"):
        settle_run(str(tmp_path / "up"), "HEAD", shas[0], f"{CASE_PATH}::speed-a2::perf", None, None, None,
                   None, "single_node", None, results=(f"bad={file}",), find_fix=True)
    accuracy = PERF_CASE.replace("performance", "accuracy").replace("baseline: 1000", "baseline: 90")
    make_linear_repo(tmp_path / "acc", 2, files=lambda i: {CASE_PATH: accuracy})
    for given in (file, tmp_path / "absent" / "speed-a2.json"):  # refused before any file is read
        with pytest.raises(UsageError, match="is an accuracy benchmark \\(give its results with --earlier-results\\)"):
            settle_run(str(tmp_path / "acc"), "HEAD", "HEAD~1", f"{CASE_PATH}::speed-a2", None, None, None, None,
                       "single_node", None, results=(f"bad={given}",))


# -- the multi-node nightly's JSON -----------------------------------------------------------------

MULTI_PATH = "tests/e2e/nightly/multi_node/internal_dp/config/two-nodes.yaml"


def multi_node_benchmark() -> CaseBenchmark:
    """The perf benchmark of the two-node fixture as `CaseBenchmark.at` reads it (its accuracy
    benchmark has the same dataset, so its task the same name; only its test inputs differ)."""
    raw = read_case_file((DATA / "nightly-multi-node" / "two-nodes.yaml").read_text(), MULTI_PATH)
    case = picked_case(raw, MULTI_PATH, None)
    key, bench = pick_benchmark(case, "perf", MULTI_PATH)
    return CaseBenchmark(str(case["name"]), key, {**bench, "num_warmups": 2}, str(raw["model"]))


def multi_node_json(folder: Path, ref: str = "main", ott: float = 2210.4, job: str = "tiny-dp",
                    model: str = "Org/Tiny-MoE") -> Path:
    """What the multi-node nightly's workflow uploads: its master node's `<branch>-<job>.json`,
    alone in the artifact's folder. Its tasks as the single-node one's (name rule, metric names),
    their test inputs with `num_warmups`; `vllm_ascend_version` the ref the run was given (a
    branch unless dispatched at a commit); `serve_cmd` per node; no `pass_fail` of the whole."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"main-multi-node-{job}.json"
    path.write_text(json.dumps({
        "model_name": model, "hardware": "A3", "dtype": "bf16", "feature": ["expert_parallel"],
        "vllm_version": "0.20.2", "vllm_ascend_version": ref,
        "tasks": [{"name": "tiny-set", "metrics": {"accuracy": 81.25},
                   "test_input": {"max_out_len": 512, "batch_size": 8},
                   "target": {"baseline": 80, "threshold": 4}, "pass_fail": "pass"},
                  {"name": "tiny-set", "metrics": {"Benchmark_Duration(BD)": 96.1, OTT: ott,
                                                    "Total_Token_Throughput(TTT)": 9310.7, "TPOT": 41.2},
                   "test_input": {"max_out_len": 256, "batch_size": 8, "num_warmups": 2},
                   "target": {"baseline": 1000, "threshold": 0.97}, "pass_fail": "pass"}],
        "serve_cmd": {"dp": {"node0": ["--data-parallel-size", "4"], "node1": ["--headless"]}},
        "environment": {"HCCL_BUFFSIZE": "512"}}, indent=2))
    return path


def test_the_multi_node_nightlys_artifact_gives_the_performance_tasks_value(tmp_path: Path) -> None:
    """Its file or its folder; the accuracy task of the same name is told apart by its inputs, and
    a branch for its version (nothing to check against the end's commit) is read at any end."""
    file = multi_node_json(tmp_path / "nightly-test-benchmark-results-main-multi-node-tiny-dp-20261205")
    for given in (file, file.parent):
        earlier, said = nightly_results([f"bad={given}"], multi_node_benchmark(), {"bad": BAD})
        assert earlier is not None and earlier.bad == [2210.4]
        assert said == [f"--nightly-result bad={given}: 2210.4 tokens/s ({OTT}) from {file} (model_name "
                        "Org/Tiny-MoE; it ran main: its commit unknown, not checked against the end's)"]
        assert earlier.source == (f"--nightly-result bad={file.resolve()} (model_name Org/Tiny-MoE; it ran main: its "
                                  "commit unknown, not checked against the end's)")


def test_several_multi_node_artifacts_in_one_folder_are_told_apart_by_the_model(tmp_path: Path) -> None:
    """Named after the workflow's matrix, not the case, and run at `main`: the one of the case's
    model is read and said; two of that model are refused naming each file, its model and ref."""
    text = (DATA / "nightly-multi-node" / "two-nodes.yaml").read_text()
    shas = make_linear_repo(tmp_path / "up", 1, files=lambda i: {MULTI_PATH: text})
    read = CaseBenchmark.at(git.Repo(tmp_path / "up"), shas[-1], CaseRef(MULTI_PATH, None, "perf"))
    assert (read.case, read.key, read.model) == ("tiny two-node data parallel", "perf", "Org/Tiny-MoE")
    folder = tmp_path / "artifacts"
    multi_node_json(folder, job="big-ep", model="Org/Big-MoE", ott=900.0)
    file = multi_node_json(folder)
    earlier, said = nightly_results([f"bad={folder}"], multi_node_benchmark(), {"bad": BAD})
    assert earlier is not None and earlier.bad == [2210.4]
    assert said == [f"--nightly-result bad={folder}: 2210.4 tokens/s ({OTT}) from {file} (model_name Org/Tiny-MoE; "
                    "of 2 files with task tiny-set, the one of the case's model Org/Tiny-MoE; it ran main: its "
                    "commit unknown, not checked against the end's)"]
    multi_node_json(folder, job="tiny-ep", ott=2000.0)
    with pytest.raises(UsageError, match=r"3 tasks tiny-set in main-multi-node-big-ep.json \(model Org/Big-MoE, ran "
                                         r"main\), main-multi-node-tiny-dp.json \(model Org/Tiny-MoE, ran main\), "
                                         r"main-multi-node-tiny-ep.json .*, none told apart by its commit, by the "
                                         "case's name tiny two-node data parallel or by its model Org/Tiny-MoE; give "
                                         "the one file: --nightly-result END="):
        nightly_results([f"bad={folder}"], multi_node_benchmark(), {"bad": BAD})


def test_a_multi_node_run_dispatched_at_a_commit_is_checked_against_the_end(tmp_path: Path) -> None:
    multi_node_json(tmp_path / "at-commit", ref=BAD[:12])
    earlier, _ = nightly_results([f"bad={tmp_path / 'at-commit'}"], multi_node_benchmark(), {"bad": BAD})
    assert earlier is not None and earlier.bad == [2210.4]
    with pytest.raises(UsageError, match=rf"the nightly ran at {BAD[:12]}, this end is 0123456789ab; its throughput "
                                         "is not a run of this end"):
        nightly_results([f"bad={tmp_path / 'at-commit'}"], multi_node_benchmark(), {"bad": "0123456789ab" * 3})
