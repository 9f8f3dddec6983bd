"""Each command's library call (`bisect_npu.api`), used without the command line, on real git
histories and real files: what a Python program gets is what the command prints from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bisect_npu import api
from tests.helpers.fix_history import SAMPLER, add_culprit, base_history
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo
from tests.nightly.test_nightly import CASE_FILE, CASE_PATH

DOCKERFILE = "FROM quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.11\nARG VLLM_TAG=v0.9.0\n"


@pytest.fixture(scope="module")
def linear(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """31 commits, bad from commit 17 on; a Dockerfile from the root, a compiled change every 10."""
    path = tmp_path_factory.mktemp("api") / "repo"

    def files(i: int) -> dict[str, str | None]:
        return {"Dockerfile": DOCKERFILE} if i == 0 else ({"csrc/k.cpp": f"// {i}\n"} if i % 10 == 0 else {})

    return path, make_linear_repo(path, 31, culprit=17, files=files, tags={0: "good", 30: "bad"})


def test_plan_prices_images_or_checkouts(linear: tuple[Path, list[str]]) -> None:
    repo, _ = linear
    images = api.plan(repo, "good", "bad")
    assert images.executor == "docker" and images.run_minutes == 5.0 and images.pulled is None
    assert len(images.range_plan.range.candidates) == 30 and len(images.range_plan.groups) == 4
    # nothing pulled: no pull fields; no --find-fix: no warning
    assert images.to_json() == {**images.range_plan.to_json(), "find_fix": False, "warning": None}
    checkouts = api.plan(repo, "good", "bad", command="grep -qx good state")
    assert checkouts.executor == "local" and checkouts.range_plan.groups == []
    assert checkouts.range_plan.expected.hours is None  # no run time declared, no made-up hours
    with pytest.raises(api.UsageError, match="either --recipe or --cmd"):
        api.plan(repo, "good", "bad", command="true", recipe="demo-async-penalty")


def test_simulate_replays_the_search_over_the_range(linear: tuple[Path, list[str]]) -> None:
    repo, shas = linear
    done: list[int] = []
    result = api.simulate(repo, "good", "bad", shas[17], runs=5, on_run=lambda i, total: done.append(i))
    assert (result.candidates, result.position, result.mode, result.build_keys) == (30, 17, "exact", 4)
    assert done == [1, 2, 3, 4, 5] and result.summary.accuracy == 1.0 and result.rows["runs"] == "5"
    assert api.simulate(repo, "good", "bad", shas[17], bad_rate=0.9, good_rate=0.1, runs=2).mode == "noisy"
    with pytest.raises(api.UsageError, match="is not one of the 30 candidates"):
        api.simulate(repo, "good", "bad", shas[0], runs=1)
    with pytest.raises(api.UsageError, match="must exceed"):
        api.simulate(repo, "good", "bad", shas[17], bad_rate=0.2, good_rate=0.2)
    # A throughput regression: the levels search, one run a round (a session's default for it); per
    # step, the likelihood search over steps stopped when sure, the good end's runs counted.
    throughput = api.simulate(repo, "good", "bad", shas[17], runs=3, throughput_drop=0.07)
    assert throughput.mode == "levels" and throughput.summary.accuracy == 1.0
    assert throughput.summary.mean_trials == throughput.summary.mean_rounds
    per_step = api.simulate(repo, "good", "bad", shas[17], runs=3, throughput_drop=0.07, throughput_search="per_step")
    assert per_step.mode == "likelihood" and per_step.summary.accuracy == 1.0
    assert per_step.summary.mean_trials > per_step.summary.mean_rounds


def test_fix_ranks_the_fix_first_with_its_evidence(tmp_path: Path) -> None:
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    fix = hist.edit("[BugFix] Back-fill async placeholders before repetition_penalty (#60)", SAMPLER,
                    "    return scale(logits, history, penalty)\n",
                    "    history = backfill(history)\n    return scale(logits, history, penalty)\n")
    answer = api.fix(hist.path, culprit[:10], keywords=["async"])
    assert answer.report.culprit == culprit and answer.ordered()[0].shas == [fix]
    assert answer.rows()[0][:2] == ["1", fix[:10]] and answer.verifications == []
    assert answer.reasons()[0] == f"1. {fix[:10]} {answer.ordered()[0].title}"
    data = answer.to_json()
    assert data["proposals"][0]["pr"] == 60 and data["verifications"] == []
    with pytest.raises(api.UsageError, match="--verify needs --recipe or --cmd"):
        api.fix(hist.path, culprit, verify=True)


def test_doctor_checks_what_the_executor_needs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    local = api.doctor("local")
    assert local.checks[0].name == "git" and local.checks[0].ok and local.ready and local.failed == []
    npus = api.doctor("local", npu=True)  # this host has no /dev/davinciN
    if shutil.which("npu-smi") is None and not Path("/dev/davinci0").exists():
        assert not npus.ready and "NPU devices" in npus.failed
    assert {check.name for check in npus.checks} >= {"git", "NPU devices", "npu-smi", "NPU host"}


def test_recipes_list_validate_show_and_check(linear: tuple[Path, list[str]], tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "broken.yaml").write_text("name: broken\n")
    good = mine / "demo.yaml"
    good.write_text((Path(api.load_recipe("demo-async-penalty").source)).read_text())
    listed = api.list_recipes([mine])
    assert {"bundled", str(mine)} == {entry.origin for entry in listed}
    (broken,) = [entry for entry in listed if entry.name == "broken"]
    assert broken.error and broken.backend == "-" and broken.origin == str(mine)
    assert any(entry.name == "demo-async-penalty" and entry.origin == "bundled" and entry.oracle for entry in listed)
    ok, bad = api.validate_recipes([good, mine / "broken.yaml"])
    assert ok.recipe is not None and ok.recipe.name == "demo-async-penalty" and ok.error is None
    assert bad.recipe is None and bad.error and "broken.yaml" in bad.error
    shown = api.recipe_plan("demo-async-penalty")
    assert shown["name"] == "demo-async-penalty" and shown["cases"] and shown["engine"]["backend"]
    json.dumps(shown)  # the `--format json` shape
    repo, shas = linear
    (at_good, at_bad) = api.check_recipe_at("demo-async-penalty", repo, ["good", "bad"])
    assert (at_good.ref, at_good.sha, at_bad.sha) == ("good", shas[0], shas[30])
    assert at_good.rules > 0 and at_good.findings == []  # no vllm-ascend code here: nothing to refuse


def test_a_nightly_case_file_is_surveyed_and_imported(tmp_path: Path) -> None:
    path = tmp_path / "Tiny-A2.yaml"
    path.write_text(CASE_FILE)
    found = api.survey_nightly(path)
    assert found.imported == ["tiny-aclgraph-perf", "tiny-aclgraph-acc"] and len(found.refused) == 1
    assert "tiny-eager" in found.refused[0]
    imported = api.import_nightly(path, case="tiny-aclgraph", benchmark="perf")
    assert imported.recipe.oracle.kinds == ["throughput"]
    assert imported.text.startswith(f"# imported by bisect-npu recipes import-nightly from {path.as_posix()}\n")
    assert api.load_recipe(_written(tmp_path, imported.text)).digest() == imported.recipe.digest()
    with pytest.raises(api.UsageError, match="cannot read it as a text file"):
        api.import_nightly(tmp_path / "missing.yaml")


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "imported.yaml"
    path.write_text(text)
    return path


@pytest.mark.e2e  # a session, end to end
def test_render_report_of_a_finished_session(linear: tuple[Path, list[str]], tmp_path: Path) -> None:
    repo, shas = linear
    session = tmp_path / "session"
    result = api.bisect(str(repo), "good", "bad", oracle=GOOD_CMD, session_dir=session, quiet=True, find_fix=False)
    assert result.culprit == shas[17]
    markdown = api.render_report(session)
    assert shas[17][:12] in markdown and markdown == result.report.read_text()
    assert json.loads(api.render_report(session, "json"))["culprit"] == shas[17]


def test_judge_takes_reference_files(tmp_path: Path) -> None:
    observation = api.Observation(case_id="c", trial=0, output_token_ids=[1, 2, 3], text="abc")
    files = []
    for name in ("seen", "reference"):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(observation.model_dump_json())
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: same\nmodel: {path: /m}\ncases: [{id: c, prompt: hi}]\noracle: {kinds: [tokens]}\n")
    assert api.judge(recipe, [files[0]], [files[1]]).kind is api.VerdictKind.GOOD


def test_the_comment_step_sets_the_outputs(tmp_path: Path) -> None:
    make_linear_repo(tmp_path / "up", 2, files=lambda i: {CASE_PATH: CASE_FILE})
    outputs = tmp_path / "outputs"
    asked = api.ci_comment("LGTM\n/bisect tiny-aclgraph --bad main\n", {"GITHUB_OUTPUT": str(outputs)},
                           repo=tmp_path / "up", good_table="/t/good_table.csv", soc="a2")
    assert (asked.good, asked.bad, asked.case) == ("last-good", "main", f"{CASE_PATH}::tiny-aclgraph")
    assert asked.args == ["--nightly-case", asked.case, "--good-table", "/t/good_table.csv", "--soc", "a2"]
    written = outputs.read_text()
    assert asked.case in written and "--good-table" in written


def test_the_demo_cases(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    upstream = api.demo_upstream(0)
    (default,) = api.demo_cases(upstream)
    assert default.name == upstream.manifest.default_case and default.recipe == default.truth.recipe
    every = api.demo_cases(upstream, "all", harness="aisbench")
    assert [case.name for case in every] == [case.name for case in upstream.manifest.cases]
    assert {case.recipe for case in every if case.name == "accuracy"} <= {"demo-accuracy-aisbench"}
    with pytest.raises(api.UsageError, match="unknown demo case 'nope'"):
        api.demo_cases(upstream, "nope")


@pytest.mark.e2e  # the demo model runs each configuration
def test_search_settings_names_the_manifest_trigger(tmp_path: Path) -> None:
    from bisect_npu.demo.generate import generate_upstream
    from bisect_npu.recipe.settings import show

    manifest = generate_upstream(tmp_path / "upstream", seed=0)
    truth = manifest.case("spec-decode")
    assert truth.settings is not None
    seen: list[Path] = []
    with pytest.raises(api.UsageError, match="needs --recipe"):
        api.search_settings(repo=str(tmp_path / "upstream"), ref=truth.bad_ref)
    # The trigger and one bystander, each configuration a run of the demo model: enough to search;
    # the whole good set is searched through the command line (tests/orchestration/test_settings_demo.py).
    bystander = next(key for key in truth.settings.good_set if key not in truth.settings.trigger)
    good_set = {key: value for key, value in truth.settings.good_set.items()
                if key in truth.settings.trigger or key == bystander}
    result = api.search_settings(repo=str(tmp_path / "upstream"), ref=truth.bad_ref, recipe=truth.recipe,
                                 good_set=[f"{key}={show(value)}" for key, value in good_set.items()],
                                 session_dir=tmp_path / "session", no_verdict_store=True, on_session=seen.append)
    assert (result.status, result.exit_code, result.trigger) == ("found", 0, truth.settings.trigger)
    assert seen == [result.session_dir] == [(tmp_path / "session").resolve()]
    assert result.configurations > 2 and result.report.read_text().startswith("#")
