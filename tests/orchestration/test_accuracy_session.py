"""Whole accuracy bisections through `bisect-npu run`: the demo upstream served over HTTP, scored
by a command harness, judged by the accuracy oracle, searched in likelihood mode; and a sampled
evaluation whose every answer is a fresh draw (no extra installs: the real lm-eval and AISBench
runs are in test_accuracy_harness.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bisect_npu.demo.accuracy import DATASET, read_dataset
from bisect_npu.observations import Observation
from bisect_npu.orchestration.session import Session
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import HELPERS

pytestmark = pytest.mark.e2e

HARNESS = HELPERS / "accuracy_command_harness.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_command_harness_bisection_finds_the_manifests_culprit_running_few_samples(demo_upstream, tmp_path):
    """From the culprit's third first-parent ancestor to its third descendant (not the case's 39
    commits): both ends on the whole dataset, the steps between on the samples that tell them apart."""
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    history = git.Repo(repo)
    good = history.commit(f"{case.culprit.sha}~3").hexsha
    bad = history.git.rev_list("--first-parent", "--reverse", f"{case.culprit.sha}..{case.bad_ref}").split()[2]
    recipe = {
        "name": "accuracy-session", "model": {"path": "seed:0", "dtype": "float32"},
        "engine": {"backend": "openai", "launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"],
                   "port": free_port(), "startup_timeout_s": 120},
        "accuracy": {"harness": "command", "dataset": str(DATASET),
                     "command": {"argv": [sys.executable, str(HARNESS), "{base_url}", "{model}", "{dataset}",
                                          "{output}"]},
                     "sampling": {"temperature": 0.0, "max_tokens": 4, "seed": 0}},
        "oracle": {"kinds": ["accuracy"]},
        "build": {"local_command": ["python", "tools/build_kernels.py"]},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe))
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", good,
                           "--bad", bad, "--recipe", str(path), "--session", str(tmp_path / "s"),
                           "--no-fix", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=580,
                          check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["culprit"] == case.culprit.sha
    entries = [json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    steps = [e for e in entries if e["type"] == "step" and e["verdict"]["kind"] != "skip"]
    total = len(read_dataset())
    ran = {e["index"]: e["verdict"]["figures"]["samples_run"] for e in steps}
    n = max(ran)
    assert ran[0] == ran[n] == total  # the ends: the whole dataset
    assert len(ran) > 2 and all(count < total for index, count in ran.items() if index not in (0, n))  # focused
    for step in steps:  # each candidate round asked exactly the samples its observation holds
        for trial in step["trials"]:
            observation = Observation.load(tmp_path / "s" / trial["observation"])
            request = json.loads((tmp_path / "s" / trial["observation"]).with_name(
                Path(trial["observation"]).name.replace("obs-", "request-")).read_text())
            asked = request["accuracy"]["sample_ids"]
            assert [s.id for s in observation.samples or []] == (asked or [r["id"] for r in read_dataset()])
    report = (tmp_path / "s" / "report.md").read_text()
    assert "## Bad against good" in report and "and wrong at the culprit:" in report


SAMPLED_SERVER = HELPERS / "sampled_answer_server.py"


def sampled_recipe(tmp_path: Path, dataset: Path, seed: int) -> Path:
    """A sampled evaluation as the nightly's (temperature 0.6, every question asked 4 times a
    round) of a server whose every answer is a fresh draw, asked for a 0.99 confidence."""
    server = [sys.executable, str(SAMPLED_SERVER), "{model}", "--seed", str(seed), "--count",
              str(tmp_path / "starts.txt")]
    harness = [sys.executable, str(HARNESS), "{base_url}", "{model}", "{dataset}", "{output}", "--repeats",
               "{repeats}", "--temperature", "0.6"]
    recipe = {
        "name": "fresh-draws", "model": {"path": str(tmp_path / "model")},
        "engine": {"backend": "openai", "launcher": server, "port": free_port(), "startup_timeout_s": 60},
        "accuracy": {"harness": "command", "dataset": str(dataset), "command": {"argv": harness},
                     "sampling": {"temperature": 0.6, "max_tokens": 4}, "repeats": 4, "confidence": 0.99},
        "oracle": {"kinds": ["accuracy"]},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe))
    return path


@pytest.mark.parametrize(("commits", "culprit"), [
    (16, 11),
    pytest.param(48, 29, marks=pytest.mark.heavy),  # 48 commits: one to two minutes
])
def test_served_fresh_draws_name_the_right_culprit(tmp_path: Path, commits: int, culprit: int) -> None:
    """Commits each serving their own server, a 200-question set whose every answer is drawn anew
    (82% right before the culprit, 70% from it on): the sampled bisection names the culprit at the
    confidence asked, every step judged on its side, and each candidate's first step ran a focused
    round."""
    shas = make_linear_repo(tmp_path / "up", commits, culprit=culprit)
    dataset = tmp_path / "questions.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"q{i:03d}", "question": f"question {i}", "answer": "right"}) + "\n"
                               for i in range(200)))
    session = tmp_path / "s"
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(tmp_path / "up"), "--good",
                           shas[0], "--bad", shas[-1], "--recipe", str(sampled_recipe(tmp_path, dataset, seed=0)),
                           "--session", str(session), "--no-fix", "--no-verdict-store", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=580, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[culprit]
    entries = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    end = next(e for e in entries if e["type"] == "end")
    assert end["figures"]["posterior"] >= 0.99
    steps = [e for e in entries if e["type"] == "step" and e["verdict"]["kind"] != "skip"]
    sides = [(e["index"], e["verdict"]["kind"]) for e in steps]  # a commit asked twice: both verdicts
    assert all(kind == ("good" if index < culprit else "bad") for index, kind in sides), sides
    assert (culprit, "bad") in sides and (culprit - 1, "good") in sides
    first: dict[int, dict] = {}
    for e in steps:
        first.setdefault(e["index"], e)
    # A candidate's first step runs a focused round (asked again, it runs the focused samples it has not).
    assert all(e["verdict"]["figures"]["samples_run"] < 200 for i, e in first.items() if i not in (0, commits - 1))
    resumed_session_asks_a_commit_for_samples_it_has_not_run(session, steps, commits - 1)


def resumed_session_asks_a_commit_for_samples_it_has_not_run(session: Path, steps: list[dict], n: int) -> None:
    """The session opened again from its journal: a candidate the search would ask again runs
    none of the samples its journaled steps ran (as the uninterrupted session would)."""
    ran: dict[str, set[str]] = {}
    for e in steps:
        for trial in e["trials"]:
            ran.setdefault(e["commit"], set()).update(
                s.id for s in Observation.load(session / trial["observation"]).samples or [])
    resumed = Session.resume(session)
    try:
        resumed.references.ensure(lambda _trials: pytest.fail("the good end ran before: it is journaled"))
        accuracy = resumed.evaluator.accuracy
        assert accuracy is not None and accuracy.bad_end is not None
        firsts = {commit: accuracy.plan(commit, "candidate")[0]
                  for commit in {e["commit"] for e in steps if e["index"] not in (0, n)}}
        # A commit whose steps ran nearly every sample the ends disagree on runs the whole set.
        assert all(ids is None or not set(ids) & ran[commit] for commit, ids in firsts.items()), firsts
        assert any(ids is not None for ids in firsts.values())
    finally:
        resumed.close()
