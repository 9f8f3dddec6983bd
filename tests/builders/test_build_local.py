"""LocalBuilder: worktrees per candidate, shared by slots that run one commit at once."""

from __future__ import annotations

import threading
from pathlib import Path

import git
import pytest

from bisect_npu.builders.local import LocalBuilder, check_workdir
from bisect_npu.errors import UsageError
from tests.helpers.gitrepo import make_linear_repo


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


BUILD_SH = """set -e
mkdir -p out
cat csrc/k.c > out/kernel.bin
echo "$(basename "$PWD")" > out/built_in
python3 -m py_compile app.py
echo run >> "$BUILD_RUNS"
"""


@pytest.mark.e2e
def test_commits_sharing_a_build_key_get_the_first_ones_outputs_instead_of_a_build(tmp_path: Path,
                                                                                monkeypatch) -> None:
    runs = tmp_path / "runs.log"
    monkeypatch.setenv("BUILD_RUNS", str(runs))
    files = {0: {"csrc/k.c": "k1\n", "build.sh": BUILD_SH, "app.py": "V = 0\n", ".gitignore": "out/\n"},
             1: {"app.py": "V = 1\n"},  # python only: same key
             2: {"csrc/k.c": "k2\n"},  # compiled input: a new key
             3: {"build.sh": BUILD_SH + "echo extra > out/extra\n"}}  # what the build command runs: a new key
    shas = make_linear_repo(tmp_path / "repo", 4, files=lambda i: files[i])
    local = LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work", ["sh", "build.sh"],
                         artifacts_dir=tmp_path / "outputs")
    envs = [local.acquire(sha, tmp_path / "logs") for sha in shas]
    try:
        assert [env.how for env in envs] == ["built", "overlay", "built", "built"]
        assert runs.read_text().count("run") == 3
        keys = [env.build_key for env in envs]
        assert keys[0] == keys[1] and len({keys[0], keys[2], keys[3]}) == 3
        tree = [Path(env.path or "") for env in envs]
        # The overlay has its own python and the first commit's build outputs, byte for byte.
        assert (tree[1] / "app.py").read_text() == "V = 1\n"
        assert (tree[1] / "out" / "kernel.bin").read_text() == "k1\n"
        assert (tree[1] / "out" / "built_in").read_text() == (tree[0] / "out" / "built_in").read_text()
        assert list(tree[0].rglob("*.pyc")) and not list(tree[1].rglob("*.pyc"))  # bytecode is per commit
        assert (tree[2] / "out" / "kernel.bin").read_text() == "k2\n"
        assert (tree[3] / "out" / "extra").is_file()
        assert "no build command run" in Path(envs[1].log_path or "").read_text()
    finally:
        local.close()
    assert not (tmp_path / "outputs").exists()


def test_without_an_artifacts_directory_every_commit_is_its_own_build(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path / "repo", 2)
    local = LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work", ["true"])
    assert local.build_key(shas[1]) is None
    envs = [local.acquire(sha, tmp_path / "logs") for sha in shas]
    local.close()
    assert [env.how for env in envs] == ["built", "built"]


def test_a_recipe_can_turn_output_reuse_off(tmp_path: Path) -> None:
    from bisect_npu.orchestration.opening.environments import make_environment
    from bisect_npu.recipe.loader import parse_recipe
    from tests.helpers.asked import spec_of

    shas = make_linear_repo(tmp_path / "repo", 2)
    text = "name: t\nmodel:\n  path: /m\ncases:\n  - id: a\n    prompt: hi\nbuild:\n  local_command: [make]\n"
    options = spec_of(good=shas[0], bad=shas[1], repo=str(tmp_path / "repo"))
    for extra, reused in (("", True), ("  reuse_outputs: false\n", False)):
        builder, _ = make_environment(options, git.Repo(tmp_path / "repo"), parse_recipe(text + extra), tmp_path / "s",
                                      tmp_path / "work")
        assert isinstance(builder, LocalBuilder)
        assert (builder.build_key(shas[1]) is not None) == reused
        assert (builder.artifacts_dir == (tmp_path / "s").resolve() / "build-outputs") == reused


