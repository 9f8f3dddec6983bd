"""The composite action (action.yml), its steps run as GitHub runs them: each step's `run` script in
bash with the step's `env` (its `${{ }}` expressions filled in), GitHub's environment files
(GITHUB_OUTPUT per step, GITHUB_STEP_SUMMARY, GITHUB_RUN_ATTEMPT ...) as temporary files, and `if`
conditions evaluated. Real git repositories and a real bisect-npu; only `gh` is a fake
(tests/helpers/fake_gh.py), since GitHub cannot be reached."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from bisect_npu.ci import Actions, IssueInputs, issue_step, marker
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import HELPERS, REPO_ROOT

# Each test runs the action's steps end to end (bisect-npu sessions on a generated history).
pytestmark = pytest.mark.e2e

ROOT = REPO_ROOT
FAKE_GH = HELPERS / "fake_gh.py"
CULPRIT = 21
# Judges as `git bisect run` would, counting its runs; exits 255 (abort: infrastructure) at the
# position named in abort.txt, as a runner that lost its cards would.
CHECK = """import pathlib, sys
here = pathlib.Path(sys.argv[1])
position = pathlib.Path("counter").read_text().strip()
abort = here / "abort.txt"
if abort.exists() and abort.read_text().strip() == position:
    sys.exit(255)
with open(here / "runs.txt", "a") as runs:
    runs.write(position + "\\n")
sys.exit(0 if pathlib.Path("state").read_text().strip() == "good" else 1)
"""
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class Run:
    """One job's use of the action: the outputs of each step, the summary, the steps that ran."""

    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    ran: list[str] = field(default_factory=list)
    codes: dict[str, int] = field(default_factory=dict)
    stderr: dict[str, str] = field(default_factory=dict)
    summary: str = ""


def read_output_file(path: Path) -> dict[str, str]:
    """GitHub's GITHUB_OUTPUT format: `name=value` lines and `name<<DELIMITER` blocks."""
    values: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            values[name] = "\n".join(lines[i + 1:end])
            i = end + 1
        else:
            name, value = line.split("=", 1)
            values[name] = value
            i += 1
    return values


def run_action(inputs: dict[str, str], env: dict[str, str], work: Path) -> Run:
    """Run action.yml's steps as the runner would, for one job attempt."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    given = {name: inputs.get(name, spec.get("default", "")) for name, spec in action["inputs"].items()}
    missing = [name for name, spec in action["inputs"].items() if spec.get("required") and name not in inputs]
    assert not missing, f"required inputs {missing}"
    run = Run()
    summary = work / f"summary-{env['GITHUB_RUN_ATTEMPT']}.md"
    failed = False

    def value(expression: str) -> str:
        if expression.startswith("inputs."):  # a default may be an expression itself (github.token)
            return EXPRESSION.sub(lambda m: value(m[1]), str(given[expression.removeprefix("inputs.")]))
        if match := re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expression):
            return run.outputs.get(match[1], {}).get(match[2], "")
        return {"github.action_path": str(ROOT), "github.token": "fake-token",
                "github.repository": env["GITHUB_REPOSITORY"]}[expression]

    def condition(text: str) -> bool:
        results = []
        for term in (t.strip() for t in text.split("&&")):
            if term == "always()":
                results.append(True)
                continue
            operator = "!=" if "!=" in term else "=="
            left, right = (side.strip() for side in term.split(operator))
            results.append((value(left) == right.strip("'")) == (operator == "=="))
        return all(results) and (not failed or "always()" in text)

    for number, step in enumerate(action["runs"]["steps"]):
        name = step.get("id", str(number))
        if not condition(step["if"]) if "if" in step else failed:  # no `if`: success(), as GitHub has it
            continue
        assert "run" in step, f"step {name} uses {step.get('uses')}: the test runs only `run` steps"
        output = work / f"output-{env['GITHUB_RUN_ATTEMPT']}-{name}"
        step_env = {**os.environ, **env, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary)}
        step_env.update({key: EXPRESSION.sub(lambda m: value(m[1]), str(text)) for key, text in step["env"].items()})
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], env=step_env,
                              capture_output=True, text=True, timeout=600, check=False)
        run.ran.append(name)
        run.codes[name] = done.returncode
        run.stderr[name] = done.stderr
        run.outputs[name] = read_output_file(output)
        failed = failed or done.returncode != 0
    run.summary = summary.read_text() if summary.exists() else ""
    return run


@pytest.fixture
def job(tmp_path: Path):
    """A job's surroundings on a runner: a repository, the check, a PATH whose `gh` is the fake."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 33, culprit=CULPRIT)
    check_dir = tmp_path / "check"
    check_dir.mkdir()
    (check_dir / "check.py").write_text(CHECK)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_GH}" "$@"\n')
    (bin_dir / "gh").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "BISECT_NPU_CACHE": str(tmp_path / "cache"), "FAKE_GH_STATE": str(tmp_path / "gh.json"),
           "GITHUB_REPOSITORY": "owner/models", "GITHUB_JOB": "bisect", "GITHUB_SERVER_URL": "https://github.com"}
    inputs = {"repo": str(repo), "cmd": f"{sys.executable} {check_dir / 'check.py'} {check_dir}", "executor": "local",
              "install": "false", "args": "--no-fix --timeout 60"}
    return repo, shas, check_dir, env, inputs


