"""upstream.history and upstream.dockerfile against real git repositories built in tmp_path."""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import git as gitpython
import pytest

from bisect_npu.errors import UsageError
from bisect_npu.upstream import dockerfile, history
from tests.helpers.gitrepo import GOOD_CMD, add_commit, git, make_linear_repo

TAGS = {1: "v0.9.0rc1", 3: "v0.9.0rc2", 5: "v0.9.1rc1", 7: "v0.9.1"}


@pytest.fixture()
def tagged(tmp_path: Path) -> tuple[gitpython.Repo, list[str]]:
    shas = make_linear_repo(tmp_path / "tagged", 10, tags=TAGS)
    return gitpython.Repo(tmp_path / "tagged"), shas


@pytest.fixture()
def forked(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """vllm-ascend's shape: v0.9.1-dev forks main at v0.9.0rc1; v0.9.0rc2 is only on main."""
    path = tmp_path / "forked"
    main = make_linear_repo(path, 6, tags={2: "v0.9.0rc1", 4: "v0.9.0rc2"})
    git(path, "checkout", "-q", "-b", "v0.9.1-dev", main[2])
    dev = [add_commit(path, f"[0.9.1] dev change {i} (#{200 + i})", {"dev.py": f"{i}\n"}) for i in range(4)]
    git(path, "tag", "v0.9.1rc1", dev[1])
    git(path, "tag", "-a", "v0.9.1", "-m", "release v0.9.1", dev[3])
    git(path, "checkout", "-q", "main")
    return path, {"main": main, "dev": dev}  # type: ignore[dict-item]


def test_resolves_every_kind_of_ref(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, shas = tagged
    git(Path(repo.working_dir), "branch", "feature", shas[4])
    assert history.resolve_ref(repo, "v0.9.0rc2") == shas[3]
    assert history.resolve_ref(repo, "feature") == shas[4]
    assert history.resolve_ref(repo, "main") == shas[-1]
    assert history.resolve_ref(repo, shas[6]) == shas[6]
    assert history.resolve_ref(repo, shas[6][:8]) == shas[6]
    assert history.resolve_ref(repo, shas[6][:8].upper()) == shas[6]
    assert history.resolve_ref(repo, "HEAD~3") == shas[-4]
    assert history.resolve_ref(repo, "v0.9.1^") == shas[6]


def test_annotated_tag_resolves_to_its_commit(forked: tuple[Path, dict[str, list[str]]]) -> None:
    path, shas = forked
    assert history.resolve_ref(gitpython.Repo(path), "v0.9.1") == shas["dev"][3]


def test_remote_branch_in_a_clone(forked: tuple[Path, dict[str, list[str]]], tmp_path: Path) -> None:
    path, shas = forked
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(path), str(clone))
    repo = history.open_repo(str(clone))
    assert history.resolve_ref(repo, "origin/v0.9.1-dev") == shas["dev"][3]
    # Like `git checkout v0.9.1-dev`: a branch that exists only on the remote still resolves.
    assert history.resolve_ref(repo, "v0.9.1-dev") == shas["dev"][3]


def test_same_branch_on_two_remotes_pointing_apart_is_ambiguous(
    forked: tuple[Path, dict[str, list[str]]], tmp_path: Path
) -> None:
    path, _ = forked
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(path), str(clone))
    git(clone, "remote", "add", "fork", str(path))
    git(clone, "fetch", "-q", "fork")
    git(clone, "update-ref", "refs/remotes/fork/v0.9.1-dev", "refs/remotes/fork/v0.9.1-dev~1")
    with pytest.raises(UsageError, match=r"ambiguous.*several remotes"):
        history.resolve_ref(gitpython.Repo(clone), "v0.9.1-dev")