def test_run_timeout_bounds_a_local_build(tmp_path: Path) -> None:
    """--timeout is how long a local build command may take too: a build past it fails as one."""
    from bisect_npu.builders.base import BuildFailed
    from bisect_npu.orchestration.opening.environments import make_environment
    from bisect_npu.recipe.loader import parse_recipe
    from tests.helpers.asked import spec_of

    shas = make_linear_repo(tmp_path / "repo", 2)
    text = ("name: t\nmodel:\n  path: /m\ncases:\n  - id: a\n    prompt: hi\nbuild:\n"
            "  local_command: [sh, -c, 'sleep 30']\n")
    options = spec_of(good=shas[0], bad=shas[1], repo=str(tmp_path / "repo"), timeout_s=0.5)
    builder, _ = make_environment(options, git.Repo(tmp_path / "repo"), parse_recipe(text), tmp_path / "s",
                                  tmp_path / "work")
    with pytest.raises(BuildFailed, match="build timed out after"):
        builder.acquire(shas[1], tmp_path / "logs")
    builder.close()


def registered_worktrees(repo: Path) -> list[str]:
    listing = git.Repo(repo).git.worktree("list", "--porcelain")
    return [line.split(" ", 1)[1] for line in listing.splitlines() if line.startswith("worktree ")][1:]


def test_no_worktree_outlives_a_failed_build_or_a_killed_process(tmp_path: Path) -> None:
    import pytest

    from bisect_npu.builders.base import BuildFailed

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 3)
    failing = LocalBuilder(git.Repo(repo), tmp_path / "work", ["sh", "-c", "exit 3"])
    with pytest.raises(BuildFailed):
        failing.acquire(shas[1], tmp_path / "logs")
    assert registered_worktrees(repo) == [] and not (tmp_path / "work" / shas[1][:12]).exists()
    # A process killed while holding a worktree leaves it registered; the next builder of the same
    # session (resume) sweeps it when it closes, with its own.
    git.Repo(repo).git.worktree("add", "--detach", str(tmp_path / "work" / shas[2][:12]), shas[2])
    resumed = LocalBuilder(git.Repo(repo), tmp_path / "work", ["true"])
    resumed.release(resumed.acquire(shas[0], tmp_path / "logs"))
    assert len(registered_worktrees(repo)) == 2
    resumed.close()
    assert registered_worktrees(repo) == [] and not (tmp_path / "work").exists()


def test_sweep_removes_locked_and_half_made_worktrees_under_a_directory_only(tmp_path: Path) -> None:
    from bisect_npu.builders.local import sweep_worktrees

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 3)
    g = git.Repo(repo)
    ours, theirs = tmp_path / "session" / "fix-worktrees", tmp_path / "elsewhere"
    g.git.worktree("add", "--detach", str(ours / "a"), shas[1])
    g.git.worktree("add", "--detach", "--lock", str(ours / "b"), shas[2])  # as a killed `worktree add` leaves it
    g.git.worktree("add", "--detach", str(theirs / "c"), shas[2])
    sweep_worktrees(g, ours)
    assert registered_worktrees(repo) == [str((theirs / "c").resolve())]
    assert not (ours / "a").exists() and not (ours / "b").exists()


@pytest.mark.parametrize("place", ["/proc", "/sys/kernel"])
def test_a_workdir_nothing_can_be_made_in_is_refused_before_the_session(place: str) -> None:
    """Write permission says nothing of /proc or /sys (root has it): a directory is made there and
    removed, and the failure is the one-line usage error."""
    with pytest.raises(UsageError, match=rf"worktree location {place} is not writable \(.+\); pass --workdir"):
        check_workdir(Path(place))
