"""Noisy sessions through the real CLI: a flaky command oracle, kills mid-trial, --find-fix."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from bisect_npu.orchestration.session import Session
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "bisect_npu"]

# Fails in 70% of trials on bad commits, never on good ones; deterministic per (commit, trial), so
# a repeated trial number would repeat its outcome (the session must never reuse one).
FLAKY = """\
import hashlib, os, sys, time
time.sleep(float(os.environ.get("FLAKY_SLEEP", "0")))
key = os.environ["BISECT_NPU_COMMIT"] + "-" + os.environ["BISECT_NPU_TRIAL"]
roll = int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100
bad = open("state").read().strip() == "bad"
sys.exit(1 if bad and roll < 70 else 0)
"""


@pytest.fixture()
def flaky(tmp_path: Path) -> str:
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    return f"{sys.executable} {script}"


def journal(session: Path) -> list[dict]:
    return [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]


class PlainNoisy(NamedTuple):
    """The plain noisy session over 128 commits (culprit 50), once for the module: the flaky
    command it ran, its history's shas, its session, and the verdict store it wrote."""

    flaky: str
    repo: Path
    shas: list[str]
    session: Path
    store: Path


@pytest.fixture(scope="module")
def plain_noisy(tmp_path_factory: pytest.TempPathFactory) -> PlainNoisy:
    """The session two tests read (nothing changes it): found once, in a new verdict store of its
    own, which the earlier-runs test's session starts from as it did when it ran both."""
    root = tmp_path_factory.mktemp("plain-noisy")
    script = root / "flaky.py"
    script.write_text(FLAKY)
    flaky = f"{sys.executable} {script}"
    shas = make_linear_repo(root / "repo", 129, culprit=50, tags={0: "good", 128: "bad"})
    store = root / "verdicts.sqlite"
    done = subprocess.run([*CLI, "run", "--repo", str(root / "repo"), "--good", "good", "--bad", "bad", "--cmd", flaky,
                           "--mode", "noisy", "--session", str(root / "s"), "--no-fix", "--json"],
                          cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "BISECT_NPU_VERDICT_STORE": str(store)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[50]
    return PlainNoisy(flaky, root / "repo", shas, root / "s", store)


def test_noisy_mode_finds_a_flaky_culprit(plain_noisy: PlainNoisy) -> None:
    trials = [(e["index"], e["trial"]) for e in journal(plain_noisy.session) if e["type"] == "trial"]
    assert len(trials) == len(set(trials)), "a trial number was reused at one commit"
    end = next(e for e in journal(plain_noisy.session) if e["type"] == "end")
    assert end["confidence"] >= 0.99
    # What the search was told a build and an engine start cost, from the journal alone.
    session = Session.resume(plain_noisy.session)
    try:
        problem = session.problem()
    finally:
        session.evaluator.close()
        session.journal.close()
    entries = journal(plain_noisy.session)
    builds = [e["build"]["seconds"] for e in entries if e["type"] == "step" and e["build"]["how"] == "built"]
    runs = [e["seconds"] for e in entries if e["type"] == "trial"]
    assert problem.load_cost == 0.0  # a command starts afresh for every trial: nothing to share
    assert problem.build_cost == pytest.approx(statistics.mean(builds) / statistics.mean(runs), abs=0.01)
    assert problem.build_cost > 0


def test_noisy_slots_share_commits_without_sharing_trial_numbers(tmp_path: Path, flaky: str) -> None:
    """Three slots: late rounds put several slots on the culprit and its parent at once; each
    trial still gets its own number (its own seed) and the answer is the same."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 129, culprit=50, tags={0: "good", 128: "bad"})
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", flaky,
                           "--mode", "noisy", "--slots", "3", "--session", str(tmp_path / "s"), "--no-fix", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FLAKY_SLEEP": "0.05"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[50]
    entries = journal(tmp_path / "s")
    trials = [(e["index"], e["trial"]) for e in entries if e["type"] == "trial"]
    assert len(trials) == len(set(trials)), "two slots ran one trial number at one commit"
    steps = [e["index"] for e in entries if e["type"] == "step"]
    assert max(steps.count(i) for i in (49, 50)) >= 3


def test_earlier_runs_are_counted_and_reported(tmp_path: Path, plain_noisy: PlainNoisy,
                                               own_verdict_store: Path) -> None:
    """Ends measured before the session (70/100, 0/100) let the search stop sooner on the same
    culprit; the report says what it counted; a malformed count is a usage error."""
    flaky, repo, shas = plain_noisy.flaky, plain_noisy.repo, plain_noisy.shas
    shutil.copy2(plain_noisy.store, own_verdict_store)  # the plain session's verdicts, as if it ran here
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", flaky,
                           "--mode", "noisy", "--session", str(tmp_path / "earlier"), "--no-fix", "--json",
                           "--earlier-runs", "70/100", "0/100"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[50]
    trials = {name: sum(1 for e in journal(session) if e["type"] == "trial")
              for name, session in (("plain", plain_noisy.session), ("earlier", tmp_path / "earlier"))}
    assert trials["earlier"] < trials["plain"]
    report = (tmp_path / "earlier" / "report.md").read_text()
    assert "| earlier runs | counted by the search, not in the steps: symptom in 70/100 runs" in report
    assert "earlier runs" not in (plain_noisy.session / "report.md").read_text()
    # The evidence behind the answer, in words: the culprit's and its parent's trials, the posterior.
    as_json = json.loads((tmp_path / "earlier" / "report.json").read_text())
    evidence = as_json["evidence"]
    assert as_json["evidence_counts"] == "runs with the symptom"
    parent = round(evidence["parent_rate"] * evidence["parent_trials"])
    assert (f"its parent `{shas[49][:12]}`: the symptom in {parent} of {evidence['parent_trials']:.0f} trials"
            in report
            and "posterior that this is the first bad commit: " in report)
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", flaky,
                           "--mode", "noisy", "--session", str(tmp_path / "bad-input"), "--earlier-runs", "7/5", "0/5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2
    assert "--earlier-runs 7/5 0/5: '7/5' counts more runs with the symptom than runs made" in done.stderr
    assert not (tmp_path / "bad-input").exists()
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", flaky,
                           "--session", str(tmp_path / "exact"), "--earlier-runs", "7/10", "0/10"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "--earlier-runs counts only in noisy mode" in done.stderr


@pytest.mark.heavy  # the resume tests' variant for a noisy session
def test_noisy_session_killed_mid_trial_resumes_without_losing_trials(tmp_path: Path, flaky: str) -> None:
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 65, culprit=40, tags={0: "good", 64: "bad"})
    session = tmp_path / "s"
    env = {**os.environ, "FLAKY_SLEEP": "0.15"}
    start = [*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", flaky, "--mode", "noisy",
             "--session", str(session), "--no-fix", "--quiet"]
    resume = [*CLI, "resume", "--session", str(session), "--quiet"]
    rng = random.Random(3)
    trials_seen: list[tuple[int, int]] = []
    for _ in range(8):
        argv = resume if (session / "journal.jsonl").exists() else start
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        time.sleep(rng.uniform(1.0, 2.5))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if not (session / "journal.jsonl").exists():
            continue
        entries = journal(session)
        now = [(e["index"], e["trial"]) for e in entries if e["type"] == "trial"]
        assert now[: len(trials_seen)] == trials_seen, "a finished trial was lost"
        trials_seen = now
        if any(e["type"] == "end" for e in entries):
            break
    argv = resume if (session / "journal.jsonl").exists() else start
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    entries = journal(session)
    trials = [(e["index"], e["trial"]) for e in entries if e["type"] == "trial"]
    assert trials[: len(trials_seen)] == trials_seen
    assert len(trials) == len(set(trials))
    assert next(e for e in entries if e["type"] == "end")["culprit"] == shas[40]


def test_find_fix_flips_the_terms(tmp_path: Path) -> None:
    """Old end broken, new end fixed: the answer is the first commit without the symptom."""
    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 100, culprit=None, tags={0: "old", 99: "new"},
                            files=lambda i: {"state": "good\n" if i >= 61 else "bad\n"})
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--old", "old", "--new", "new", "--cmd",
                           " ".join(GOOD_CMD), "--find-fix", "--session", str(tmp_path / "s"), "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == shas[61]
    assert "first fixed commit" in done.stdout
    report = (tmp_path / "s" / "report.md").read_text()
    assert "First fixed commit" in report and "old (broken)" in report
    assert "**good** at the fix (step " in report and f"**bad** at its parent `{shas[60][:12]}` (step " in report
    # The ends check is flipped too: a "fixed" old end is a precondition failure.
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--old", shas[70], "--new", "new", "--cmd",
                           " ".join(GOOD_CMD), "--find-fix", "--session", str(tmp_path / "s2")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 4 and f"the old end {shas[70]} does not show the symptom" in done.stdout
    # A new end that still shows the symptom is named as the new end.
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--old", "old", "--new", shas[40], "--cmd",
                           " ".join(GOOD_CMD), "--find-fix", "--session", str(tmp_path / "s3")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 4 and f"the new end {shas[40]} still shows the symptom" in done.stdout


def test_a_step_whose_trials_were_all_skipped_says_why(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 5, tags={0: "good", 4: "bad"})
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd",
                           "sh -c 'exit 125'", "--mode", "noisy", "--no-fix", "--session", str(tmp_path / "s")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "could not be tested (no trial could be judged (1 run): command exited 125 (skip))" in done.stdout


def test_a_bad_end_that_never_shows_the_symptom_is_said_so_in_noisy_mode(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_linear_repo(repo, 5, tags={0: "good", 4: "bad"})
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", "good", "--bad", "bad", "--cmd", "true",
                           "--mode", "noisy", "--no-fix", "--session", str(tmp_path / "s")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "the bad end bad never showed the symptom in " in done.stdout
    assert "check the command reproduces the problem at bad" in done.stdout