def test_unknown_ref_lists_the_nearest_tags(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, _ = tagged
    with pytest.raises(UsageError) as err:
        history.resolve_ref(repo, "v0.9.0")
    assert str(err.value) == "unknown ref v0.9.0; nearest tags: v0.9.0rc1, v0.9.0rc2"


def test_nearest_tags_by_version_then_spelling(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, _ = tagged
    assert history.nearest_tags(repo, "v0.9.1rc") == ["v0.9.1rc1"]
    assert history.nearest_tags(repo, "v0.9.2", limit=2) == ["v0.9.1", "v0.9.1rc1"]
    assert history.nearest_tags(repo, "v0.8.5", limit=1) == ["v0.9.0rc1"]
    assert history.nearest_tags(repo, "v0.9.0", limit=1) == ["v0.9.0rc1"]
    git(Path(repo.working_dir), "tag", "release-candidate")
    assert history.nearest_tags(repo, "relase-candidate") == ["release-candidate"]
    with pytest.raises(UsageError, match=r"^unknown ref zzz-no-such; pass a tag, branch or commit sha$"):
        history.resolve_ref(repo, "zzz-no-such")


def test_option_like_ref_is_refused(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, _ = tagged
    with pytest.raises(UsageError, match="invalid ref"):
        history.resolve_ref(repo, "--all")


def test_ambiguous_short_sha_is_an_error(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path / "many", 600)  # deterministic shas: some share 4 hex digits
    by_prefix: dict[str, list[str]] = defaultdict(list)
    for sha in shas:
        by_prefix[sha[:4]].append(sha)
    prefix = next(p for p, group in sorted(by_prefix.items()) if len(group) > 1)
    repo = gitpython.Repo(tmp_path / "many")
    with pytest.raises(UsageError, match=f"short sha {prefix} is ambiguous: .*give more digits"):
        history.resolve_ref(repo, prefix)
    unique = next(p for p, group in sorted(by_prefix.items()) if len(group) == 1)
    assert history.resolve_ref(repo, by_prefix[unique][0][:7]) == by_prefix[unique][0]


def test_not_a_repository(tmp_path: Path) -> None:
    for path in (tmp_path, tmp_path / "missing"):
        with pytest.raises(UsageError) as err:
            history.open_repo(str(path))
        assert str(err.value) == (f"{path} is not a git repository; pass --repo with a clone of the upstream "
                                  "(or run from inside one)")


def test_a_repository_git_cannot_read_says_so_instead_of_unknown_refs(tmp_path: Path) -> None:
    # A bare copy without its config file (as some mirrors keep them): GitPython opens it and
    # finds the tags, git refuses it, and every ref looked "unknown" with itself as nearest tag.
    make_linear_repo(tmp_path / "work", 3, tags={0: "v0.9.0rc1"})
    bare = tmp_path / "mirror"
    shutil.copytree(tmp_path / "work" / ".git", bare)
    (bare / "config").unlink()
    with pytest.raises(UsageError, match=r"git cannot read the repository at .*mirror \(.*not a git repository.*\); "
                                         r"check `git -C PATH status` there, or clone it again"):
        history.open_repo(str(bare))


def test_url_is_cloned_into_the_cache_and_fetched_again(
    forked: tuple[Path, dict[str, list[str]]], tmp_path: Path
) -> None:
    path, shas = forked
    cache = tmp_path / "cache"
    repo = history.open_repo(path.as_uri(), cache_dir=cache)
    assert repo.bare and Path(repo.git_dir).parent == cache
    assert history.resolve_ref(repo, "v0.9.1-dev") == shas["dev"][3]
    assert history.resolve_ref(repo, "v0.9.0rc2") == shas["main"][4]
    newer = add_commit(path, "[CI] later on main (#300)")
    again = history.open_repo(path.as_uri(), cache_dir=cache)
    assert again.git_dir == repo.git_dir
    assert history.resolve_ref(again, "origin/main") == newer
    with pytest.raises(UsageError, match=r"^cannot fetch file://.*/nowhere: .*check the URL"):
        history.open_repo((tmp_path / "nowhere").as_uri(), cache_dir=cache)
    assert [p.name for p in cache.iterdir()] == [Path(repo.git_dir).name]  # no half-made clone left


def test_cached_clone_is_used_when_the_upstream_is_unreachable(
    forked: tuple[Path, dict[str, list[str]]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, shas = forked
    cache = tmp_path / "cache"
    url = path.as_uri()
    history.open_repo(url, cache_dir=cache)
    path.rename(tmp_path / "moved")
    offline = history.open_repo(url, cache_dir=cache)
    assert history.resolve_ref(offline, "v0.9.1") == shas["dev"][3]
    assert "could not fetch" in caplog.text and "using the cached clone" in caplog.text


def test_good_equal_to_bad(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, shas = tagged
    with pytest.raises(UsageError, match=rf"^good and bad are the same commit \({shas[7][:10]}\)"):
        history.resolve_range(repo, "v0.9.1", shas[7][:9])


def test_good_newer_than_bad(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, _ = tagged
    with pytest.raises(UsageError, match=r"good v0\.9\.1 is newer than bad v0\.9\.0rc1.*swap --good and --bad"):
        history.resolve_range(repo, "v0.9.1", "v0.9.0rc1")


def test_linear_range_is_good_exclusive_bad_inclusive(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, shas = tagged
    found = history.resolve_range(repo, "v0.9.0rc1", "v0.9.1")
    assert found == history.BisectRange(
        good=shas[1], bad=shas[7], base=shas[1], merge_base_note=None, candidates=tuple(shas[2:8])
    )


def test_good_not_an_ancestor_bisects_from_the_merge_base(
    forked: tuple[Path, dict[str, list[str]]],
) -> None:
    path, shas = forked
    repo = gitpython.Repo(path)
    found = history.resolve_range(repo, "v0.9.0rc2", "v0.9.1")
    rc1 = shas["main"][2]
    assert found.good == shas["main"][4]
    assert found.base == rc1
    assert found.candidates == tuple(shas["dev"])
    short = git(path, "rev-parse", "--short", rc1)
    assert found.merge_base_note == (
        f"v0.9.0rc2 is not an ancestor of v0.9.1; bisecting from their merge-base v0.9.0rc1 ({short})"
    )


def test_untagged_merge_base_is_named_by_short_sha(forked: tuple[Path, dict[str, list[str]]]) -> None:
    path, shas = forked
    git(path, "tag", "-d", "v0.9.0rc1")
    found = history.resolve_range(gitpython.Repo(path), "main", "v0.9.1-dev")
    short = git(path, "rev-parse", "--short", shas["main"][2])
    assert found.merge_base_note and found.merge_base_note.endswith(f"merge-base {short}")


def test_unrelated_histories_have_no_merge_base(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, _ = tagged
    path = Path(repo.working_dir)
    git(path, "checkout", "-q", "--orphan", "elsewhere")
    add_commit(path, "unrelated root", {"other": "x\n"})
    with pytest.raises(UsageError, match="share no history"):
        history.resolve_range(repo, "elsewhere", "main")


@pytest.fixture()
def merged(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """main: m0 m1 m2 m3 M m4, where M merges feature (f1 f2, forked at m1) with --no-ff."""
    path = tmp_path / "merged"
    main = make_linear_repo(path, 3)
    sha = {"m0": main[0], "m1": main[1], "m2": main[2]}
    git(path, "checkout", "-q", "-b", "feature", sha["m1"])
    sha["f1"] = add_commit(path, "feature one", {"csrc/kernel.cpp": "one\n"})
    sha["f2"] = add_commit(path, "feature two", {"vllm_ascend/a.py": "two\n"})
    git(path, "checkout", "-q", "main")
    sha["m3"] = add_commit(path, "main three (#3)", {"main.py": "3\n"})
    git(path, "merge", "-q", "--no-ff", "-m", "Merge feature (#4)", "feature")
    sha["M"] = git(path, "rev-parse", "HEAD")
    sha["m4"] = add_commit(path, "main four (#5)", {"main.py": "4\n"})
    return path, sha


def test_candidates_follow_the_first_parent_only(merged: tuple[Path, dict[str, str]]) -> None:
    path, sha = merged
    repo = gitpython.Repo(path)
    found = history.resolve_range(repo, sha["m0"], sha["m4"])
    assert found.candidates == tuple(sha[k] for k in ("m1", "m2", "m3", "M", "m4"))
    merge = history.commit_facts(repo, sha["M"])
    assert set(merge.paths) == {"csrc/kernel.cpp", "vllm_ascend/a.py"}  # what the merge brought in
    assert merge.pr == 4


def test_good_on_a_merged_side_branch_starts_after_its_mainline_ancestor(
    merged: tuple[Path, dict[str, str]],
) -> None:
    path, sha = merged
    found = history.resolve_range(gitpython.Repo(path), sha["f2"], sha["m4"])
    assert found.base == sha["f2"]
    assert found.candidates == tuple(sha[k] for k in ("m2", "m3", "M", "m4"))
    short_m1 = git(path, "rev-parse", "--short", sha["m1"])
    assert found.merge_base_note and f"candidates start after {short_m1}" in found.merge_base_note


DOCKERFILE_V1 = """\
# escape=\\
# comment before the first FROM
ARG CANN_QUAY_URL="quay.io/ascend/cann"
ARG CANN_VERSION='8.1.rc1'
FROM --platform=linux/arm64 ${CANN_QUAY_URL}:${CANN_VERSION}-910b-ubuntu22.04-py3.10 AS base

ARG PIP_INDEX_URL="https://pypi.org/simple"
ARG COMPILE_CUSTOM_KERNELS=1
ARG MEMCACHE_VERSION
# Install vLLM
ARG VLLM_REPO=https://github.com/vllm-project/vllm.git \\
    VLLM_TAG=v0.9.1
RUN git clone --depth 1 $VLLM_REPO --branch $VLLM_TAG /vllm-workspace/vllm && \\
    # a comment inside a continuation
    echo done

FROM base AS final
ARG VLLM_TAG=v9.9.9
"""


def test_parse_dockerfile_reads_args_and_the_first_from() -> None:
    facts = dockerfile.parse_dockerfile(DOCKERFILE_V1)
    assert facts.base_image == "quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10"
    assert facts.vllm_tag == "v0.9.1"
    assert facts.args == {
        "CANN_QUAY_URL": "quay.io/ascend/cann",
        "CANN_VERSION": "8.1.rc1",
        "PIP_INDEX_URL": "https://pypi.org/simple",
        "COMPILE_CUSTOM_KERNELS": "1",
        "VLLM_REPO": "https://github.com/vllm-project/vllm.git",
        "VLLM_TAG": "v0.9.1",
    }


def test_parse_dockerfile_defaults_and_missing_parts() -> None:
    facts = dockerfile.parse_dockerfile("ARG PY\nFROM img:${PY:-3.11}-${TAG:+x}end\n")
    assert facts == dockerfile.DockerfileFacts(base_image="img:3.11-end", vllm_tag=None, args={})
    backtick = dockerfile.parse_dockerfile("# escape=`\nFROM a:1\nARG VLLM_TAG=v1 `\n  OTHER=2\n")
    assert backtick.args == {"VLLM_TAG": "v1", "OTHER": "2"}
    assert dockerfile.parse_dockerfile("RUN true\n").base_image is None


def test_commit_facts_without_checkout(tmp_path: Path) -> None:
    dockerfile_v2 = DOCKERFILE_V1.replace("8.1.rc1", "8.2.rc1").replace("py3.10", "py3.11")
    changes = {
        0: {"Dockerfile": DOCKERFILE_V1},
        2: {"csrc/ops.cpp": "int x;\n"},
        3: {"Dockerfile": dockerfile_v2.replace("VLLM_TAG=v0.9.1\n", 'VLLM_TAG="v0.9.2"\n')},
        4: {"Dockerfile": None},
    }
    titles = {2: "[BugFix] fix the kernel (#123)", 3: "[CI] bump CANN (#124) and more", 4: "drop Dockerfile"}
    shas = make_linear_repo(
        tmp_path / "facts", 5, titles=lambda i: titles.get(i, f"Change {i} (#{i})"), files=lambda i: changes.get(i, {})
    )
    repo = gitpython.Repo(tmp_path / "facts")
    facts = history.commits_facts(repo, [shas[2], shas[0], shas[3], shas[4], shas[2]])
    assert [f.sha for f in facts] == [shas[2], shas[0], shas[3], shas[4], shas[2]]
    fix, root, bump, dropped, _ = facts
    assert (fix.title, fix.pr, fix.author) == ("[BugFix] fix the kernel (#123)", 123, "Test Author")
    assert fix.paths == ("counter", "csrc/ops.cpp")
    assert fix.author_date == "2025-06-15T15:08:40+00:00"
    assert fix.short == shas[2][: len(fix.short)] and len(fix.short) >= 7
    assert fix.dockerfile == root.dockerfile
    assert root.paths == ("Dockerfile", "counter", "state")
    assert root.dockerfile is not None and root.dockerfile.vllm_tag == "v0.9.1"
    assert bump.pr is None  # "(#N)" counts only at the end of the title
    assert "Dockerfile" in bump.paths
    assert bump.dockerfile is not None
    assert bump.dockerfile.base_image == "quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11"
    assert bump.dockerfile.vllm_tag == "v0.9.2"
    assert dropped.dockerfile is None and "Dockerfile" in dropped.paths
    assert history.commit_facts(repo, shas[3]) == bump
    assert dockerfile.dockerfile_facts(repo, shas[1]) == root.dockerfile
    assert dockerfile.dockerfile_facts(repo, shas[1], path="Dockerfile.a3") is None



def test_one_log_parser_reads_renames_odd_paths_and_subjects(tmp_path: Path) -> None:
    """The commit facts (renames as a deletion plus an addition) and the fix ranking's commits
    (renames followed) come from the same `git log -z` parser; paths with a tab or a newline
    come through verbatim."""
    odd = "dir/tab\there\nnewline.py"
    shas = make_linear_repo(tmp_path / "log", 2, files=lambda i: {"old.py": "x = 1\n" * 20} if i == 0 else {})
    path = tmp_path / "log"
    git(path, "mv", "old.py", "new.py")
    renamed = add_commit(path, "move old to new\nacross two lines (#7)\n\nbody", {odd: "y\n"})
    repo = gitpython.Repo(path)
    facts = history.commit_facts(repo, renamed)
    assert facts.title == "move old to new across two lines (#7)" and facts.pr == 7  # git's %s
    assert set(facts.paths) == {"old.py", "new.py", odd}
    (logged,) = history.parse_log(repo.git.log("-1", "-z", "-M", "--name-status",
                                               f"--format={history.LOG_FORMAT}", renamed))
    assert logged.title == "move old to new" and logged.parents == (shas[1],)
    assert set(logged.changes) == {("R", "old.py", "new.py"), ("A", None, odd)}
    assert logged.message.endswith("\n\nbody")

@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("git@github.com:vllm-project/vllm-ascend.git", "https://github.com/vllm-project/vllm-ascend"),
        ("https://github.com/vllm-project/vllm-ascend.git", "https://github.com/vllm-project/vllm-ascend"),
        ("https://github.com/vllm-project/vllm-ascend", "https://github.com/vllm-project/vllm-ascend"),
        ("https://token@github.com/o/r.git/", "https://github.com/o/r"),
        ("ssh://git@github.com/o/r.js.git", "https://github.com/o/r.js"),
        ("https://gitee.com/ascend/vllm-ascend.git", None),
        ("/srv/mirror/vllm-ascend", None),
    ],
)
def test_github_url_from_origin(tmp_path: Path, url: str, expected: str | None) -> None:
    make_linear_repo(tmp_path / "r", 1)
    git(tmp_path / "r", "remote", "add", "origin", url)
    assert history.github_url(gitpython.Repo(tmp_path / "r")) == expected


def test_github_url_without_origin(tagged: tuple[gitpython.Repo, list[str]]) -> None:
    repo, _ = tagged
    assert history.github_url(repo) is None


def test_describe_names_commits_by_the_tag_that_contains_them(
    tagged: tuple[gitpython.Repo, list[str]],
) -> None:
    repo, shas = tagged
    assert history.describe(repo, shas[4]) == "v0.9.1rc1~1"
    assert history.describe(repo, shas[7]) == "v0.9.1"
    assert history.describe(repo, shas[9]) == git(Path(repo.working_dir), "rev-parse", "--short", shas[9])


def test_linear_repo_helper_agrees_with_git_bisect(tmp_path: Path) -> None:
    path = tmp_path / "bisect"
    shas = make_linear_repo(path, 40, culprit=23)
    assert len(set(shas)) == 40 and make_linear_repo(tmp_path / "again", 40, culprit=23) == shas
    git(path, "bisect", "start", shas[-1], shas[0])
    out = git(path, "bisect", "run", *GOOD_CMD)
    assert f"{shas[23]} is the first bad commit" in out


@pytest.mark.parametrize(("text", "remote"), [
    ("https://github.com/vllm-project/vllm-ascend.git", True), ("ssh://git@host/r.git", True),
    ("git@github.com:vllm-project/vllm-ascend.git", True), ("me@gitea.example:org/r.git", True),
    ("file:///srv/mirror.git", True), ("../vllm-ascend", False), ("/data/vllm-ascend", False),
    ("vllm-ascend", False), ("dir:with:colons", False),
])
def test_is_url_tells_a_remote_from_a_path(text: str, remote: bool) -> None:
    # One test for the one check that both cloning (history) and the session's stored repo use:
    # a remote stays a URL in the journal so resume fetches it again.
    assert history.is_url(text) is remote


def test_a_missing_version_between_two_tags_names_the_one_below_first(tmp_path: Path) -> None:
    make_linear_repo(tmp_path / "r", 3, tags={0: "v0.9.0", 1: "v0.9.1", 2: "v0.10.0rc1"})
    repo = gitpython.Repo(tmp_path / "r")
    assert history.nearest_tags(repo, "v0.9.2") == ["v0.9.1", "v0.10.0rc1", "v0.9.0"]


def test_vllm_pin_reads_the_pin_file_else_the_dockerfile(tmp_path: Path) -> None:
    """vllm-ascend's history in small: a Dockerfile tag, a commit pin (the tag commented out), the
    pin file added (it wins over the Dockerfile), moved, and a commit without either."""
    tagged = "FROM base\nARG VLLM_TAG=v0.20.1\nRUN git clone -b $VLLM_TAG vllm\n"
    by_commit = "FROM base\n# ARG VLLM_TAG=v0.19.1\nARG VLLM_COMMIT=D886C26D4D4FEF7D079696BEB4ECE1CFB4B008A8\n"
    both = 'FROM base\nARG VLLM_TAG=v0.22.1\nARG VLLM_COMMIT=""\n'
    changes: dict[int, dict[str, str | None]] = {
        0: {"Dockerfile": tagged},
        1: {"Dockerfile": by_commit},
        2: {"Dockerfile": both},
        3: {dockerfile.PIN_FILE: "v0.23.0\n"},
        4: {dockerfile.PIN_FILE: "# the release CI builds against\nv0.24.0\n", "Dockerfile": tagged},
        5: {dockerfile.PIN_FILE: None, "Dockerfile": None},
        6: {dockerfile.PIN_FILE: "\n", "Dockerfile": "FROM base\nARG VLLM_TAG=\n"},
    }
    shas = make_linear_repo(tmp_path / "pins", 7, files=lambda i: changes.get(i, {}))
    repo = gitpython.Repo(tmp_path / "pins")
    pins = [dockerfile.vllm_pin(repo, sha) for sha in shas]
    assert pins[0] == dockerfile.VllmPin(tag="v0.20.1", commit=None, source="Dockerfile")
    assert pins[1] == dockerfile.VllmPin(tag=None, commit="d886c26d4d4fef7d079696beb4ece1cfb4b008a8",
                                         source="Dockerfile")
    assert pins[2] == dockerfile.VllmPin(tag="v0.22.1", commit=None, source="Dockerfile")
    assert pins[3] == dockerfile.VllmPin(tag="v0.23.0", commit=None, source=dockerfile.PIN_FILE)
    assert pins[4] is not None and (pins[4].tag, pins[4].release) == ("v0.24.0", "0.24.0")
    assert pins[5] is None and pins[6] is None
    assert str(pins[1]) == "vLLM d886c26d4d4f from Dockerfile"
    assert str(pins[3]) == f"vLLM v0.23.0 from {dockerfile.PIN_FILE}"
    assert dockerfile.vllm_pin(repo, shas[0], dockerfile="Dockerfile.a3") is None
