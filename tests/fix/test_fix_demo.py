"""The demo's seeded regressions: their fix is ranked first, the unrelated bug fix is never proposed.

Two tiers: the demo's own patches (bisect_npu.demo.patches) replayed on a small real history here,
and the generated demo upstream with its manifest (once bisect_npu.demo.generate is present).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from bisect_npu.demo import patches
from bisect_npu.fix import FixProposal, propose_fixes, verify_fixes
from bisect_npu.observations import Verdict, VerdictKind
from tests.helpers.fix_history import History

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

UPSTREAM = Path(patches.__file__).parent / "upstream"
CASES = {
    "async": (patches.ASYNC_CULPRIT, patches.ASYNC_FIX),
    "rope": (patches.ROPE_CULPRIT, patches.ROPE_FIX),
    "spec": (patches.SPEC_CULPRIT, patches.SPEC_FIX),
    "override": (patches.OVERRIDE_CULPRIT, patches.OVERRIDE_FIX),
}


def replay(hist: History, change: patches.Change, pr: int) -> str:
    paths = {p.path for p in change.patches}
    files = {p: (hist.path / p).read_text() if (hist.path / p).exists() else "" for p in paths}
    patches.apply_patches(files, change.patches)
    return hist.commit(f"{change.title} (#{pr})", files, change.body)


def test_demo_patches_rank_their_fix_first(tmp_path):
    hist = History(tmp_path / "up")
    sources = {str(p.relative_to(UPSTREAM)): p.read_text() for p in UPSTREAM.rglob("*")
               if p.is_file() and p.suffix in (".py", ".md", ".txt", ".c", "") and "__pycache__" not in p.parts}
    hist.commit("Initial tinyvllm (#1)", sources)
    culprits = {}
    for pr, (name, (culprit, _)) in enumerate(CASES.items(), 10):
        culprits[name] = replay(hist, culprit, pr)
        hist.filler(2)
    bad = hist.head()
    unrelated = replay(hist, patches.UNRELATED_FIX, 40)
    fixes = {}
    for pr, (name, (_, fix)) in enumerate(CASES.items(), 50):
        fixes[name] = replay(hist, fix, pr)
        hist.filler(1)
    repo = git.Repo(hist.path)
    for name, culprit in culprits.items():
        report = propose_fixes(repo, culprit, bad=bad)
        assert report.proposals and report.proposals[0].shas == [fixes[name]], (name, report.note)
        assert "provenance" in {r.signal for r in report.proposals[0].reasons}
        assert all(unrelated not in p.shas for p in report.proposals), name


def test_generated_demo_manifest_fix_is_ranked_first(tmp_path):
    from bisect_npu.demo import generate

    manifest = generate.generate_upstream(tmp_path / "upstream", seed=0)
    repo = git.Repo(manifest.repo)
    assert [case.name for case in manifest.cases] == list(generate.CASES)  # every case, the accuracy one too
    for case in manifest.cases:
        if case.dependency is not None:  # its fix lies in the dependency's history (test_demo_dependency)
            continue
        report = propose_fixes(repo, case.culprit.sha, bad=case.bad_sha)
        assert report.proposals, f"{case.name}: {report.note}"
        best = report.proposals[0]
        assert {fix.sha for fix in case.fixes} <= set(best.shas), (case.name, best.title, best.reasons)
        assert all(manifest.unrelated_bugfix.sha not in p.shas for p in report.proposals), case.name


ASYNC_CHECK = """
from tinyvllm.engine import LLM
from tinyvllm.sampling_params import SamplingParams

params = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=64)
sync = LLM("seed:0").generate("hello world", params)
raise SystemExit(0 if LLM("seed:0", async_scheduling=True).generate("hello world", params) == sync else 1)
"""


def demo_evaluator(repo_path: Path, scratch: Path):
    """The async-penalty bad case in a real checkout: build the kernels, run the engine both ways."""
    def evaluate(sha: str) -> Verdict:
        tree = scratch / f"eval-{sha[:10]}"
        subprocess.run(["git", "-C", str(repo_path), "worktree", "add", "--detach", "-q", str(tree), sha], check=True)
        try:
            subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=tree, check=True, capture_output=True)
            done = subprocess.run([sys.executable, "-c", ASYNC_CHECK], cwd=tree, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(tree)}, timeout=300)
        finally:
            subprocess.run(["git", "-C", str(repo_path), "worktree", "remove", "--force", str(tree)], check=True)
        kind = VerdictKind.GOOD if done.returncode == 0 else VerdictKind.BAD
        return Verdict(kind=kind, reason=f"async == sync: {done.returncode == 0} {done.stderr[-200:]}")

    return evaluate


@pytest.mark.slow
def test_generated_demo_async_fix_is_verified_when_ranked_below_the_unrelated_bugfix(tmp_path):
    from bisect_npu.demo import generate

    manifest = generate.generate_upstream(tmp_path / "upstream", seed=0)
    repo = git.Repo(manifest.repo)
    case = manifest.case("async-penalty")
    report = propose_fixes(repo, case.culprit.sha, bad=case.bad_sha)
    unrelated = FixProposal(shas=[manifest.unrelated_bugfix.sha], branches=[manifest.unrelated_bugfix.branch],
                            title=manifest.unrelated_bugfix.title, pr=None, score=0.0, reasons=[])
    report.proposals = [unrelated, *report.proposals[:1]]  # the wrong one ranked above: the walk goes on
    results = verify_fixes(repo, case.bad_sha, report, demo_evaluator(Path(manifest.repo), tmp_path),
                           workdir=tmp_path / "work")
    assert [r.status for r in results] == ["verified", "not_verified"], [r.detail for r in results]
    assert {f.sha for f in case.fixes} <= set(results[0].proposal.shas)
    # The back-port on the bad end's branch is what gets applied, not the main-line original.
    backport = next(f for f in case.fixes if f.branch != "main")
    assert f"cherry picked from commit {backport.sha}" in repo.commit(results[0].applied_sha).message
