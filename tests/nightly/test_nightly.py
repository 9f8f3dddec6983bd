"""vllm-ascend's nightly as inputs: case files as recipes (read at each commit), the good table as
the good end, the throughput oracle; the slow test imports every case file of a real clone
(BISECT_NPU_VLLM_ASCEND=CLONE) at a 2026-07 commit and at the tip and reports the counts."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bisect_npu.errors import UsageError
from bisect_npu.forecast.simulate import Throughput, simulate
from bisect_npu.nightly.at_commit import (
    CaseAbsent,
    good_from_table,
    newest_recipe_at,
    recipe_at,
    recipe_dump,
    settle_run,
)
from bisect_npu.nightly.cases import CaseRef, NightlyRefused, import_case, read_case_file, survey
from bisect_npu.nightly.good_table import Lookup, last_good, read_rows
from bisect_npu.observations import Observation, Timings, VerdictKind
from bisect_npu.oracle import judge
from bisect_npu.oracle.config import OracleConfig
from bisect_npu.oracle.throughput import (
    REFERENCE_TRIALS_FACTOR,
    ThroughputConfig,
    judge_throughput,
    reference_trials,
    sample_of,
    t_quantile,
)
from bisect_npu.orchestration.opening.reference import step_trials
from bisect_npu.orchestration.session import Session, search_mode_for
from bisect_npu.recipe.loader import parse_recipe
from bisect_npu.recipe.schema import Recipe
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import git, make_linear_repo
from tests.helpers.paths import HELPERS, REPO_ROOT

CASE_PATH = "tests/e2e/nightly/single_node/models/configs/Tiny-A2.yaml"
CASE_FILE = """\
_envs: &envs
  TASK_QUEUE_ENABLE: "1"
  SERVER_PORT: "DEFAULT_PORT"
  BLOCK: "128"
_server_cmd: &server_cmd
  - "--tensor-parallel-size"
  - "2"
  - "--port"
  - "$SERVER_PORT"
  - "--block-size"
  - "${BLOCK}"
