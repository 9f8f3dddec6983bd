"""Every input checked before the first step (issue: never a wrong answer with exit 0, round two):
a value that cannot act is refused in one line naming its own option, before a session exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bisect_npu.cli import main
from bisect_npu.errors import UsageError
from bisect_npu.nightly.good_table import GoodRow, Lookup, last_good, read_rows
from bisect_npu.recipe.loader import load_recipe
from tests.helpers.gitrepo import git, make_linear_repo

TAGS = {1: "t1", 40: "t40"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    make_linear_repo(path, 45, culprit=17, tags=TAGS, files=lambda i: {"check.sh": "grep -qx good state\n"} if i == 0
                     else {})
    return path


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line of a command that must exit 2."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("bisect-npu: error:")]
    assert len(errors) == 1, err
    return errors[0]


@pytest.mark.parametrize(("setting", "expected"), [
    ("cases[*].sampling.temprature=0.5", "--settings cases[*].sampling.temprature: no such key in the recipe schema; "
                                         "nearest: cases[*].sampling.temperature"),
    ("cases[*].sampling.max_tokens=abc", "--settings cases[*].sampling.max_tokens=abc: cases.0.sampling.max_tokens: "
                                         "Input should be a valid integer"),
    ("engine.args.async_scheduling=true", "--settings engine.args.async_scheduling=true: the recipe has that value "
                                          "already"),
    ("engine.args.async_scheduling=", "--settings 'engine.args.async_scheduling=': give a value after `=` "
                                      "(engine.args.async_scheduling=null unsets the key)"),
])
def test_run_settings_are_checked_before_the_commit_search(repo: Path, tmp_path: Path, setting: str, expected: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    session = tmp_path / "session"
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--recipe", "demo-async-penalty",
                    "--settings", setting, "--session", str(session)], capsys)
    assert expected in line and "--good-set" not in line
    assert not (session / "journal.jsonl").exists()


def test_run_settings_with_a_command_is_refused(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--cmd", "sh check.sh",
                    "--settings", "engine.args.async_scheduling=false", "--session", str(tmp_path / "s")], capsys)
    assert "--settings searches which of a recipe's settings the culprit needs: give --recipe" in line


@pytest.mark.parametrize(("vary", "expected"), [
    ("engine.args.async_scheduling=true,false", "--vary engine.args.async_scheduling: true is the recipe's own value"),
    ("cases[*].sampling.temperature=0.5,0.5", "--vary cases[*].sampling.temperature: a value is given twice"),
])
def test_vary_values_are_each_a_configuration_of_their_own(repo: Path, tmp_path: Path, vary: str, expected: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    session = tmp_path / "search"
    line = refused(["settings", "--repo", str(repo), "--at", "t40", "--recipe", "demo-async-penalty", "--vary", vary,
                    "--session", str(session), "--no-verdict-store"], capsys)
    assert expected in line and "--good-set" not in line
    assert not (session / "settings.jsonl").exists()


def test_an_empty_value_does_not_unset_a_key(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["settings", "--repo", str(repo), "--at", "t40", "--recipe", "demo-async-penalty", "--good-set",
                    "engine.args.async_scheduling=", "--session", str(tmp_path / "s"), "--no-verdict-store"], capsys)
    assert "give a value after `=` (engine.args.async_scheduling=null unsets the key)" in line


# -- item 9: accepted without effect, or inconsistently: each refused in one line, or right ----------

def test_unit_test_with_a_command_is_refused(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--unit-test", "tests/ut/test_x.py",
                    "--cmd", "true", "--session", str(tmp_path / "s")], capsys)
    assert "--unit-test runs vllm-ascend's unit tests as the oracle, --cmd a command: give one of them" in line


@pytest.mark.parametrize(("extra", "expected"), [
    (["--soc", "a2"], "--soc picks a row of --good-table: add --good-table FILE (with --good last-good), or drop it"),
    (["--name", "x", "--scene", "multi_node"], "--name, --scene pick a row of --good-table"),
])
def test_good_table_row_options_without_the_table_are_refused(repo: Path, tmp_path: Path, extra: list[str],
                                                              expected: str, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--cmd", "sh check.sh", *extra,
                    "--session", str(tmp_path / "s")], capsys)
    assert expected in line


@pytest.mark.parametrize(("extra", "expected"), [
    (["--mode", "noisy"], "--mode noisy: an accuracy recipe is not searched in noisy mode"),
    (["--earlier-runs", "8/10", "0/10"], "--earlier-runs: an accuracy recipe is not searched in noisy mode"),
])
def test_noisy_options_on_an_accuracy_recipe_are_refused(repo: Path, tmp_path: Path, extra: list[str], expected: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--recipe", "demo-accuracy", *extra,
                    "--session", str(tmp_path / "s")], capsys)
    assert expected in line and "add --mode noisy" not in line


def test_duplicate_dataset_ids_are_refused_not_pooled(repo: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    bundled = load_recipe("demo-accuracy")
    raw = yaml.safe_load(Path(bundled.source or "").read_text())
    dataset = tmp_path / "qa.jsonl"
    dataset.write_text('{"id": "q1", "question": "a"}\n{"id": "q2", "question": "b"}\n{"id": "q1", "question": "c"}\n')
    raw["accuracy"]["dataset"] = str(dataset)
    raw["accuracy"]["lm_eval"]["task"] = str(Path(bundled.source or "").parent / raw["accuracy"]["lm_eval"]["task"])
    recipe = tmp_path / "accuracy.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--recipe", str(recipe),
                    "--session", str(tmp_path / "s")], capsys)
    assert f"the dataset {dataset} has sample id 'q1' twice (samples 1 and 3)" in line


def test_a_ref_that_is_both_a_branch_and_a_tag_is_refused(repo: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    git(repo, "branch", "t40", "t1")  # a branch named like the tag, elsewhere
    monkeypatch.chdir(repo)
    line = refused(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--cmd", "sh check.sh",
                    "--session", str(tmp_path / "s")], capsys)
    assert "ref t40 is both a tag" in line and "pass tags/t40 or heads/t40" in line


def test_a_timeout_says_the_timeout_given_and_names_the_command(repo: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    with pytest.raises(SystemExit) as exc:
        main(["run", "--repo", str(repo), "--good", "t1", "--bad", "t40", "--cmd", "sleep 30", "--timeout", "2",
              "--no-fix", "--session", str(tmp_path / "s")])
    out, err = capsys.readouterr()
    assert exc.value.code == 4, err
    assert "command ran past --timeout 2s" in out + err
    assert "fix the build or the command for that commit" in out + err and "the recipe" not in out + err


TABLE_HEADER = "name,yaml/path,link,status,vLLM Git information,vLLM-Ascend Git information,soc,scene,time\n"


def table_rows(*rows: tuple[str, str]) -> list[GoodRow]:
    """Successful rows of case `speed` on a2, each (commit, time)."""
    text = TABLE_HEADER + "".join(f"speed,c.yaml,l,success,,{sha},a2,single_node,{when}\n" for sha, when in rows)
    return read_rows(text, "good_table.csv")


def test_good_table_times_are_parsed_in_iso_form_or_refused() -> None:
    lookup = Lookup(soc="a2", scene="single_node", name="speed")
    rows = table_rows(("a" * 40, "2026-06-14 03:40:00 +08:00"), ("b" * 40, "2026-06-14T03:40:00Z"))
    assert last_good(rows, lookup, "good_table.csv").vllm_ascend_commit == "b" * 40  # 8 hours later
    with pytest.raises(UsageError, match=r"good_table.csv:3: time 'yesterday' is not a time"):
        last_good(table_rows(("a" * 40, "2026-06-14 03:40:00 +08:00"), ("b" * 40, "yesterday")), lookup,
                  "good_table.csv")


def test_a_good_table_row_at_the_bad_end_does_not_ask_to_swap_refs(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = "tests/e2e/nightly/single_node/models/configs/Speed-A2.yaml"
    case = yaml.safe_dump({"test_cases": [{
        "name": "speed-a2", "model": "tiny", "launcher": ["{python}", "server.py", "{model}"],
        "benchmarks": {"perf": {"case_type": "performance", "dataset_path": "d", "request_conf": "c",
                                "dataset_conf": "gsm8k/x", "num_prompts": 4, "max_out_len": 8, "batch_size": 4,
                                "baseline": 800, "threshold": 0.5}}}]})
    repo = tmp_path / "up"
    shas = make_linear_repo(repo, 6, culprit=3, files=lambda i: {path: case} if i == 0 else {})
    table = tmp_path / "nightly" / "good_table.csv"
    table.parent.mkdir()
    table.write_text(TABLE_HEADER + f"speed-a2,{path},l,success,,{shas[5]},a2,single_node,2026-06-14 03:40:00\n")
    line = refused(["run", "--repo", str(repo), "--bad", "main", "--nightly-case", f"{path}::speed-a2::perf", "--good",
                    "last-good", "--good-table", str(table), "--soc", "a2", "--session", str(tmp_path / "s")], capsys)
    assert f"--good-table's newest successful row gives {shas[5][:12]}, which is not older than --bad main" in line
    assert "give an older --bad, or a --good ref" in line
    assert "swap --good and --bad" not in line and "pass two different refs" not in line


def test_a_nightly_file_with_two_cases_of_one_name_is_refused(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    case = {"name": "speed", "model": "tiny", "benchmarks": {"perf": {
        "case_type": "performance", "dataset_path": "d", "request_conf": "c", "dataset_conf": "gsm8k/x",
        "num_prompts": 4, "max_out_len": 8, "batch_size": 4, "baseline": 800, "threshold": 0.5}}}
    file = tmp_path / "Speed.yaml"
    file.write_text(yaml.safe_dump({"test_cases": [case, {**case, "model": "other"}]}))
    line = refused(["recipes", "import-nightly", str(file), "--case", "speed"], capsys)
    assert "2 cases are named 'speed'" in line and "give each case a name of its own" in line
