"""`bisect-npu fix` end to end through the console entry point, on a real git history."""

from __future__ import annotations

import json
import sys

import git
import pytest

from bisect_npu.cli import main
from tests.helpers.fix_history import SAMPLER, add_culprit, base_history
from tests.helpers.paths import REPO_ROOT

RECIPE = """name: penalty-async
symptom: [repetition_penalty, async]
model: {path: /models/qwen}
cases:
  - id: loop
    prompt: "Say hi"
"""


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(["fix", *args])
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.fixture
def upstream(tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    fix = hist.edit("[BugFix] Back-fill async placeholders before repetition_penalty (#60)", SAMPLER,
                    "    return scale(logits, history, penalty)\n",
                    "    history = backfill(history)\n    return scale(logits, history, penalty)\n")
    return hist, culprit, fix


def test_json_output_ranks_the_fix_with_recipe_keywords(capsys, tmp_path, upstream):
    hist, culprit, fix = upstream
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    code, out, _ = run_cli(capsys, "--culprit", culprit[:10], "--repo", str(hist.path), "--recipe", str(recipe),
                           "--json")
    assert code == 0
    data = json.loads(out)
    assert data["culprit"] == culprit
    best = data["proposals"][0]
    assert best["shas"] == [fix] and best["pr"] == 60
    assert {"symptom", "proximity", "tag"} <= {r["signal"] for r in best["reasons"]}


def test_text_output_lists_the_reasons(capsys, upstream):
    hist, culprit, fix = upstream
    code, out, _ = run_cli(capsys, "--culprit", culprit, "--repo", str(hist.path), "--keyword", "async")
    assert code == 0
    assert fix[:10] in out and "proximity" in out and "Back-fill async placeholders" in out


def test_text_output_names_the_back_port_on_the_bad_ends_branch_and_the_other_as_also_on(capsys, upstream):
    hist, culprit, fix = upstream
    hist.branch("v0.9.1-dev", culprit)
    hist.checkout("v0.9.1-dev")
    bad = hist.filler(1, "Release")[0]
    backport = hist.cherry_pick(fix, "[v0.9.1][BugFix] Back-fill async placeholders before repetition_penalty "
                                     "(from #60) (#61)")
    hist.checkout("main")
    code, out, _ = run_cli(capsys, "--culprit", culprit, "--repo", str(hist.path), "--bad", bad)
    assert code == 0
    assert f"1. {backport[:10]} [v0.9.1][BugFix]" in out and f"also on main as {fix[:10]}" in out


def test_no_fix_is_said_plainly(capsys, tmp_path):
    hist = base_history(tmp_path / "up")
    culprit = add_culprit(hist)
    code, out, _ = run_cli(capsys, "--culprit", culprit, "--repo", str(hist.path))
    assert code == 0 and "no fix found upstream as of main@" in out


def test_verify_needs_recipe_and_bad_end(capsys, upstream):
    hist, culprit, _ = upstream
    code, _, err = run_cli(capsys, "--culprit", culprit, "--repo", str(hist.path), "--verify")
    assert code == 2 and "--verify needs --recipe" in err


def test_verify_refuses_an_accuracy_recipe_before_building(capsys, upstream):
    hist, culprit, _ = upstream
    recipe = str(REPO_ROOT / "recipes" / "demo-accuracy.yaml")
    code, _, err = run_cli(capsys, "--culprit", culprit, "--repo", str(hist.path), "--bad", "HEAD", "--recipe",
                           recipe, "--verify")
    assert code == 2 and "--verify with the accuracy recipe" in err and "`run --verify-fix`" in err


def test_unknown_culprit_is_a_usage_error(capsys, upstream):
    hist, _, _ = upstream
    code, _, err = run_cli(capsys, "--culprit", "v9.9.9", "--repo", str(hist.path))
    assert code == 2 and "unknown ref v9.9.9" in err


def test_verify_with_a_command_runs_the_session_pipeline(capsys, tmp_path, monkeypatch):
    from tests.fix.test_fix_verify import make_upstream

    shas = make_upstream(tmp_path / "up")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "--culprit", shas["culprit"], "--repo", str(tmp_path / "up"),
                             "--bad", shas["bad"], "--verify", "--cmd", f"{sys.executable} check.py", "--json")
    assert code == 0, err
    data = json.loads(out)
    statuses = {tuple(v["proposal"]["shas"]): v["status"] for v in data["verifications"]}  # the journal's shape
    # The walk stops at the verified fix; the release variant, tried only when the fitted weights rank it
    # first, does not apply to main's bad end (the walk past it: test_fix_verify).
    assert statuses[(shas["fix"],)] == "verified" and data["verifications"][-1]["status"] == "verified"
    assert set(statuses.values()) <= {"verified", "conflict"} and set(statuses) <= {(shas["fix"],),
                                                                                     (shas["release_fix"],)}
    assert data["verifications"][0]["status"] == "verified"
    worktrees = git.Repo(tmp_path / "up").git.worktree("list", "--porcelain")
    assert worktrees.count("worktree ") == 1  # the clone itself: the evaluations' worktrees are gone
    assert not (tmp_path / ".bisect-npu").exists()  # nothing left in the working directory
    parent = git.Repo(tmp_path / "up").commit(shas["culprit"]).parents[0].hexsha
    code, _, err = run_cli(capsys, "--culprit", shas["culprit"], "--repo", str(tmp_path / "up"),
                           "--bad", parent, "--verify", "--cmd", f"{sys.executable} check.py")
    assert code == 2 and "does not contain the culprit" in err  # a "verified" there would prove nothing


