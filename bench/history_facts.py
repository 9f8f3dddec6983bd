"""How long per-commit facts take for a range: one batched `git log` against one git call per commit.

    .venv/bin/python bench/history_facts.py [N]

Builds an N-commit (default 1,000) linear repository whose Dockerfile changes every 50 commits,
then times `history.commits_facts` over all of it, and a baseline measured in the same run: two
git subprocesses per commit (`git show --name-only` and `git show SHA:Dockerfile`), which is what
a straightforward per-commit implementation costs. The baseline runs on the first 200 commits
only (it is slow); figures are per commit, so the ratio does not depend on that.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import git

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bisect_npu.upstream import history
from tests.helpers.gitrepo import make_linear_repo

DOCKERFILE = "FROM quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10\nARG VLLM_TAG=v0.9.{}\n"


def baseline(path: Path, shas: list[str]) -> None:
    for sha in shas:
        subprocess.run(
            ["git", "-C", str(path), "show", "--name-only", "--format=%H%x1f%s%x1f%aI", sha],
            check=True, capture_output=True,
        )
        subprocess.run(["git", "-C", str(path), "show", f"{sha}:Dockerfile"], check=True, capture_output=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "repo"
        started = time.perf_counter()
        shas = make_linear_repo(
            path, n,
            titles=lambda i: f"[BugFix] change {i} (#{i})",
            files=lambda i: {"Dockerfile": DOCKERFILE.format(i // 50)} if i % 50 == 0 else {},
        )
        made = time.perf_counter() - started
        repo = git.Repo(path)

        started = time.perf_counter()
        facts = history.commits_facts(repo, shas)
        batched = time.perf_counter() - started
        assert facts[-1].dockerfile is not None and facts[-1].dockerfile.vllm_tag == f"v0.9.{(n - 1) // 50}"

        sample = shas[:200]
        started = time.perf_counter()
        baseline(path, sample)
        per_commit_baseline = (time.perf_counter() - started) / len(sample)

    per_commit_batched = batched / n
    print(f"make_linear_repo({n}): {made:.2f} s")
    print(f"commits_facts over {n} commits: {batched:.3f} s ({per_commit_batched * 1e3:.3f} ms/commit)")
    print(f"baseline, 2 git processes per commit ({len(sample)} commits): {per_commit_baseline * 1e3:.2f} ms/commit")
    print(f"speed-up: {per_commit_baseline / per_commit_batched:.0f}x "
          f"(baseline for {n} commits would take {per_commit_baseline * n:.1f} s)")


if __name__ == "__main__":
    main()
