"""The generated demo upstream: deterministic, believable, and consistent with its manifest."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.demo.generate import GENERATOR_VERSION, ensure_upstream, generate_upstream
from bisect_npu.demo.manifest import Manifest

# The demo upstream generated and its commits built: the demo's model end to end.
pytestmark = pytest.mark.e2e


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", ancestor, descendant],
                          check=False).returncode == 0


def refs(repo: Path) -> str:
    return git(repo, "show-ref")


def test_same_seed_same_repository(demo_upstream, tmp_path):
    repo, manifest = demo_upstream
    again = generate_upstream(tmp_path / "again", seed=0)
    assert refs(tmp_path / "again") == refs(repo)
    assert refs(Path(again.dependency("minivllm").repo)) == refs(Path(manifest.dependency("minivllm").repo))
    assert again.model_dump(exclude={"repo", "dependencies"}) == manifest.model_dump(exclude={"repo", "dependencies"})
    assert [d.model_dump(exclude={"repo"}) for d in again.dependencies] == [
        d.model_dump(exclude={"repo"}) for d in manifest.dependencies]
    other = generate_upstream(tmp_path / "other", seed=1)
    assert other.branches != manifest.branches
    assert other.dependency("minivllm").branches != manifest.dependency("minivllm").branches


def test_history_looks_like_vllm_ascend(demo_upstream):
    repo, manifest = demo_upstream
    titles = git(repo, "log", "--all", "--format=%s").splitlines()
    assert len(titles) == manifest.commit_count >= 150
    assert all(re.search(r"\(#\d+\)$", t) for t in titles)
    for tag in ("[Feature]", "[BugFix]", "[Doc]", "[CI]", "[Perf]", "[Misc]", "[v0.9.1]"):
        assert any(tag in t for t in titles), tag
    assert set(manifest.tags) >= {"v0.9.0", "v0.9.1"}
    assert git(repo, "merge-base", "v0.9.0", "v0.9.1").strip() == manifest.tags["v0.9.0"]
    assert not is_ancestor(repo, "v0.9.1", "main")  # v0.9.1 lives on the release branch
    tags = {git(repo, "show", f"{sha}:Dockerfile").split("ARG VLLM_TAG=")[1].split()[0]
            for sha in git(repo, "rev-list", "--all").split()}
    assert tags == {"v0.9.0", "v0.9.1"}  # the paired vLLM changes once


def first_parent_range(repo: Path, good: str, bad: str) -> list[str]:
    return git(repo, "rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()


def test_manifest_matches_the_repository(demo_upstream):
    repo, manifest = demo_upstream
    assert {c.name for c in manifest.cases} == {"async-penalty", "rope-longseq", "spec-decode", "presence-penalty",
                                                "dependency", "accuracy", "moe-router"}
    assert manifest.case("accuracy").culprit == manifest.case("rope-longseq").culprit
    for case in manifest.cases:
        candidates = first_parent_range(repo, case.good_ref, case.bad_ref)
        assert case.culprit.sha in candidates, case.name
        assert git(repo, "rev-parse", f"{case.culprit.sha}^").strip() == case.culprit_parent
        assert git(repo, "log", "-1", "--format=%s", case.culprit.sha).strip() == case.culprit.title
        for fix in case.fixes:
            assert fix.sha not in candidates and fix.sha not in git(repo, "rev-list", case.bad_ref).split()
            assert fix.sha in git(repo, "rev-list", fix.branch).split(), (case.name, fix.branch)
            assert is_ancestor(repo, case.culprit.sha, fix.sha) or fix.branch == "main"
        assert case.culprit.sha not in {b.sha for b in manifest.build_failing}
    both = manifest.case("async-penalty").fixes
    assert {f.branch for f in both} == {"main", "v0.9.1-dev"}
    assert len({re.sub(r"\[v0\.9\.1\]| \(#\d+\)$", "", f.title) for f in both}) == 1
    default = manifest.case(manifest.default_case)
    in_default = set(first_parent_range(repo, default.good_ref, default.bad_ref))
    assert sum(b.sha in in_default for b in manifest.build_failing) >= 2


def build(repo: Path, sha: str, tree: Path) -> subprocess.CompletedProcess[str]:
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(tree), sha], check=True)
    return subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=tree, capture_output=True, text=True,
                          check=False)


def test_build_failing_commits_fail_and_others_build(demo_upstream, tmp_path):
    repo, manifest = demo_upstream
    for broken in manifest.build_failing:
        assert build(repo, broken.sha, tmp_path / broken.sha[:10]).returncode != 0, broken.title
        fixed = git(repo, "rev-list", "--reverse", "--first-parent", f"{broken.sha}..{broken.branch}").split()[0]
        assert build(repo, fixed, tmp_path / fixed[:10]).returncode == 0
    tree = tmp_path / "bad-end"
    assert build(repo, manifest.case("async-penalty").bad_sha, tree).returncode == 0
    lib = ctypes.CDLL(str(tree / "tinyvllm" / "_kernels.so"))
    assert lib.tv_argmax is not None and lib.tv_bin_counts is not None
    touched = {t.sha for t in manifest.compiled_touching}
    assert {b.sha for b in manifest.build_failing} <= touched


def test_ensure_upstream_generates_once(tmp_path, monkeypatch):
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    repo, manifest = ensure_upstream(seed=0)
    assert repo == tmp_path / "cache" / "demo" / f"v{GENERATOR_VERSION}" / "seed-0" / "upstream"
    assert Manifest.load(repo.parent / "manifest.json") == manifest
    dependency = repo.parent / "minivllm"
    assert manifest.dependency("minivllm").repo == str(dependency)
    assert git(dependency, "rev-parse", "main").strip() == manifest.dependency("minivllm").branches["main"]
    marker = repo / ".git" / "still-here"
    marker.write_text("")
    again, _ = ensure_upstream(seed=0)
    assert again == repo and marker.exists()
    with pytest.raises(FileExistsError):
        generate_upstream(repo, seed=0)
