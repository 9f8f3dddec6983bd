"""What a build sees: the commit's tree plus its submodules at their pinned commits, as the full
build's context (a tar) and as a local worktree."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import git
import pytest

from bisect_npu.builders.local import LocalBuilder
from bisect_npu.builders.submodules import commit_archive
from bisect_npu.errors import InfrastructureError
from tests.helpers.gitrepo import add_commit, make_linear_repo


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), "-c", "protocol.file.allow=always", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def context_files(repo: Path, commit: str) -> dict[str, bytes]:
    with tarfile.open(fileobj=commit_archive(git.Repo(repo), commit), mode="r:") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


@pytest.fixture()
def with_submodule(tmp_path: Path) -> tuple[Path, Path, str, str, str]:
    """An upstream whose csrc/third_party/catlass is a submodule, pinned at v1 then at v2."""
    lib = tmp_path / "catlass"
    make_linear_repo(lib, 1, files=lambda i: {"include/catlass.h": "v1\n"})
    v1 = _git(lib, "rev-parse", "HEAD")
    upstream = tmp_path / "upstream"
    make_linear_repo(upstream, 1, files=lambda i: {"csrc/kernel.cpp": "k\n", "Dockerfile": "FROM x\n"})
    _git(upstream, "submodule", "add", "--name", "catlass", str(lib), "csrc/third_party/catlass")
    _git(upstream, "commit", "-qm", "Add catlass (#3532)")
    first = _git(upstream, "rev-parse", "HEAD")
    v2 = add_commit(lib, "v2", {"include/catlass.h": "v2\n"})
    _git(upstream / "csrc" / "third_party" / "catlass", "fetch", "-q", "origin")
    _git(upstream / "csrc" / "third_party" / "catlass", "checkout", "-q", v2)
    _git(upstream, "commit", "-qam", "Bump catlass (#3600)")
    second = _git(upstream, "rev-parse", "HEAD")
    assert v1 != v2
    return upstream, lib, first, second, v1


def test_submodule_content_at_each_commit_s_pin(with_submodule) -> None:
    upstream, _, first, second, _ = with_submodule
    before, after = context_files(upstream, first), context_files(upstream, second)
    assert before["csrc/third_party/catlass/include/catlass.h"] == b"v1\n"
    assert after["csrc/third_party/catlass/include/catlass.h"] == b"v2\n"
    assert before["csrc/kernel.cpp"] == b"k\n" and ".gitmodules" in before


def test_a_clone_without_its_submodules_names_the_command_that_fetches_them(with_submodule, tmp_path) -> None:
    upstream, _, first, second, _ = with_submodule
    bare = tmp_path / "plain-clone"
    _git(tmp_path, "clone", "-q", str(upstream), str(bare))
    with pytest.raises(InfrastructureError, match=r"pins submodule csrc/third_party/catlass at .*"
                                                  r"git submodule update --init --recursive"):
        commit_archive(git.Repo(bare), second)
    _git(bare, "submodule", "update", "--init", "--recursive")
    assert context_files(bare, second)["csrc/third_party/catlass/include/catlass.h"] == b"v2\n"
    assert context_files(bare, first)["csrc/third_party/catlass/include/catlass.h"] == b"v1\n"


def test_a_clone_bisect_npu_made_of_a_url_fetches_the_pinned_submodules_itself(with_submodule, tmp_path,
                                                                                 monkeypatch) -> None:
    from bisect_npu.upstream.history import open_repo

    upstream, _, first, second, _ = with_submodule
    monkeypatch.setenv("BISECT_NPU_CACHE", str(tmp_path / "cache"))
    cached = open_repo(f"file://{upstream}")  # bare, under the cache, no modules/ of its own
    assert not (Path(cached.git_dir) / "modules").exists()
    assert context_files(Path(cached.git_dir), second)["csrc/third_party/catlass/include/catlass.h"] == b"v2\n"
    assert context_files(Path(cached.git_dir), first)["csrc/third_party/catlass/include/catlass.h"] == b"v1\n"


def test_a_submodule_name_that_climbs_out_is_not_a_directory(tmp_path) -> None:
    from bisect_npu.builders.submodules import submodule_name

    repo = tmp_path / "evil"
    make_linear_repo(repo, 1, files=lambda i: {
        ".gitmodules": '[submodule "../../../etc"]\n\tpath = csrc/x\n\turl = https://example.invalid/x.git\n'})
    head = _git(repo, "rev-parse", "HEAD")
    assert submodule_name(repo / ".git", head, "csrc/x") == "csrc/x"


def test_a_local_worktree_builds_with_each_commit_s_submodule_pin(with_submodule, tmp_path) -> None:
    upstream, _, first, second, _ = with_submodule
    # The build command reads the submodule's header, as vllm-ascend's kernel build reads catlass.
    command = ["sh", "-c", "cp csrc/third_party/catlass/include/catlass.h built.txt"]
    local = LocalBuilder(git.Repo(upstream), tmp_path / "work", command, artifacts_dir=tmp_path / "artifacts")
    try:
        envs = {sha: local.acquire(sha, tmp_path / "logs") for sha in (first, second)}
        for sha, pinned in ((first, "v1\n"), (second, "v2\n")):
            assert (Path(envs[sha].path or "") / "built.txt").read_text() == pinned
            assert envs[sha].how == "built"  # the pin is a compiled input: a new key, not an overlay
            assert "1 submodule(s) checked out" in Path(envs[sha].log_path or "").read_text()
    finally:
        local.close()


@pytest.fixture()
def plain_clone(with_submodule, tmp_path: Path) -> Path:
    """A clone of the upstream made without --recurse-submodules: no modules/ of its own."""
    plain = tmp_path / "plain-clone"
    _git(tmp_path, "clone", "-q", str(with_submodule[0]), str(plain))
    return plain


@pytest.mark.parametrize("build", [["true"], []])
def test_a_local_worktree_of_a_clone_without_submodules_stops_with_the_command(with_submodule, plain_clone,
                                                                                 tmp_path, build) -> None:
    """With a build command or without (a --cmd oracle may read the submodule as much as a build):
    an empty submodule would be judged, so the run stops with the command that fetches it."""
    second, plain = with_submodule[3], plain_clone
    local = LocalBuilder(git.Repo(plain), tmp_path / "work", build)
    with pytest.raises(InfrastructureError, match="git submodule update --init --recursive"):
        local.acquire(second, tmp_path / "logs")
    assert not (tmp_path / "work" / second[:12]).exists()  # the half-made worktree went
    local.close()


def test_submodules_initialised_in_a_linked_worktree_are_found(with_submodule, plain_clone, tmp_path) -> None:
    second, plain = with_submodule[3], plain_clone
    linked = tmp_path / "linked"
    _git(plain, "worktree", "add", "-q", str(linked), second)
    _git(linked, "submodule", "update", "--init", "--recursive")  # into .git/worktrees/linked/modules
    assert not (plain / ".git" / "modules").exists()
    assert context_files(linked, second)["csrc/third_party/catlass/include/catlass.h"] == b"v2\n"


def test_a_gitlink_that_gitmodules_does_not_map_is_left_out_as_git_does(tmp_path) -> None:
    repo = tmp_path / "orphan"
    make_linear_repo(repo, 1, files=lambda i: {"a.txt": "a\n"})
    _git(repo, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},vendor/lost")
    _git(repo, "commit", "-qm", "A gitlink without .gitmodules")
    head = _git(repo, "rev-parse", "HEAD")
    assert "a.txt" in (files := context_files(repo, head)) and not any(f.startswith("vendor") for f in files)


@pytest.mark.e2e
def test_run_from_a_clone_without_submodules_stops_before_its_session_exists(with_submodule, plain_clone,
                                                                              tmp_path) -> None:
    first, second = with_submodule[2], with_submodule[3]
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(plain_clone), "--good", first,
                           "--bad", second, "--cmd", "true", "--session", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "pins submodule csrc/third_party/catlass" in done.stderr and "git submodule update --init" in done.stderr
    assert not (tmp_path / "s").exists()


def test_the_version_arg_is_declared_before_the_candidates_install_only() -> None:
    from bisect_npu.builders.docker import declare_version_arg

    # vllm-ascend v0.11.0's order: the source is copied first, vLLM (also setuptools_scm) installed after.
    dockerfile = ("FROM base\nCOPY . /vllm-workspace/vllm-ascend/\nRUN apt-get update\n"
                  "RUN pip install -e /vllm-workspace/vllm/ && \\\n    echo done\n"
                  "RUN export X=1 && \\\n    pip install -e /vllm-workspace/vllm-ascend/\nRUN echo after\n")
    lines = declare_version_arg(dockerfile, "/vllm-workspace/vllm-ascend").splitlines()
    assert lines.index("ARG SETUPTOOLS_SCM_PRETEND_VERSION") == lines.index("RUN export X=1 && \\") - 1
    assert lines.count("ARG SETUPTOOLS_SCM_PRETEND_VERSION") == 1
    without_install = declare_version_arg("FROM base\nCOPY . /app\nCMD x\n", "/app").splitlines()
    assert without_install == ["FROM base", "COPY . /app", "ARG SETUPTOOLS_SCM_PRETEND_VERSION", "CMD x"]
    assert declare_version_arg("FROM base\nRUN x\n", "/app") == "FROM base\nRUN x\n"