test_cases:
  - name: "tiny-aclgraph"
    model: "vllm-ascend/Tiny"
    envs:
      <<: *envs
    server_cmd: *server_cmd
    server_cmd_extra: ["--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}']
    benchmarks:
      perf:
        case_type: performance
        dataset_path: vllm-ascend/GSM8K-in3500-bs400
        request_conf: vllm_api_stream_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_cot_str_perf
        num_prompts: 304
        max_out_len: 1500
        batch_size: 76
        baseline: 1249.018
        threshold: 0.97
      acc:
        case_type: accuracy
        dataset_path: vllm-ascend/gsm8k-lite
        request_conf: vllm_api_general_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_noncot_chat_prompt
        max_out_len: 10240
        batch_size: 32
        baseline: 96
        threshold: 4
  - name: "tiny-eager"
    model: "vllm-ascend/Tiny"
    envs:
      <<: *envs
    server_cmd: *server_cmd
    benchmarks:
"""
TABLE_HEADER = ("name,yaml/path,link,status,vLLM Git information,vLLM-Ascend Git information,soc,scene,time\n")


def _obs(tokens: int, seconds: float, trial: int = 0) -> Observation:
    return Observation(case_id="perf", trial=trial, output_token_ids=list(range(tokens)),
                       timings=Timings(generate_s=seconds))


# -- the throughput oracle ------------------------------------------------------------------------

def test_t_quantile_matches_the_table() -> None:
    for p, df, table in [(0.95, 4, 2.132), (0.95, 10, 1.812), (0.975, 5, 2.571), (0.95, 1, 6.314),
                         (0.95, 2, 2.920)]:
        assert t_quantile(p, df) == pytest.approx(table, abs=0.01)


def test_throughput_against_the_baseline_line() -> None:
    cfg = ThroughputConfig(baseline=100.0, threshold=0.97)
    steady = [_obs(1000, 1000.0 / rate) for rate in (100.0, 101.0, 99.5, 100.5, 100.2)]
    assert judge_throughput(cfg, steady).kind == VerdictKind.GOOD
    slow = [_obs(1000, 1000.0 / rate) for rate in (90.0, 91.0, 89.5, 90.5, 90.2)]
    verdict = judge_throughput(cfg, slow)
    assert verdict.kind == VerdictKind.BAD and verdict.figures["line"] == pytest.approx(97.0)
    assert verdict.figures["bounds"][1] < 97.0 and "not_significant" not in verdict.figures


def test_one_low_run_among_noisy_ones_is_not_significant_and_flagged() -> None:
    cfg = ThroughputConfig(baseline=100.0, threshold=0.97)
    noisy = [_obs(1000, 1000.0 / rate) for rate in (110.0, 84.0, 96.0, 103.0, 88.0)]  # mean 96.2, spread 10
    verdict = judge_throughput(cfg, noisy)
    assert verdict.figures["not_significant"] is True and verdict.kind == VerdictKind.BAD
    assert "more trials would settle it" in verdict.reason


def test_throughput_against_the_good_end_and_the_harness_figure() -> None:
    cfg = ThroughputConfig(threshold=0.9, reference="good_end")
    reference = [_obs(100, 1.0), _obs(100, 1.02), _obs(100, 0.98)]
    measured = [Observation(case_id="perf", extra={"output_token_throughput": v}) for v in (70.0, 71.0, 69.0)]
    assert judge_throughput(cfg, measured, reference).kind == VerdictKind.BAD
    assert judge_throughput(cfg, reference, reference).kind == VerdictKind.GOOD
    assert judge_throughput(cfg, measured, None).kind == VerdictKind.SKIP


def test_throughput_kind_through_the_oracle_entry() -> None:
    with pytest.raises(ValueError, match=r"oracle\.throughput is unset"):
        OracleConfig(kinds=["throughput"])
    cfg = OracleConfig(kinds=["throughput"], throughput=ThroughputConfig(baseline=50.0))
    assert judge(cfg, [_obs(100, 1.0, t) for t in range(3)], None, trials_per_case=3).kind == VerdictKind.GOOD
    assert judge(cfg, [_obs(10, 1.0)], None, trials_per_case=1).kind == VerdictKind.BAD
    assert judge(cfg, [Observation()], None, trials_per_case=1).kind == VerdictKind.SKIP


def test_the_good_end_whose_mean_is_the_line_runs_more_trials() -> None:
    """The good end's mean is every step's line: it runs REFERENCE_TRIALS_FACTOR times a candidate's
    trials (or the recipe's `reference_trials`); a line from a published baseline, a candidate, and
    a recipe without the throughput kind take the recipe's count."""
    raw = read_case_file(CASE_FILE, CASE_PATH)
    perf = import_case(raw, CASE_PATH, "tiny-aclgraph", "perf")
    assert perf.oracle.throughput is not None and perf.trials.count == 5
    assert step_trials(perf, as_reference=True) == REFERENCE_TRIALS_FACTOR * 5 > 5
    assert step_trials(perf, as_reference=False) == 5
    assert reference_trials(perf.oracle.throughput.model_copy(update={"reference_trials": 12}), 5) == 12
    assert reference_trials(ThroughputConfig(baseline=100.0, reference_trials=12), 5) == 5
    accuracy = import_case(raw, CASE_PATH, "tiny-aclgraph")
    assert step_trials(accuracy, as_reference=True) == accuracy.trials.count
    assert step_trials(None, as_reference=True) == 1
    with pytest.raises(ValueError, match="reference_trials"):
        ThroughputConfig(reference="good_end", reference_trials=0)


def test_the_search_mode_of_each_benchmark() -> None:
    """An accuracy benchmark's steps are measurements (the likelihood search weighs them); a
    performance benchmark's runs are the levels search's evidence (one run a step), except under
    `search: per_step`, where its steps that stop when sure are weighed by the likelihood search (a fix
    search, --find-fix, is levels too); with `sequential: false` too they are verdicts (exact, or
    the mode asked)."""
    raw = read_case_file(CASE_FILE, CASE_PATH)
    accuracy, perf = import_case(raw, CASE_PATH, "tiny-aclgraph"), import_case(raw, CASE_PATH, "tiny-aclgraph", "perf")
    assert search_mode_for(accuracy) == search_mode_for(accuracy, "noisy") == "likelihood"
    assert (search_mode_for(perf), search_mode_for(perf, "exact"), search_mode_for(perf, "noisy")) == \
        ("levels", "levels", "noisy")
    assert perf.oracle.throughput is not None

    def throughput(**fields: object) -> Recipe:
        assert perf.oracle.throughput is not None
        return perf.model_copy(update={"oracle": perf.oracle.model_copy(update={
            "throughput": perf.oracle.throughput.model_copy(update=fields)})})

    assert search_mode_for(throughput(search="per_step")) == "likelihood"
    assert search_mode_for(throughput(sequential=False)) == "levels"
    fixed = throughput(search="per_step", sequential=False)
    assert (search_mode_for(fixed), search_mode_for(fixed, "noisy")) == ("exact", "noisy")
    assert search_mode_for(None) == "exact"


# -- case files as recipes ------------------------------------------------------------------------

def test_a_case_becomes_the_nightly_server_and_its_benchmark() -> None:
    raw = read_case_file(CASE_FILE, CASE_PATH)
    accuracy = import_case(raw, CASE_PATH, "tiny-aclgraph")  # the accuracy benchmark comes first
    assert accuracy.oracle.kinds == ["accuracy"] and accuracy.accuracy is not None
    assert (accuracy.accuracy.baseline, accuracy.accuracy.threshold) == (96.0, 4.0)
    assert accuracy.accuracy.aisbench is not None and accuracy.accuracy.aisbench.batch_size == 32
    assert accuracy.engine.backend == "openai" and accuracy.model.path == "vllm-ascend/Tiny"
    # $SERVER_PORT's flag is the backend's own; ${BLOCK} is filled from envs; the extra flags follow
    assert accuracy.engine.server_flags == ["--tensor-parallel-size", "2", "--block-size", "128",
                                            "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}']
    assert accuracy.environment == {"TASK_QUEUE_ENABLE": "1", "BLOCK": "128"} and accuracy.cards_per_run() == 2
    vllm = accuracy.dependency("vllm")  # the pin each image installs; a culprit that moves it is followed
    assert vllm is not None and vllm.pin.arg == ["VLLM_COMMIT", "VLLM_TAG"] and vllm.installed_by_image
    perf = import_case(raw, CASE_PATH, "tiny-aclgraph", "perf")
    assert perf.oracle.throughput == ThroughputConfig(baseline=1249.018, threshold=0.97, reference="good_end")
    assert perf.trials.count == 5 and perf.reference.kind == "good_end"
    assert parse_recipe(recipe_dump(perf)).digest() == perf.digest()  # written out, read back the same
    assert parse_recipe(recipe_dump(accuracy)).digest() == accuracy.digest()


def test_refusals_say_what_is_missing() -> None:
    raw = read_case_file(CASE_FILE, CASE_PATH)
    with pytest.raises(NightlyRefused, match="no accuracy or performance benchmark with a baseline"):
        import_case(raw, CASE_PATH, "tiny-eager")
    multi = "num_nodes: 2\nnpu_per_node: 16\nmodel: m\ndeployment:\n  - {server_cmd: 'vllm serve m'}\n" \
            "  - {server_cmd: 'vllm serve m'}\nbenchmarks: {acc: {case_type: accuracy, baseline: 90}}\n"
    with pytest.raises(NightlyRefused, match=r"deployment\[1\]: not --headless, so a second API server"):
        import_case(read_case_file(multi, "tests/e2e/nightly/multi_node/x.yaml"), "tests/e2e/nightly/multi_node/x.yaml")
    epd = "test_cases:\n  - {name: e, model: m, envs: {}, service_mode: epd, benchmarks: {}}\n"
    with pytest.raises(NightlyRefused, match="service_mode epd"):
        import_case(read_case_file(epd, "e.yaml"), "e.yaml")
    found = survey(CASE_FILE, CASE_PATH)
    assert found.imported == ["tiny-aclgraph-perf", "tiny-aclgraph-acc"] and len(found.refused) == 1  # each benchmark
    assert "\n" not in found.refused[0]


def test_bad_input_is_one_line_each(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as not_yaml:
        read_case_file("test_cases:\n  - name: [unclosed\n", "broken.yaml")
    assert str(not_yaml.value).startswith("broken.yaml:3: not valid YAML") and "\n" not in str(not_yaml.value)
    with pytest.raises(UsageError, match=r"no case named 'tiny-fp8'; its cases: tiny-aclgraph, tiny-eager"):
        import_case(read_case_file(CASE_FILE, CASE_PATH), CASE_PATH, "tiny-fp8")
    with pytest.raises(UsageError, match="no benchmark 'latency'; its benchmarks: perf, acc"):
        import_case(read_case_file(CASE_FILE, CASE_PATH), CASE_PATH, "tiny-aclgraph", "latency")
    with pytest.raises(UsageError, match="FILE::CASE"):
        CaseRef.parse("a.yaml::::x")
    assert CaseRef.parse("Tiny-A2.yaml::tiny-eager") == CaseRef(CASE_PATH, "tiny-eager")  # as --config-yaml names it
    junk = tmp_path / "junk.yaml"
    junk.write_text("{{{ not: yaml")
    done = cli_in_process(["recipes", "import-nightly", str(junk)])
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "not valid YAML" in done.stderr


def test_each_commit_runs_the_case_as_its_own_file_has_it(tmp_path: Path) -> None:
    later = CASE_FILE.replace('"--block-size"', '"--max-num-seqs"')

    def files(i: int) -> dict[str, str | None]:
        return {CASE_PATH: CASE_FILE} if i == 1 else {CASE_PATH: later} if i == 3 else {}

    shas = make_linear_repo(tmp_path / "up", 4, files=files)
    from bisect_npu.upstream import history

    repo = history.open_repo(str(tmp_path / "up"))
    ref = CaseRef.parse(f"{CASE_PATH}::tiny-aclgraph")
    assert "--block-size" in recipe_at(repo, shas[2], ref).engine.server_flags
    assert "--max-num-seqs" in recipe_at(repo, shas[3], ref).engine.server_flags
    with pytest.raises(CaseAbsent, match=f"does not exist at {shas[0][:12]}"):
        recipe_at(repo, shas[0], ref)
    # a commit older than the case runs the newest file, HEAD's (the nightly's, when it failed)
    recipe, read_at = newest_recipe_at(repo, shas[0], ref)
    assert read_at == shas[3] and "--max-num-seqs" in recipe.engine.server_flags
    with pytest.raises(CaseAbsent, match="has no case 'tiny-new' yet"):
        newest_recipe_at(repo, shas[2], CaseRef(CASE_PATH, "tiny-new"))


# -- the good table -------------------------------------------------------------------------------

def _table(rows: list[str]) -> list:  # type: ignore[type-arg]
    return read_rows(TABLE_HEADER + "\n".join(rows) + "\n", "good_table.csv")


def test_the_newest_success_on_the_soc_and_scene_wins_legacy_rows_after() -> None:
    rows = _table([
        f"tiny-aclgraph,{CASE_PATH},l,success,v1,aaa1,a2,single_node,2026-06-15 03:40:00 +08:00",
        f"tiny-aclgraph,{CASE_PATH},l,success,v1,aaa2,a2,single_node,2026-06-16 03:40:00 +08:00",
        f"tiny-aclgraph,{CASE_PATH},l,failure,v1,aaa3,a2,single_node,2026-06-17 03:40:00 +08:00",
        f"tiny-aclgraph,{CASE_PATH},l,success,v1,aaa4,a3,single_node,2026-06-18 03:40:00 +08:00",
    ])
    assert last_good(rows, Lookup("a2", "single_node", "tiny-aclgraph"), "t").vllm_ascend_commit == "aaa2"
    assert last_good(rows, Lookup("a3", "single_node", None, "Tiny-A2.yaml"), "t").vllm_ascend_commit == "aaa4"
    legacy = read_rows("name,yaml/path,link,status,vLLM Git information,vLLM-Ascend Git information,time\n"
                       f"tiny-aclgraph,{CASE_PATH},l,success,v0,bbb1,2026-06-01 00:00:00\n", "legacy.csv")
    assert last_good(legacy + rows, Lookup("a2", "single_node", "tiny-aclgraph"), "t").vllm_ascend_commit == "aaa2"
    assert last_good(legacy, Lookup("a2", "single_node", "tiny-aclgraph"), "t").vllm_ascend_commit == "bbb1"


def test_no_matching_row_names_the_dimension() -> None:
    rows = _table([f"tiny-aclgraph,{CASE_PATH},l,success,v1,aaa1,a2,single_node,2026-06-15 03:40:00",
                   f"tiny-eager,{CASE_PATH},l,failure,v1,aaa2,a2,single_node,2026-06-15 03:40:00"])
    cases = [(Lookup("a2", "single_node", "tiny-fp8"), "no row matches name"),
             (Lookup("a2", "single_node", None, "Other.yaml"), "no row matches yaml/path"),
             (Lookup("a2", "single_node", "tiny-eager"), "none with status success.*status: failure"),
             (Lookup("a3", "single_node", "tiny-aclgraph"), "matches soc a3 .its socs: a2"),
             (Lookup("a2", "multi_node", "tiny-aclgraph"), "matches scene multi_node .its scenes: single_node")]
    for lookup, message in cases:
        with pytest.raises(UsageError, match=message) as caught:
            last_good(rows, lookup, "good_table.csv")
        assert "\n" not in str(caught.value)


def test_the_row_commit_must_be_in_the_clone_and_its_vllm_is_checked(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path / "up", 3, files=lambda i: {"Dockerfile": "FROM x\nARG VLLM_TAG=v0.9.1\n",
                                                               ".github/vllm-release-tag.commit": "a" * 40 + "\n"})
    from bisect_npu.upstream import history

    repo = history.open_repo(str(tmp_path / "up"))
    table = tmp_path / "nightly" / "good_table.csv"
    table.parent.mkdir()
    table.write_text(TABLE_HEADER + f"tiny-aclgraph,{CASE_PATH},l,success,{'b' * 40},{shas[1]},a2,single_node,"
                                    "2026-06-15 03:40:00\n")
    end = good_from_table(repo, table, Lookup("a2", "single_node", "tiny-aclgraph"), "nightly")
    assert end.sha == shas[1] and f"ran vLLM {'b' * 12} but the commit pins vLLM {'a' * 12}" in end.note
    with pytest.raises(UsageError, match="is the nightly table and --frequency is weekly"):
        good_from_table(repo, table, Lookup("a2", "single_node", "tiny-aclgraph"), "weekly")
    missing = "c" * 40
    table.write_text(TABLE_HEADER + f"tiny-aclgraph,{CASE_PATH},l,success,,{missing},a2,single_node,2026-06-15\n")
    with pytest.raises(UsageError, match=f"good_table.csv:2: .*records vllm-ascend {missing}, which is not in .*"
                                         "git fetch origin"):
        good_from_table(repo, table, Lookup("a2", "single_node", "tiny-aclgraph"), None)
    with pytest.raises(UsageError, match="pass --good last-good"):
        settle_run(str(tmp_path / "up"), "HEAD", shas[0], None, table, "tiny-aclgraph", None, "a2", "single_node",
                   None)
    git(tmp_path / "up", "status")  # the clone is left as it was


# -- the real clone -------------------------------------------------------------------------------

REAL_CLONE = os.environ.get("BISECT_NPU_VLLM_ASCEND")


@pytest.mark.slow
@pytest.mark.skipif(not REAL_CLONE, reason="BISECT_NPU_VLLM_ASCEND names no vllm-ascend clone")
def test_every_nightly_case_file_of_the_real_clone(capsys: pytest.CaptureFixture[str]) -> None:
    """At the last first-parent commit before 2026-07-20 and at the tip, every case file under
    tests/e2e/nightly/ is imported or refused with a one-line reason (run by hand:
    BISECT_NPU_VLLM_ASCEND=CLONE pytest -m slow tests/nightly/test_nightly.py -s)."""
    clone = Path(str(REAL_CLONE))
    # explicit times: a bare date takes its time of day from the clock
    july = git(clone, "log", "--first-parent", "--before=2026-07-20 00:00:00 +0000",
               "--after=2026-07-01 00:00:00 +0000", "-1", "--format=%H")
    assert july, "the clone has no first-parent commit in 2026-07"
    for sha in (july, git(clone, "rev-parse", "HEAD")):
        files = [p for p in git(clone, "ls-tree", "-r", "--name-only", sha, "tests/e2e/nightly").splitlines()
                 if p.endswith((".yaml", ".yml"))]
        assert files
        imported = refused = refused_files = 0
        for path in files:
            found = survey(git(clone, "show", f"{sha}:{path}"), path)
            assert found.imported or found.refused, path
            assert all(reason and "\n" not in reason for reason in found.refused), path
            imported += len(found.imported)
            refused += len(found.refused)
            refused_files += not found.imported
        with capsys.disabled():
            print(f"\n{sha[:12]}: {len(files)} case files, {imported} cases imported, {refused} refused "
                  f"({refused_files} files with none imported)")
        assert imported > 0


# -- the /bisect comment --------------------------------------------------------------------------

def test_a_bisect_comment_is_parsed_word_by_word() -> None:
    from bisect_npu.nightly.comment import parse_comment

    asked = parse_comment("Thanks!\n/bisect tiny-aclgraph --good v0.9.0 --bad main\nmore text")
    assert (asked.case, asked.good, asked.bad) == ("tiny-aclgraph", "v0.9.0", "main")
    assert parse_comment(f"/bisect {CASE_PATH}::tiny-aclgraph").good == "last-good"
    for body, message in [("no command here", "no /bisect line"), ("/bisect", "no case named"),
                          ("/bisect x --good --cmd", "is not a ref"), ("/bisect x --cmd 'rm -rf /'", "unexpected"),
                          ("/bisect x; touch /tmp/p", "unexpected"), ("/bisect $(id)", "unexpected"),
                          ("/bisect ../../etc/passwd", "unexpected"), ("/bisect 'unclosed", "cannot split")]:
        with pytest.raises(UsageError, match=message):
            parse_comment(body)


def test_a_bare_case_name_is_found_in_the_bad_ends_files(tmp_path: Path) -> None:
    from bisect_npu.ci import Actions, BisectInputs, bisect_argv
    from bisect_npu.nightly.at_commit import locate_case
    from bisect_npu.upstream import history

    shas = make_linear_repo(tmp_path / "up", 2, files=lambda i: {CASE_PATH: CASE_FILE})
    repo = history.open_repo(str(tmp_path / "up"))
    assert locate_case(repo, shas[1], "tiny-eager") == f"{CASE_PATH}::tiny-eager"
    with pytest.raises(UsageError, match="no nightly case file has a case named 'tiny-fp8'"):
        locate_case(repo, shas[1], "tiny-fp8")
    outputs = tmp_path / "outputs"
    comment = "LGTM\n/bisect tiny-eager --good v1 --bad main\n"
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "ci", "comment"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path.cwd()), "BISECT_NPU_CI_COMMENT": comment,
                               "BISECT_NPU_CI_REPO": str(tmp_path / "up"), "GITHUB_OUTPUT": str(outputs),
                               "BISECT_NPU_CI_GOOD_TABLE": "/t/good table.csv", "BISECT_NPU_CI_SOC": "a2"})
    assert done.returncode == 0, done.stderr
    written = outputs.read_text()
    assert f"{CASE_PATH}::tiny-eager" in written and "\nv1\n" in written
    assert "--good-table" not in written  # --good v1 was given: the table is not asked
    inputs = BisectInputs(good="last-good", bad="main", args=f"--nightly-case {CASE_PATH}::tiny-eager")
    argv = bisect_argv(inputs, tmp_path / "s", Actions.from_environ({}))
    assert "--recipe" not in argv and "--cmd" not in argv and argv[-2:] == ["--nightly-case",
                                                                            f"{CASE_PATH}::tiny-eager"]
    with pytest.raises(UsageError, match="one of `recipe`, `cmd` or `args: --nightly-case CASE`"):
        bisect_argv(BisectInputs(good="g", bad="b", recipe="r", args="--nightly-case x"), tmp_path / "s",
                    Actions.from_environ({}))


# -- a whole run ----------------------------------------------------------------------------------

def _speed_case(threshold: float) -> str:
    """A nightly case file whose server is tests/helpers/nightly_server.py (slow where `state` is bad)."""
    server = HELPERS / "nightly_server.py"
    return f"""\
test_cases:
  - name: "speed-a2"
    model: "tiny"
    envs: {{SERVER_PORT: "DEFAULT_PORT", TASK_QUEUE_ENABLE: "1"}}
    launcher: ["{{python}}", "{server}", "{{model}}"]
    server_cmd: ["--port", "$SERVER_PORT", "--max-num-seqs", "4"]
    benchmarks:
      acc:
        case_type: accuracy
        dataset_path: vllm-ascend/gsm8k-lite
        request_conf: vllm_api_general_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_noncot_chat_prompt
        max_out_len: 64
        batch_size: 4
        baseline: 90
        threshold: 5
      perf:
        case_type: performance
        dataset_path: vllm-ascend/GSM8K-in3500-bs400
        request_conf: vllm_api_stream_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_cot_str_perf
        num_prompts: 8
        max_out_len: 48
        batch_size: 4
        baseline: 800
        threshold: {threshold}
"""


@pytest.mark.e2e
def test_run_bisects_a_nightly_case_from_the_good_tables_row(tmp_path: Path) -> None:
    """`run --nightly-case FILE::CASE::perf --good last-good --good-table` on a real repository and a
    real server: the case file appears after the culprit (older commits run HEAD's) and changes
    once (each commit runs its own); the good end is the table's row; the report has the nightly's
    section with a throughput row per tested commit."""
    path = "tests/e2e/nightly/single_node/models/configs/Speed-A2.yaml"
    culprit = 4

    def files(i: int) -> dict[str, str | None]:
        return {path: _speed_case(0.5)} if i == 5 else {path: _speed_case(0.45)} if i == 7 else {}

    shas = make_linear_repo(tmp_path / "up", 9, culprit=culprit, files=files)
    table = tmp_path / "nightly" / "good_table.csv"
    table.parent.mkdir()
    table.write_text(TABLE_HEADER + "\n".join([
        f"speed-a2,{path},l,success,,{shas[1]},a2,single_node,2026-06-14 03:40:00 +08:00",
        f"speed-a2,{path},l,success,,{shas[0]},a3,single_node,2026-06-15 03:40:00 +08:00",
        f"speed-a2,{path},l,failure,,{shas[8]},a2,single_node,2026-06-16 03:40:00 +08:00",
        f"other,{path},l,success,,{shas[3]},a2,single_node,2026-06-17 03:40:00 +08:00"]) + "\n")
    session = tmp_path / "session"
    env = {**os.environ, "PYTHONPATH": str(Path.cwd()), "BISECT_NPU_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(tmp_path / "up"), "--bad", "main",
                           "--nightly-case", f"{path}::speed-a2::perf", "--good", "last-good", "--good-table",
                           str(table), "--soc", "a2", "--frequency", "nightly", "--no-fix", "--quiet", "--json",
                           "--session", str(session), "--timeout", "120"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert f"--good last-good: {shas[1][:12]} from {table}:2" in done.stderr
    assert f"first bad commit: {shas[culprit][:12]}" in done.stdout
    report = (session / "report.md").read_text()
    assert "## As the nightly reports it: tiny" in report and "| Output_Token_Throughput(OTT) |" in report
    assert f"{shas[culprit][:12]}" in report.split("## As the nightly reports it")[1]
    assert "--nightly-case" in report and "this commit predates it" in report
    import json

    summary = json.loads((session / "report.json").read_text())
    assert summary["culprit"] == shas[culprit] and summary["good"] == shas[1]
    records = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    trials = [r["index"] for r in records if r["type"] == "trial"]
    # Levels mode (a throughput recipe's default): one run a step, each where the search asks it,
    # every run weighed together; the good end is a position like any other.
    steps = [r for r in records if r["type"] == "step"]
    assert all(len(r["trials"]) == 1 for r in steps) and len(trials) == len(steps)
    assert all("one run (levels search)" in r["verdict"]["reason"] for r in steps)
    end = next(r for r in records if r["type"] == "end")["figures"]
    assert end["posterior"] >= 0.99 and end["runs"] == len(trials)
    assert "posterior that this is the first bad commit" in report
    # `simulate`'s forecast for this range, at the drop and the spread this session measured (each
    # run about its side's mean; a loaded machine widens it), holds the runs it spent within the
    # range of its 200 simulated sessions.
    runs_at: dict[int, list[float]] = {}
    for r in steps:
        for t in r["trials"]:
            value = sample_of(Observation.load(session / t["observation"])) if t.get("observation") else None
            if value is not None:
                runs_at.setdefault(r["index"], []).append(value)
    found = max(trials) - (len(shas) - 1 - culprit)  # the culprit's position in this session's range
    sides = [[v for i, vs in runs_at.items() if (i >= found) == bad for v in vs] for bad in (False, True)]
    level = float(np.mean(sides[0]))
    within = sum(float(((np.array(side) - np.mean(side)) ** 2).sum()) for side in sides)
    spread = max(math.sqrt(within / (len(trials) - 2)) / level, 0.005)
    forecast = simulate(7, culprit - 1, bad_rate=1.0, good_rate=0.0, runs=200, seed=0,
                        throughput=Throughput(1 - float(np.mean(sides[1])) / level, spread, threshold=0.45))
    assert forecast.accuracy >= 0.95
    assert forecast.mean_trials / 2 <= len(trials) <= forecast.max_trials, (len(trials), forecast)
    assert summary["nightly"]["parallel"] == "TP1" and summary["nightly"]["execution"] == "ACLGraph"
    # Resumed, the session's evidence holds every run it journaled, and the good end does not run again.
    resumed = Session.resume(session)
    try:
        resumed.references.ensure(lambda _trials: pytest.fail("the good end ran again"))
        measured = {i: list(ev.measured) for i, ev in resumed.evidence().items() if ev.measured}
    finally:
        resumed.evaluator.close()
        resumed.journal.close()
    assert measured == {i: pytest.approx(vs, abs=1e-3) for i, vs in runs_at.items()}


# -- the demo -------------------------------------------------------------------------------------

# The demo's tags before the nightly case and the MoE case were added to its history: the new commits
# come last.
DEMO_TAGS_SEED_0 = {"v0.9.0": "e68223ff02810b02353a0b85560f373c4ca01513",
                    "v0.9.1": "cc37f87c04f0a87307e2cd59b46bb7d905c22b6b",
                    "v0.10.0rc1": "1b07bfddc20339401e6e61abef622b1f08354ab9",
                    "v0.10.0rc2": "ad905cbc33d4369e72182066a1e3c38846b13801",
                    "v0.10.0rc3": "9603aefe5bbb2af92f269395606df6cd1fc83846"}
DEMO_RELEASE_TIP_SEED_0 = "127a8fb2b90731df3b8138b165b1d7cdfc09f081"


def test_the_demo_upstream_has_a_nightly_case_and_a_good_table(tmp_path: Path) -> None:
    from bisect_npu.demo import nightly as demo_nightly
    from bisect_npu.demo.generate import generate_upstream
    from bisect_npu.upstream import history

    manifest = generate_upstream(tmp_path / "up", seed=0)
    assert {tag: manifest.tags[tag] for tag in DEMO_TAGS_SEED_0} == DEMO_TAGS_SEED_0
    assert manifest.branches["v0.9.1-dev"] == DEMO_RELEASE_TIP_SEED_0
    repo = history.open_repo(str(tmp_path / "up"))
    ref = CaseRef.parse(f"{demo_nightly.CASE_PATH}::{demo_nightly.CASE_NAME}")
    truth = manifest.case(demo_nightly.DEMO_CASE)
    with pytest.raises(CaseAbsent):
        recipe_at(repo, truth.bad_sha, ref)
    recipe, read_at = newest_recipe_at(repo, truth.bad_sha, ref, "/data/sets")
    assert read_at == manifest.branches["main"] and recipe.accuracy is not None
    assert (recipe.accuracy.baseline, recipe.accuracy.threshold, recipe.accuracy.harness) == (100.0, 10.0, "aisbench")
    assert recipe.accuracy.dataset == "/data/sets/demo-accuracy/qa.jsonl"
    assert recipe.accuracy.aisbench is not None
    assert recipe.accuracy.aisbench.dataset_conf == "/data/sets/demo-accuracy/demo_qa_aisbench.py"
    assert recipe.accuracy.sampling.temperature == 0.0 and recipe.build.local_command[-1] == "tools/build_kernels.py"
    assert recipe.engine.launcher[-2:] == ["{probe}.serve_mini", "{model}"]
    assert recipe.engine.server_flags == ["--max-model-len", "2048"]
    perf = recipe_at(repo, manifest.branches["main"], CaseRef(ref.file, ref.case, "perf"))
    assert perf.oracle.throughput is not None and perf.oracle.throughput.threshold == 0.5
    table = demo_nightly.write_good_table(manifest, tmp_path / "tables")
    end = good_from_table(repo, table, Lookup(demo_nightly.SOC, demo_nightly.SCENE, demo_nightly.CASE_NAME,
                                              "Tiny-Qwen3-A2.yaml"), "nightly")
    assert end.sha == truth.good_sha and "the commit pins vLLM v0.9.0 from Dockerfile" in end.note


DEMO_DATASETS = REPO_ROOT / "bisect_npu" / "recipes" / "data"


@pytest.mark.e2e
@pytest.mark.heavy
@pytest.mark.harness
@pytest.mark.timeout(3600)  # each step is a real AISBench run on the CPU (about two minutes)
@pytest.mark.skipif(not (REPO_ROOT / "bisect_npu" / "probe" / "serve_mini.py").exists()
                    or not (DEMO_DATASETS / "demo-accuracy" / "qa.jsonl").exists(),
                    reason="needs the demo engine's HTTP server and the demo QA set (branch accuracy-harness)")
def test_the_demo_nightly_case_names_the_manifests_culprit(tmp_path: Path) -> None:
    """`run --nightly-case ... --good last-good --good-table ...` on the demo upstream: the case
    file at HEAD (the range predates it), the good end from the generated table, the accuracy
    benchmark through AISBench on the demo engine's server; the manifest's culprit is the answer.
    The nightly's range: its last success 3 commits before the culprit, the failing run 3 after."""
    from bisect_npu.demo import nightly as demo_nightly
    from bisect_npu.demo.generate import generate_upstream

    manifest = generate_upstream(tmp_path / "up", seed=0)
    truth = manifest.case(demo_nightly.DEMO_CASE)
    line = git(tmp_path / "up", "rev-list", "--first-parent", "--reverse", f"{truth.good_sha}..{truth.bad_sha}")
    commits = [truth.good_sha, *line.split()]
    at = commits.index(truth.culprit.sha)
    good, bad = commits[max(0, at - 3)], commits[min(len(commits) - 1, at + 3)]
    table = demo_nightly.write_good_table(manifest, tmp_path / "tables", good, bad)
    session = tmp_path / "session"
    env = {**os.environ, "PYTHONPATH": str(Path.cwd()), "BISECT_NPU_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(tmp_path / "up"),
                           "--bad", bad, "--nightly-case",
                           f"{demo_nightly.CASE_PATH}::{demo_nightly.CASE_NAME}", "--good", "last-good",
                           "--good-table", str(table), "--soc", demo_nightly.SOC, "--nightly-datasets",
                           str(DEMO_DATASETS), "--no-fix", "--quiet", "--json", "--session", str(session)],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert f"first bad commit: {truth.culprit.sha[:12]}" in done.stdout
    assert "| accuracy |" in (session / "report.md").read_text().split("## As the nightly reports it")[1]
