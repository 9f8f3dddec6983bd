"""The four seeded demo regressions, bisected through the normal `bisect-npu run` path.

Real git worktrees, real kernel builds, real model forward passes in probe subprocesses, the
real oracle and search: the culprit must equal the manifest's, and the default case's fix must
be proposed first and verified.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.demo.manifest import Manifest

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

DemoUpstream = tuple[Path, Manifest]


@pytest.fixture(scope="module")
def demo_upstream(tmp_path_factory: pytest.TempPathFactory) -> DemoUpstream:
    """A private copy: fix verification adds a commit under refs/bisect-npu/fixes to the upstream it
    verifies in, which must not leak into the shared `demo_upstream` other tests compare byte for byte."""
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path_factory.mktemp("demo-bisect") / "upstream"
    return repo, generate_upstream(repo, seed=0)

CLI = [sys.executable, "-m", "bisect_npu"]


def run_case(demo_upstream: DemoUpstream, name: str, tmp_path: Path, *extra: str) -> tuple[dict, Path]:
    repo, manifest = demo_upstream
    truth = manifest.case(name)
    session = tmp_path / "session"
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", truth.good_ref, "--bad", truth.bad_ref,
                           "--recipe", truth.recipe, "--session", str(session), "--json", *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), session


def test_default_case_finds_culprit_and_verifies_its_fix(demo_upstream: DemoUpstream, tmp_path: Path) -> None:
    _, manifest = demo_upstream
    truth = manifest.case("async-penalty")
    result, session = run_case(demo_upstream, "async-penalty", tmp_path, "--verify-fix")
    assert result["culprit"] == truth.culprit.sha
    report = json.loads((session / "report.json").read_text())
    steps = report["steps"]
    # Local builds avoid compiles too: a commit whose key was built gets the build's outputs, and
    # the search, told the groups, prefers those; a build break it still tests is a skip.
    assert "overlay" in [s["build"] for s in steps]
    assert all(s["verdict"] == "skip" for s in steps if s["build"] == "failed")
    assert "load_cost" not in report["search_told"]  # exact mode weighs builds, not engine starts
    first = report["fix"]["proposals"][0]
    assert set(first["shas"]) == {f.sha for f in truth.fixes}  # twins on both branches, one proposal
    verified = [v for v in report["fix_verify"] if v["status"] == "verified"]
    assert verified and verified[0]["proposal"]["shas"] == first["shas"]
    assert manifest.unrelated_bugfix.sha not in {sha for v in verified for sha in v["proposal"]["shas"]}
    markdown = (session / "report.md").read_text()
    assert truth.culprit.title in markdown and "verified" in markdown

    # Which setting the culprit needs: a settings search at it, in the session's own report.
    done = subprocess.run([*CLI, "settings", "--after", str(session), "--good-set", "cases[*].sampling.logprobs=3",
                           "--good-set", "engine.args.async_scheduling=false", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["trigger"] == ["engine.args.async_scheduling"]
    settings = json.loads((session / "report.json").read_text())["settings"]
    assert settings["commit"] == truth.culprit.sha and settings["trigger"] == ["engine.args.async_scheduling"]
    assert settings["configurations"][0]["build"] == "stored"  # the culprit's own verdict from the commit search
    markdown = (session / "report.md").read_text()
    assert "## Settings" in markdown and "The culprit shows the symptom only with async_scheduling: true." in markdown


@pytest.mark.heavy
@pytest.mark.parametrize(("name", "prefetch", "trigger"), [("rope-longseq", False, "cases[*].sampling.max_tokens"),
                                                            ("spec-decode", True, "cases[*].sampling.temperature")])
def test_exact_cases_find_the_manifest_culprit(demo_upstream: DemoUpstream, tmp_path: Path, name: str,
                                               prefetch: bool, trigger: str) -> None:
    """Each also asks which setting its culprit needs: spec-decode's temperature (0.0 is good), and
    rope-longseq's output length, judged against each configuration's own output at the commit
    search's good end (the default reference commit where a length is a key); not logprobs."""
    _, manifest = demo_upstream
    good = {"cases[*].sampling.temperature": 0.0} if name == "spec-decode" else {"cases[*].sampling.max_tokens": 100}
    settings = [part for key, value in {**good, "cases[*].sampling.logprobs": 3}.items()
                for part in ("--settings", f"{key}={value}")]
    result, session = run_case(demo_upstream, name, tmp_path, "--no-fix", *(["--prefetch"] if prefetch else []),
                               *settings)
    assert result["culprit"] == manifest.case(name).culprit.sha
    found = json.loads((session / "report.json").read_text())["settings"]
    assert found["commit"] == result["culprit"] and found["trigger"] == [trigger]
    assert found["configurations"][0]["build"] == "stored"  # the culprit's own step, from the verdict store
    assert found["reference_commit"] == (manifest.case(name).good_sha if name == "rope-longseq" else None)
    parent = subprocess.run(["git", "-C", str(demo_upstream[0]), "rev-parse", f"{result['culprit']}^"],
                            capture_output=True, text=True, check=True).stdout.strip()
    markdown = (session / "report.md").read_text()
    assert "**bad** at the culprit (step " in markdown and f"**good** at its parent `{parent[:12]}` (step " in markdown
    saved = json.loads((session / "report.json").read_text())["prefetch_saved_s"]
    if prefetch:  # the next candidates' worktrees and kernel builds were ready before they were asked for
        assert saved > 0
    else:
        assert saved is None


@pytest.mark.heavy
def test_noisy_presence_penalty_case(demo_upstream: DemoUpstream, tmp_path: Path) -> None:
    """Visible only as a loop rate over trials: the noisy search must still name the culprit."""
    _, manifest = demo_upstream
    result, session = run_case(demo_upstream, "presence-penalty", tmp_path, "--no-fix")
    assert result["culprit"] == manifest.case("presence-penalty").culprit.sha
    entries = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    assert entries[-1]["type"] == "end" and entries[-1]["confidence"] >= 0.95
    # A query's trials share one engine start (one probe log), sized by the measured start cost.
    trials = [e for e in entries if e["type"] == "trial"]
    runs = {(e["index"], e["log"]) for e in trials}
    assert len(runs) < len(trials) / 2
    assert sum(e["startup_s"] > 0 for e in trials) == len(runs)
    for index in {e["index"] for e in trials}:
        numbers = [e["trial"] for e in trials if e["index"] == index]
        assert len(numbers) == len(set(numbers))  # never a repeated seed
    report = json.loads((session / "report.json").read_text())
    assert (report["engine_starts"]["trials"], report["engine_starts"]["starts"]) == (len(trials), len(runs))
    # The last step journals what its choice weighed: the engine start measured from the trials
    # journaled before that choice (one slot: everything before the previous step's line).
    steps = [i for i, e in enumerate(entries) if e["type"] == "step"]
    before = [e for e in entries[:steps[-2] + 1] if e["type"] == "trial" and e.get("observation")]
    startups = [e["startup_s"] for e in before if e["startup_s"] > 0]
    runs_s = [e["seconds"] - e["startup_s"] for e in before]
    measured = round((sum(startups) / len(startups)) / (sum(runs_s) / len(runs_s)), 2)
    assert entries[steps[-1]]["told"]["load_cost"] == measured > 0
    assert report["search_told"] == entries[steps[-1]]["told"]
    assert f"| search costs | the last choice weighed an engine start at {measured} trials" in (
        session / "report.md").read_text()