def test_json_says_what_a_dependency_bump_means(capsys, tmp_path):
    hist = base_history(tmp_path / "up")
    hist.commit("[CI] Add requirements (#2)", {"requirements.txt": "torch==2.5.1\n"})
    pin = hist.commit("Pin torch (#3)", {"requirements.txt": "torch==2.6.0\n"})
    code, out, _ = run_cli(capsys, "--culprit", pin, "--repo", str(hist.path), "--json")
    dependency = json.loads(out)["dependency"]
    assert code == 0 and (dependency["package"], dependency["old"], dependency["new"]) == ("torch", "2.5.1", "2.6.0")
    assert dependency["message"].startswith("the regression comes from the dependency: bisect torch")


def test_verify_refuses_a_bad_end_the_oracle_judges_good(capsys, tmp_path, monkeypatch):
    """`true` passes everywhere: with no symptom at --bad, every fix would read as verified."""
    from tests.fix.test_fix_verify import make_upstream

    shas = make_upstream(tmp_path / "up")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "--culprit", shas["culprit"], "--repo", str(tmp_path / "up"),
                           "--bad", shas["bad"], "--verify", "--cmd", "true")
    assert code == 2 and f"--bad {shas['bad']} is judged good by this oracle (command exited 0)" in err


def test_a_fix_on_many_branches_names_a_few_and_counts_the_rest(capsys, upstream):
    """A fix cherry-picked to every release branch made each line list 14-19 branch names."""
    hist, culprit, fix = upstream
    for n in range(12):
        hist.git("branch", f"releases/v0.{n}.x", fix)
    code, out, _ = run_cli(capsys, "--culprit", culprit, "--repo", str(hist.path), "--keyword", "async")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith(f"1  {fix[:10]}"))
    assert "main, releases/v0.0.x, releases/v0.1.x and 10 more" in row
    assert "releases/v0.11.x" not in out  # in no line: the note, the table and the reasons alike
    code, out, _ = run_cli(capsys, "--culprit", culprit, "--repo", str(hist.path), "--keyword", "async", "--json")
    assert len(json.loads(out)["proposals"][0]["branches"]) == 13  # the data keeps every one


def test_some_branches_names_all_when_one_more_would_be_counted() -> None:
    from bisect_npu.fix_proposals import some_branches

    assert some_branches([]) == "" and some_branches(["a", "b", "c", "d"]) == "a, b, c, d"
    assert some_branches(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"