def runs_of(check_dir: Path) -> list[int]:
    path = check_dir / "runs.txt"
    positions = [int(line) for line in path.read_text().split()] if path.exists() else []
    path.unlink(missing_ok=True)
    return positions


def gh_state(env: dict[str, str]) -> dict:
    return json.loads(Path(env["FAKE_GH_STATE"]).read_text())


@pytest.mark.heavy  # the action's whole flow twice, a retried job
def test_a_retried_job_resumes_and_a_culprit_gets_one_issue(job, tmp_path: Path) -> None:
    _, shas, check_dir, env, inputs = job
    inputs = {**inputs, "good": shas[0], "bad": shas[24]}
    (check_dir / "abort.txt").write_text("12\n")  # the first attempt loses its runner halfway
    first = run_action(inputs, {**env, "GITHUB_RUN_ID": "100", "GITHUB_RUN_ATTEMPT": "1"}, tmp_path)
    assert first.codes["bisect"] == 5 and first.outputs["bisect"]["status"] == "error"
    assert first.outputs["bisect"]["resumed"] == "false" and "issue" not in first.ran
    session = Path(first.outputs["bisect"]["session"])
    assert session.is_relative_to(tmp_path / "cache" / "ci-sessions") and (session / "journal.jsonl").is_file()
    assert "exited 255" in first.summary
    before = runs_of(check_dir)

    (check_dir / "abort.txt").unlink()
    retry = run_action(inputs, {**env, "GITHUB_RUN_ID": "100", "GITHUB_RUN_ATTEMPT": "2"}, tmp_path)
    out = retry.outputs["bisect"]
    assert (retry.codes["bisect"], out["status"], out["culprit"]) == (0, "found", shas[CULPRIT])
    assert (out["resumed"], out["session"]) == ("true", str(session))
    assert not set(runs_of(check_dir)) & set(before)  # no finished step ran again
    assert f"First bad commit: `{shas[CULPRIT][:12]}`" in retry.summary
    assert retry.outputs["issue"] == {"issue": "https://github.com/owner/models/issues/1", "issue-action": "created"}
    [issue] = gh_state(env)["issues"]
    assert issue["body"].startswith(marker(shas[CULPRIT])) and issue["labels"] == ["bisect-npu-regression"]
    assert "actions/runs/100" in issue["body"]

    # A later run over newer commits from last-good: the same culprit updates its issue, and the
    # verdicts the first run judged are not run again.
    later = run_action({**inputs, "good": "last-good", "bad": shas[32]},
                       {**env, "GITHUB_RUN_ID": "200", "GITHUB_RUN_ATTEMPT": "1"}, tmp_path)
    assert later.outputs["bisect"]["culprit"] == shas[CULPRIT] and int(later.outputs["bisect"]["reused"]) >= 2
    assert later.outputs["issue"]["issue-action"] == "updated"
    assert "verdicts reused from the store" in later.summary
    [issue] = gh_state(env)["issues"]
    assert len(issue["comments"]) == 1 and "Found again ([run](https://github.com/owner/models/actions/runs/200))" \
        in issue["comments"][0]


def test_no_regression_since_last_good_passes(tmp_path: Path, job) -> None:
    _, _, check_dir, env, inputs = job
    clean = tmp_path / "clean"
    shas = make_linear_repo(clean, 10)
    inputs = {**inputs, "repo": str(clean)}
    seeded = run_action({**inputs, "good": shas[0], "bad": shas[5]},
                        {**env, "GITHUB_RUN_ID": "1", "GITHUB_RUN_ATTEMPT": "1"}, tmp_path)
    assert seeded.codes["bisect"] == 4 and seeded.outputs["bisect"]["status"] == "ends_wrong"  # a named good end
    assert runs_of(check_dir) == [5]  # the bad end judged good: nothing to bisect, and 5 is known good
    nightly = run_action({**inputs, "bad": shas[9]}, {**env, "GITHUB_RUN_ID": "2", "GITHUB_RUN_ATTEMPT": "1"},
                         tmp_path)
    assert (nightly.codes["bisect"], nightly.outputs["bisect"]["status"]) == (0, "no-regression")
    assert "issue" not in nightly.ran and runs_of(check_dir) == [9]
    header = json.loads(Path(nightly.outputs["bisect"]["session"], "journal.jsonl").read_text().splitlines()[0])
    assert header["range"]["good"] == shas[5]  # last-good: the newest commit judged good


