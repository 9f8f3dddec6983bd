"""The small things a new user meets first: `plan --find-fix` warns where the search would start
from a merge-base that may not show the symptom; `recipes check` says which rules concern the
recipe; `judge` refuses observations of another recipe or of another version of it; `run
--nightly-case` says what the host owes the case before anything is built."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.orchestration.opening.open_session import open_new
from bisect_npu.progress import PlainProgress
from tests.helpers.asked import spec_of
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import git, make_linear_repo
from tests.nightly.test_nightly import CASE_FILE, CASE_PATH


def bisect_npu(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command line in this process: what it prints and its exit code."""
    return cli_in_process(list(args), cwd=cwd)


def bisect_npu_process(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command line in a process of its own, as a user starts it."""
    return subprocess.run([sys.executable, "-m", "bisect_npu", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_plan_find_fix_warns_when_the_old_end_is_off_the_new_ends_history(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path / "repo", 6)
    repo = tmp_path / "repo"
    git(repo, "checkout", "-q", "-b", "release", shas[2])
    (repo / "hotfix").write_text("x\n")
    git(repo, "add", "hotfix")
    git(repo, "commit", "-q", "-m", "release only")
    git(repo, "tag", "old-broken")
    git(repo, "checkout", "-q", shas[-1])
    args = ("plan", "--repo", str(repo), "--old", "old-broken", "--new", shas[-1], "--cmd", "true")
    found = bisect_npu(*args, "--find-fix", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert (f"warning: --find-fix: the old end old-broken is not on the new end's history, so the search starts "
            f"from their merge-base {shas[2][:12]}") in found.stdout
    as_json = json.loads(bisect_npu(*args, "--find-fix", "--json", cwd=tmp_path).stdout)
    assert as_json["find_fix"] and "may predate the regression" in as_json["warning"]
    assert "warning: --find-fix" not in bisect_npu(*args, cwd=tmp_path).stdout  # a search for the culprit
    on_history = bisect_npu("plan", "--repo", str(repo), "--old", shas[1], "--new", shas[-1], "--cmd", "true",
                            "--find-fix", cwd=tmp_path)
    assert on_history.returncode == 0 and "warning" not in on_history.stdout


def test_recipes_check_says_which_rules_concern_the_recipe(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path / "repo", 2)
    plain = bisect_npu("recipes", "check", "demo-async-penalty", "--repo", str(tmp_path / "repo"), "--at", shas[-1],
                       cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert "no rule concerns this recipe (of the 4), so nothing was checked" in plain.stdout
    recipe = tmp_path / "configured.yaml"
    recipe.write_text("name: configured\nmodel: {path: /m}\nengine:\n  backend: vllm\n  args:\n"
                      "    additional_config: {ascend_scheduler_config: {enabled: true}}\n"
                      "cases: [{id: a, prompt: hi}]\n")
    configured = bisect_npu("recipes", "check", str(recipe), "--repo", str(tmp_path / "repo"), "--at", shas[-1],
                            cwd=tmp_path)
    assert configured.returncode == 0, configured.stderr
    assert ("2 of 4 rules concern this recipe (ascend-scheduler-batched-tokens, ignored-additional-config); none "
            "finds a problem") in configured.stdout


def test_judge_refuses_observations_written_for_another_recipe(tmp_path: Path) -> None:
    from bisect_npu.observations import Observation

    def written(name: str, recipe: str) -> Path:
        path = tmp_path / name
        path.write_text(Observation(commit="a" * 40, recipe=recipe, case_id="repeat-story", text="one two three",
                                    output_token_ids=[1, 2, 3], finish_reason="stop").model_dump_json())
        return path

    other = bisect_npu("judge", "--recipe", "demo-async-penalty", str(written("o.json", "demo-spec-decode")),
                       cwd=tmp_path)
    assert other.returncode == 128 and "written for recipe 'demo-spec-decode', not 'demo-async-penalty'" in other.stderr
    own = bisect_npu("judge", "--recipe", "demo-async-penalty", str(written("m.json", "demo-async-penalty")),
                     cwd=tmp_path)
    assert own.returncode == 0, own.stderr


def test_a_usage_error_leaves_no_empty_session_directory(tmp_path: Path) -> None:
    make_linear_repo(tmp_path / "repo", 2)
    done = bisect_npu("settings", "--at", "HEAD", "--recipe", "demo-async-penalty", "--good-set",
                      "cases[*].sampling.temprature=0.5", cwd=tmp_path / "repo")
    assert done.returncode == 2 and "no such key in the recipe schema" in done.stderr
    sessions = tmp_path / "repo" / ".bisect-npu" / "sessions"
    assert [p.name for p in sessions.iterdir() if p.is_dir()] == []
    assert "nothing was run; the session directory" in done.stderr


def test_judge_refuses_observations_of_another_version_of_the_recipe(tmp_path: Path) -> None:
    """The probe copies the recipe's run digest from its request into the observation; `judge` with
    a recipe whose case changed refuses it naming both digests, a changed oracle rule judges it
    again, an observation without a digest (an older probe's) keeps the name check alone, and a
    reference (a golden record of another backend's recipe) is not checked."""
    import yaml

    from bisect_npu import api
    from bisect_npu.orchestration.running.probe_requests import probe_request
    from bisect_npu.probe.request import new_observation, write_json_atomic
    from bisect_npu.recipe.loader import bundled_recipes, load_recipe

    body = yaml.safe_load(bundled_recipes()["demo-async-penalty"].read_text())
    recipe_file = tmp_path / "case.yaml"
    recipe_file.write_text(yaml.safe_dump(body))
    ran = load_recipe(recipe_file)
    observation = new_observation(probe_request(ran, ran.cases[0], "a" * 40, 0))
    observation.update(text="one two three", output_token_ids=[1, 2, 3], finish_reason="stop")
    written = tmp_path / "obs.json"
    write_json_atomic(str(written), observation)
    assert bisect_npu("judge", "--recipe", str(recipe_file), str(written), cwd=tmp_path).returncode == 0

    body["cases"][0]["sampling"]["max_tokens"] = 64
    recipe_file.write_text(yaml.safe_dump(body))
    edited = load_recipe(recipe_file).run_digest()
    refused = bisect_npu("judge", "--recipe", str(recipe_file), str(written), cwd=tmp_path)
    assert refused.returncode == 128
    assert len(refused.stderr.strip().splitlines()) == 1
    assert (f"written for recipe 'demo-async-penalty' at run digest {ran.run_digest()}, not this one's {edited}: "
            "what the recipe runs changed since; judge it with the version that ran it") in refused.stderr

    body["cases"][0]["sampling"]["max_tokens"] = ran.cases[0].sampling.max_tokens
    body["description"] = "the same case, judged over more trials"
    body["trials"] = {**body.get("trials", {}), "count": ran.trials.count + 2}
    recipe_file.write_text(yaml.safe_dump(body))
    assert load_recipe(recipe_file).digest() != ran.digest()
    rejudged = bisect_npu("judge", "--recipe", str(recipe_file), str(written), cwd=tmp_path)
    assert rejudged.returncode == 0, rejudged.stderr  # the same output judged again: a verdict, not a refusal

    older = tmp_path / "older.json"
    write_json_atomic(str(older), {key: value for key, value in observation.items() if key != "run_digest"})
    assert bisect_npu("judge", "--recipe", str(recipe_file), str(older), cwd=tmp_path).returncode == 0
    assert api.judge(recipe_file, [older], reference=[written]).kind.value == "good"


def _nightly_upstream(tmp_path: Path, model: str) -> list[str]:
    """A clone whose commit 1 adds the nightly case file, its case served by `vllm serve MODEL`."""
    case = CASE_FILE.replace('"vllm-ascend/Tiny"', json.dumps(model))
    return make_linear_repo(tmp_path / "up", 4, files=lambda i: {CASE_PATH: case} if i == 1 else {})


IMPORT_IT = (f"import it in the clone with `bisect-npu recipes import-nightly {CASE_PATH} --case tiny-aclgraph "
             "--benchmark acc --model-root DIR --out case.yaml` (DIR holding vllm-ascend/Tiny)")


def test_run_nightly_case_in_containers_refuses_a_model_this_host_lacks_before_building(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    shas = _nightly_upstream(tmp_path, "vllm-ascend/Tiny")
    session = tmp_path / "session"
    done = bisect_npu("run", "--repo", str(tmp_path / "up"), "--good", shas[1], "--bad", "main", "--nightly-case",
                      f"{CASE_PATH}::tiny-aclgraph::acc", "--executor", "docker", "--session", str(session),
                      "--no-fix", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (f"--nightly-case {CASE_PATH}::tiny-aclgraph::acc: model vllm-ascend/Tiny is not a directory on this host "
            f"and the case sets no model.host_path, so no container can load it; {IMPORT_IT}") in done.stderr
    assert not session.exists()


def test_run_nightly_case_on_this_host_says_the_engine_must_find_a_hub_model_in_its_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On this host the engine may hold a hub id in its own cache: said before building, not refused."""
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    shas = _nightly_upstream(tmp_path, "vllm-ascend/Tiny")
    said = io.StringIO()
    opened = open_new(spec_of(good=shas[1], bad="main", repo=str(tmp_path / "up"),
                              nightly_case=f"{CASE_PATH}::tiny-aclgraph::acc"),
                      session_dir=tmp_path / "session", progress=PlainProgress(said))
    opened.journal.close()
    lines = said.getvalue().splitlines()
    assert any(line.endswith("model vllm-ascend/Tiny is not a directory on this host: the engine must find it in "
                             "its own cache (offline hosts: HF_HOME / MODELSCOPE_CACHE); to load it from a directory, "
                             f"{IMPORT_IT}, or set model.host_path in the imported recipe, and run case.yaml with "
                             "--recipe") for line in lines), lines


def test_run_nightly_case_with_its_model_on_this_host_says_what_the_host_owes_and_keeps_the_good_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model path that is a directory here as the case gives it proceeds; the dataset's place is
    said before building, without --good-table; the good end stays the ref given."""
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "models" / "Tiny"
    model.mkdir(parents=True)
    shas = _nightly_upstream(tmp_path, str(model))
    said = io.StringIO()
    opened = open_new(spec_of(good=shas[1], bad="main", repo=str(tmp_path / "up"),
                              nightly_case=f"{CASE_PATH}::tiny-aclgraph::acc"),
                      session_dir=tmp_path / "session", progress=PlainProgress(said))
    opened.journal.close()
    assert opened.recipe is not None and opened.recipe.model.path == str(model)
    lines = said.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        f"--nightly-case {CASE_PATH}::tiny-aclgraph::acc: dataset vllm-ascend/gsm8k-lite: relative, as the nightly's "
        "dataset cache holds it; it must lie under the directory given as --datasets (import-nightly) or "
        "--nightly-datasets (run)"), lines
    header_range = opened.journal.header.range
    assert header_range.good == shas[1] and header_range.good_ref == shas[1]


def test_a_plain_bisection_says_what_it_found_and_its_latest_link_names_it(tmp_path: Path) -> None:
    """A linear history whose bad end is a branch: the run's last progress line says what the search
    for upstream fixes found, and the commits the bad end holds (still bad with them) are not
    proposed; `--session .bisect-npu/sessions/latest` (the link the folder offers) works for
    `report`, `resume` and `run`; after the branch moved, the resumed session's reproduce line
    still names the commit it bisected."""
    from tests.helpers.gitrepo import GOOD_CMD

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 8, culprit=4)
    asked = ("run", "--repo", str(repo), "--good", shas[0], "--bad", "main", "--cmd", " ".join(GOOD_CMD),
             "--no-verdict-store")
    done = bisect_npu_process(*asked, "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert f"upstream fixes of {shas[4][:12]}: " in progress[-1] and "in the bad end" in progress[-1], progress[-3:]
    latest = tmp_path / ".bisect-npu" / "sessions" / "latest"
    report = bisect_npu_process("report", "--session", str(latest), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert f"**First bad commit: `{shas[4][:12]}` Change 4" in report.stdout
    fix_section = report.stdout.split("## Fix upstream")[1].split("## Host")[0]
    assert not any(sha[:12] in fix_section for sha in shas[5:]) and "not proposed" in fix_section

    git(repo, "commit", "-q", "--allow-empty", "-m", "main moves on")  # the bad end's branch moves
    resumed = bisect_npu_process("resume", "--session", str(latest), cwd=tmp_path)
    assert resumed.returncode == 0 and resumed.stdout.startswith(f"first bad commit: {shas[4][:12]}"), resumed.stderr
    again = bisect_npu_process("report", "--session", str(latest), cwd=tmp_path).stdout
    line = again.split("## Reproduce")[1].split("```sh\n")[1].split("\n")[0]
    assert f"--good {shas[0]} --bad {shas[7]} " in line and "--bad main" not in line
    rerun = bisect_npu_process(*asked[:6], shas[7], *asked[7:], "--session", str(latest),
                               cwd=tmp_path)  # as reproduced
    assert rerun.returncode == 0 and rerun.stdout.startswith(f"first bad commit: {shas[4][:12]}"), rerun.stderr
    moved = bisect_npu_process(*asked, "--session", str(latest), cwd=tmp_path)  # `main` names another commit now
    assert moved.returncode == 2 and "is another run: its bad end is" in moved.stderr, moved.stderr
