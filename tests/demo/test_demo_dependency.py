"""The demo's dependency: minivllm's generated history, the upstream's pin move, and the regression
that crosses it, observed with real probe runs of the upstream over the dependency's trees."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bisect_npu.demo.generate import GENERATOR_VERSION
from bisect_npu.demo.manifest import Manifest
from bisect_npu.fix import propose_fixes
from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle import judge_observation
from bisect_npu.orchestration.running.probe_requests import probe_request
from bisect_npu.recipe.loader import load_recipe
from tests.helpers.paths import REPO_ROOT

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

PIN = re.compile(r"^ARG MINIVLLM_TAG=(\S+)$", re.MULTILINE)


def run_git(repo: Path | str, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def first_parent(repo: Path | str, good: str, bad: str) -> list[str]:
    return run_git(repo, "rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()


def pin_at(repo: Path | str, sha: str) -> str | None:
    found = PIN.search(run_git(repo, "show", f"{sha}:Dockerfile"))
    return found[1] if found else None


def test_dependency_history_has_tags_a_regression_and_its_later_fix(demo_upstream):
    _, manifest = demo_upstream
    dep = manifest.dependency("minivllm")
    truth = manifest.case("dependency").dependency
    assert truth is not None and truth.name == dep.name
    repo = dep.repo
    main = run_git(repo, "rev-list", "--first-parent", "main").split()
    assert len(main) == dep.commit_count >= 40
    titles = run_git(repo, "log", "--format=%s", "main").splitlines()
    assert all(re.search(r"^\[(Core|Doc|CI|Misc|BugFix|Refactor)\] .+ \(#\d+\)$", t) for t in titles)
    assert set(dep.tags) == {"v0.1.0", "v0.2.0", "v0.3.0", "v0.3.1"}
    assert {name: run_git(repo, "rev-parse", name).strip() for name in dep.tags} == dep.tags
    assert (dep.tags[truth.old_pin], dep.tags[truth.new_pin]) == (truth.old_sha, truth.new_sha)

    between = first_parent(repo, truth.old_pin, truth.new_pin)
    assert truth.culprit.sha in between and truth.fix.sha not in run_git(repo, "rev-list", truth.new_pin).split()
    assert run_git(repo, "rev-parse", f"{truth.culprit.sha}^").strip() == truth.culprit_parent
    # The fix cites its culprit's PR, and fix_tag is the first release that contains it.
    culprit_pr = re.search(r"\(#(\d+)\)$", truth.culprit.title)[1]  # type: ignore[index]
    assert f"#{culprit_pr}" in run_git(repo, "log", "-1", "--format=%b", truth.fix.sha)
    with_fix = run_git(repo, "tag", "--contains", truth.fix.sha, "--sort=creatordate").split()
    assert with_fix[0] == truth.fix_tag
    # One commit of the range breaks the upstream's import of it (a skip, not a verdict), repaired by
    # the next one and kept away from the culprit so that the culprit stays identifiable.
    (broken,) = dep.import_failing
    assert broken.sha in between and abs(between.index(broken.sha) - between.index(truth.culprit.sha)) > 2
    assert dep.unrelated_bugfix.sha in first_parent(repo, truth.new_pin, truth.fix_tag)


def test_the_upstream_moves_the_pin_late_in_main_after_every_other_case(demo_upstream):
    repo, manifest = demo_upstream
    case = manifest.case("dependency")
    truth = case.dependency
    assert truth is not None and truth.pin_file == "Dockerfile" and truth.pin_arg == "MINIVLLM_TAG"
    assert case.culprit.sha in first_parent(repo, case.good_ref, case.bad_ref)
    assert (pin_at(repo, case.culprit_parent), pin_at(repo, case.culprit.sha)) == (truth.old_pin, truth.new_pin)
    assert (pin_at(repo, case.good_sha), pin_at(repo, case.bad_sha)) == (truth.old_pin, truth.new_pin)
    assert run_git(repo, "diff", "--name-only", case.culprit_parent, case.culprit.sha).split() == ["Dockerfile"]
    # minivllm enters after every earlier case's range and fixes: their commits never import it. The
    # MoE case comes after the dependency's (its recipe runs the engine offline, without the server).
    adoption = run_git(repo, "log", "--format=%H", "-S", "ARG MINIVLLM_TAG", "--reverse", "main").split()[0]
    assert adoption in first_parent(repo, "v0.10.0rc1", case.good_ref)
    later = [other.name for other in manifest.cases if case.bad_sha in first_parent(repo, "v0.9.0", other.good_sha)]
    assert later == ["moe-router"]
    for other in manifest.cases:
        if other.name == "dependency" or other.name in later:
            continue
        for sha in (other.bad_sha, *(f.sha for f in other.fixes)):
            assert pin_at(repo, sha) is None
            assert subprocess.run(["git", "-C", str(repo), "grep", "-q", "minivllm", sha, "--", "tinyvllm"],
                                  check=False).returncode == 1  # no match
    assert "minivllm" in run_git(repo, "show", f"{adoption}:tinyvllm/server.py")


def test_the_dependency_fix_is_ranked_first_in_its_own_history(demo_upstream):
    _, manifest = demo_upstream
    truth = manifest.case("dependency").dependency
    assert truth is not None
    dep = manifest.dependency("minivllm")
    report = propose_fixes(git.Repo(dep.repo), truth.culprit.sha, bad=truth.new_sha)
    assert report.proposals and report.proposals[0].shas == [truth.fix.sha], report.note
    assert all(dep.unrelated_bugfix.sha not in p.shas for p in report.proposals)


@pytest.fixture(scope="module")
def trees(demo_upstream, tmp_path_factory):
    """Worktrees of the upstream (built) and of the dependency, by commit."""
    repo, manifest = demo_upstream
    dep_repo = Path(manifest.dependency("minivllm").repo)
    base = tmp_path_factory.mktemp("dep-trees")

    def tree(sha: str, dependency: bool = False) -> Path:
        dest = base / ("minivllm-" if dependency else "upstream-") / sha[:12]
        if not dest.exists():
            subprocess.run(["git", "-C", str(dep_repo if dependency else repo), "worktree", "add", "-q", "--detach",
                            str(dest), sha], check=True)
            if not dependency:
                subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=dest, check=True, capture_output=True)
        return dest

    return tree


def probe(upstream: Path, dependency: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """The case's probe run with the dependency's tree first on the path, as the local executor puts it."""
    recipe = load_recipe("demo-dependency")
    stem = f"{upstream.name}-{dependency.name}"
    request = probe_request(recipe, recipe.cases[0], commit=stem, trial=0)
    request["output"] = str(out / f"obs-{stem}.json")
    (out / f"req-{stem}.json").write_text(json.dumps(request))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(dependency), str(upstream), str(REPO_ROOT)])}
    return subprocess.run([sys.executable, "-m", "bisect_npu.probe", str(out / f"req-{stem}.json")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def observe(upstream: Path, dependency: Path, out: Path) -> Observation:
    done = probe(upstream, dependency, out)
    assert done.returncode == 0, done.stderr[-2000:]
    return Observation.load(out / f"obs-{upstream.name}-{dependency.name}.json")


@pytest.mark.heavy  # the demo's model on every candidate around the pin move
def test_the_regression_flips_at_the_dependency_culprit_under_the_pin_move(demo_upstream, trees, tmp_path):
    _, manifest = demo_upstream
    case = manifest.case("dependency")
    truth = case.dependency
    assert truth is not None
    oracle = load_recipe(case.recipe).oracle
    at_culprit = trees(case.culprit.sha)
    observed = {name: observe(at_culprit, trees(sha, dependency=True), tmp_path)
                for name, sha in (("parent", truth.culprit_parent), ("culprit", truth.culprit.sha),
                                  ("fix", truth.fix.sha))}
    verdicts = {name: judge_observation(oracle, o, None).kind for name, o in observed.items()}
    assert verdicts == {"parent": VerdictKind.GOOD, "culprit": VerdictKind.BAD, "fix": VerdictKind.GOOD}
    assert observed["culprit"].stop_reason == "repetition_detected" and observed["parent"].stop_reason is None
    assert {k: observed["parent"].sampling[k] for k in ("presence_penalty", "frequency_penalty")} == {
        "presence_penalty": 1.5, "frequency_penalty": 1.0}
    assert observed["culprit"].sampling["presence_penalty"] == observed["culprit"].sampling["frequency_penalty"] == 0
    # The commit level's own truth: the good end with the old pin, the bad end with the new one.
    good = observe(trees(case.good_sha), trees(truth.old_sha, dependency=True), tmp_path)
    bad = observe(trees(case.bad_sha), trees(truth.new_sha, dependency=True), tmp_path)
    assert (judge_observation(oracle, good, None).kind, judge_observation(oracle, bad, None).kind) == (
        VerdictKind.GOOD, VerdictKind.BAD)
    # The import break cannot start the engine: the probe fails (a skip for the search), no verdict.
    broken = probe(at_culprit, trees(manifest.dependency("minivllm").import_failing[0].sha, dependency=True),
                   tmp_path)
    assert broken.returncode != 0 and "cannot import name 'to_sampling_params'" in broken.stderr


def test_manifest_round_trips_with_its_dependency(demo_upstream, tmp_path):
    _, manifest = demo_upstream
    path = tmp_path / "manifest.json"
    manifest.save(path)
    assert Manifest.load(path) == manifest
    with pytest.raises(KeyError, match="unknown demo dependency 'vllm'; known: minivllm"):
        manifest.dependency("vllm")


def demo_dependency_case(tmp_path: Path, *extra: str) -> tuple[dict, Path]:
    """`bisect-npu demo --case dependency` on a private cache (fix verification adds refs to the
    clones it verifies in); its JSON summary and its top session directory."""
    root = tmp_path / "sessions"
    env = {**os.environ, "BISECT_NPU_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "demo", "--case", "dependency", "--json", "--quiet",
                           "--session-root", str(root), *extra], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for line in ("manifest pin move: v0.2.0 -> v0.3.0 -> MATCH", "manifest minivllm fix tag: v0.3.1 -> MATCH"):
        assert line in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return summary, Path(summary["report"]).parent


def dependency_steps(session: Path) -> tuple[Path, list[dict]]:
    """The dependency level's session (the top journal's `next_level` names it) and its steps."""
    top = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    (below,) = [Path(e["session"]) for e in top if e.get("type") == "next_level" and e["dependency"] == "minivllm"]
    lines = map(json.loads, (below / "journal.jsonl").read_text().splitlines())
    return below, [e for e in lines if e.get("type") == "step"]


def assert_the_chain(summary: dict, session: Path, manifest: Manifest) -> None:
    case = manifest.case("dependency")
    truth = case.dependency
    assert truth is not None
    assert summary["match"] is True and summary["culprit"] == case.culprit.sha
    assert {k: v["found"] for k, v in summary["dependency"].items()} == {
        "culprit": case.culprit.sha, "pin_move": "v0.2.0 -> v0.3.0", "minivllm_culprit": truth.culprit.sha,
        "minivllm_fix": truth.fix.sha, "minivllm_fix_tag": truth.fix_tag}
    markdown = (session / "report.md").read_text()
    assert f"first bad minivllm commit: {truth.culprit.sha[:12]}" in markdown
    assert f"move the pin to >= {truth.fix_tag}, or cherry-pick {truth.fix.sha[:12]}" in markdown


@pytest.mark.heavy  # the whole demo dependency case: two levels bisected on the demo's model
def test_demo_dependency_case_names_the_whole_chain_locally(tmp_path):
    summary, session = demo_dependency_case(tmp_path)
    manifest = Manifest.load(tmp_path / "cache" / "demo" / f"v{GENERATOR_VERSION}" / "seed-0" / "manifest.json")
    assert_the_chain(summary, session, manifest)
    below, steps = dependency_steps(session)
    # The held upstream commit is built once; every dependency candidate is its tree on PYTHONPATH.
    assert [s["build"]["how"] for s in steps].count("built") <= 1
    assert {s["build"]["how"] for s in steps} <= {"built", "overlay", "reused"}  # none failed
    fix_verify = [json.loads(line) for line in (below / "journal.jsonl").read_text().splitlines()][-1]
    assert fix_verify["type"] == "fix_verify" and fix_verify["verifications"][0]["status"] == "verified"


@pytest.mark.container
@pytest.mark.heavy
def test_demo_dependency_case_names_the_whole_chain_in_containers(docker_client, demo_base_image, tmp_path):
    summary, session = demo_dependency_case(tmp_path, "--executor", "docker", "--no-verify-fix")
    manifest = Manifest.load(tmp_path / "cache" / "demo" / f"v{GENERATOR_VERSION}" / "seed-0" / "manifest.json")
    assert_the_chain(summary, session, manifest)
    _, steps = dependency_steps(session)
    # Zero builds at the dependency level: each candidate is one layer over the held culprit's image
    # (made by this run, or by an earlier one over the same commits: the generated shas are fixed).
    assert steps and {s["build"]["how"] for s in steps} <= {"overlay", "reused"}
    held = manifest.case("dependency").culprit.sha
    layers = docker_client.api.images(filters={"label": f"org.bisect-npu.commit={held}"})
    laid = {row["Labels"]["org.bisect-npu.key"] for row in layers
            if row["Labels"].get("org.bisect-npu.kind") == "dependency"}
    assert {f"{held[:16]}-minivllm-{s['commit'][:16]}" for s in steps} <= laid