def test_the_issue_step_dedups_by_culprit(tmp_path: Path, job, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, _, env, _ = job
    for name in ("PATH", "FAKE_GH_STATE"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("GH_TOKEN", "fake-token")
    actions = Actions.from_environ({"GITHUB_REPOSITORY": "owner/models", "GITHUB_RUN_ID": "7"})

    def report(culprit: str) -> Path:
        session = tmp_path / culprit
        session.mkdir(exist_ok=True)
        (session / "report.md").write_text(f"# report for {culprit}\n")
        path = session / "report.json"
        path.write_text(json.dumps({"status": "found", "culprit": culprit, "culprit_title": "Change",
                                    "session": str(session)}))
        return path

    results = [issue_step(IssueInputs(report(sha), "owner/models"), actions, tmp_path)["issue-action"]
               for sha in ("a" * 40, "b" * 40, "a" * 40, "a" * 40)]
    assert results == ["created", "created", "updated", "updated"]
    issues = gh_state(env)["issues"]
    assert [len(i["comments"]) for i in issues] == [2, 0]
    assert [i["title"] for i in issues] == [f"Regression: {'a' * 12} Change", f"Regression: {'b' * 12} Change"]


def test_matrix_legs_of_one_job_never_share_a_session(job, tmp_path: Path) -> None:
    """Two legs of one job (same run id and job name, other ends): each has its own session, and
    the failed leg's retry resumes its own, never the other leg's culprit."""
    _, shas, check_dir, env, inputs = job
    leg_env = {**env, "GITHUB_RUN_ID": "300"}
    for attempt in ("a", "b1", "b2"):
        (tmp_path / attempt).mkdir()
    culprit_leg = run_action({**inputs, "good": shas[0], "bad": shas[24], "matrix": '{"model": "a"}'},
                             {**leg_env, "GITHUB_RUN_ATTEMPT": "1"}, tmp_path / "a")
    assert culprit_leg.outputs["bisect"]["culprit"] == shas[CULPRIT]
    clean_leg = {**inputs, "good": shas[0], "bad": shas[20], "matrix": '{"model": "b"}'}
    first = run_action(clean_leg, {**leg_env, "GITHUB_RUN_ATTEMPT": "1"}, tmp_path / "b1")
    assert first.outputs["bisect"]["session"] != culprit_leg.outputs["bisect"]["session"]
    assert first.outputs["bisect"]["status"] == "ends_wrong"  # its bad end is good: nothing regressed there
    retry = run_action(clean_leg, {**leg_env, "GITHUB_RUN_ATTEMPT": "2"}, tmp_path / "b2")
    out = retry.outputs["bisect"]
    assert (out["resumed"], out["session"]) == ("true", first.outputs["bisect"]["session"])
    assert (out["status"], out["culprit"]) == ("ends_wrong", "")
    runs_of(check_dir)


def test_a_retry_refuses_a_session_started_for_other_inputs(job, tmp_path: Path) -> None:
    _, shas, _, env, inputs = job
    shared = str(tmp_path / "shared-session")
    first = run_action({**inputs, "good": shas[0], "bad": shas[24], "session": shared},
                       {**env, "GITHUB_RUN_ID": "400", "GITHUB_RUN_ATTEMPT": "1"}, tmp_path)
    assert first.outputs["bisect"]["culprit"] == shas[CULPRIT]
    other = run_action({**inputs, "good": shas[0], "bad": shas[20], "session": shared},
                       {**env, "GITHUB_RUN_ID": "400", "GITHUB_RUN_ATTEMPT": "2"}, tmp_path)
    out = other.outputs["bisect"]
    assert (other.codes["bisect"], out["status"], out["culprit"]) == (2, "error", "")
    assert "started for other inputs (bad differ)" in out["message"]


def test_args_that_cannot_be_split_are_a_clear_error_with_outputs(job, tmp_path: Path) -> None:
    _, shas, _, env, inputs = job
    done = run_action({**inputs, "good": shas[0], "bad": shas[24], "args": "--timeout '5"},
                      {**env, "GITHUB_RUN_ID": "500", "GITHUB_RUN_ATTEMPT": "1"}, tmp_path)
    out = done.outputs["bisect"]
    assert (done.codes["bisect"], out["status"], out["exit-code"]) == (2, "error", "2")
    assert "the `args` input \"--timeout '5\" cannot be split" in out["message"]
    assert "check its quotes" in out["message"]
    assert "check its quotes" in done.summary and "Traceback" not in done.stderr["bisect"]


@pytest.mark.parametrize(("output", "why"), [("/proc/nope/output", "No such file or directory"),
                                             ("a directory", "Is a directory")])
def test_an_output_file_that_cannot_be_written_stops_the_step_before_it_runs(tmp_path: Path, output: str,
                                                                             why: str) -> None:
    """GITHUB_OUTPUT naming a place that cannot be written: one line naming it, exit 5, and no
    bisection was started (its answer would be lost after hours)."""
    shas = make_linear_repo(tmp_path / "repo", 4, culprit=2)
    target = tmp_path if output == "a directory" else Path(output)
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "ci", "bisect", "--good", shas[0], "--bad", shas[-1],
                           "--repo", str(tmp_path / "repo"), "--cmd", "true", "--executor", "local", "--session",
                           str(tmp_path / "s")], env={**os.environ, "GITHUB_OUTPUT": str(target)},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 5, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"bisect-npu: error: GITHUB_OUTPUT names {target}, which cannot be written ({why}); run this step inside "
        "GitHub Actions, or point GITHUB_OUTPUT at a writable file"], done.stderr
    assert not (tmp_path / "s").exists()
