"""LocalBuilder: worktrees per candidate, shared by slots that run one commit at once."""

from __future__ import annotations

import threading
from pathlib import Path

import git
from gitrepo import make_linear_repo

from bisect_npu.build.local import LocalBuilder


def test_slots_on_one_commit_share_one_build_until_the_last_releases(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path / "repo", 4)
    builds = tmp_path / "builds.log"
    # A real build that takes a while and leaves a trace of each run.
    command = ["sh", "-c", f"sleep 0.5; echo built >> {builds}"]
    local = LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work", command, keep=1)
    envs = []
    barrier = threading.Barrier(3)

    def slot() -> None:
        barrier.wait(timeout=10)
        envs.append(local.acquire(shas[2], tmp_path / "logs"))

    threads = [threading.Thread(target=slot) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    try:
        assert builds.read_text().count("built") == 1
        assert len({env.path for env in envs}) == 1
        assert sorted(env.how for env in envs) == ["built", "reused", "reused"]
        worktree = Path(envs[0].path or "")
        # Another commit is built and kept (keep=1) while shas[2] is still held: nothing evicts it.
        other = local.acquire(shas[3], tmp_path / "logs")
        local.release(other)
        for env in envs[:2]:
            local.release(env)
            assert worktree.is_dir(), "released while a slot still runs in it"
        local.release(envs[2])
        assert worktree.is_dir()  # kept for later trials; shas[3]'s worktree made room
        assert not Path(other.path or "").exists()
        again = local.acquire(shas[2], tmp_path / "logs")
        assert again.how == "reused" and builds.read_text().count("built") == 2  # shas[3] built once too
        local.release(again)
    finally:
        local.close()
    assert not worktree.exists()
