"""Make real git repositories for tests and benches, fast and deterministic.

`make_linear_repo` writes the whole history with one `git fast-import` run (5,000 commits in
about a second), with fixed author and committer dates, so the same arguments always give the
same shas. Tests import it as `from tests.helpers.gitrepo import make_linear_repo, add_commit, git, GOOD_CMD`
(bench scripts put the checkout on sys.path first, see bench/history_facts.py).

    make_linear_repo(path, n, culprit=None, titles=None, files=None, tags=None, branch="main")
        -> list[str]: shas oldest first, index 0 = root; `state` reads "bad" from `culprit` on.
    add_commit(path, title, files=None, when=None) -> str: one more commit (branches, merges).
    git(path, *args, stdin=None) -> str: run git with an argument list.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

AUTHOR = "Test Author <author@example.com>"
BASE_TIME = 1_750_000_000  # fixed epoch seconds: the shas never change between runs
STATE_FILE = "state"
GOOD_CMD = ["grep", "-qx", "good", STATE_FILE]  # exit 0 before the culprit, 1 from the culprit on


def git(path: Path, *args: str, stdin: str | None = None) -> str:
    """Run git in `path` with an argument list; return stdout without the trailing newline."""
    done = subprocess.run(
        ["git", "-C", str(path), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        env=_git_env(),
    )
    return done.stdout.rstrip("\n")


def _git_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GIT_AUTHOR_NAME="Test Author",
        GIT_AUTHOR_EMAIL="author@example.com",
        GIT_COMMITTER_NAME="Test Author",
        GIT_COMMITTER_EMAIL="author@example.com",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
    )
    return env


def make_linear_repo(
    path: Path,
    n: int,
    culprit: int | None = None,
    titles: Callable[[int], str] | None = None,
    files: Callable[[int], Mapping[str, str | None]] | None = None,
    tags: Mapping[int, str] | None = None,
    branch: str = "main",
) -> list[str]:
    """Create a git repository at `path` with `n` linear commits; return their shas, oldest first.

    Index 0 is the root commit. Every commit writes `counter` (its index, so no commit is empty)
    and the file `state`: "good" before commit `culprit`, "bad" from `culprit` on (always "good"
    when `culprit` is None). So `GOOD_CMD` (`grep -qx good state`) is a `git bisect run` oracle
    whose first bad commit is `shas[culprit]`.

    titles(i) -> commit title (default "Change i (#1000+i)", a squash-merge title with a PR).
    files(i) -> {path: content or None to delete} written in commit i on top of the above.
    tags: {index: tag name} lightweight tags. `branch` is checked out in the work tree.
    Author and committer dates are BASE_TIME + 60 * i, UTC.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", branch)
    stream = _fast_import_stream(n, culprit, titles, files, tags or {}, branch)
    marks = path / ".git" / "test-marks"
    subprocess.run(
        ["git", "-C", str(path), "fast-import", "--quiet", f"--export-marks={marks}"],
        input=stream,
        check=True,
        capture_output=True,
        env=_git_env(),
    )
    by_mark = dict(line.split(" ", 1) for line in marks.read_text().splitlines())
    marks.unlink()
    git(path, "reset", "-q", "--hard", branch)
    return [by_mark[f":{i + 1}"] for i in range(n)]


def _fast_import_stream(
    n: int,
    culprit: int | None,
    titles: Callable[[int], str] | None,
    files: Callable[[int], Mapping[str, str | None]] | None,
    tags: Mapping[int, str],
    branch: str,
) -> bytes:
    chunks: list[bytes] = []
    for i in range(n):
        when = f"{BASE_TIME + 60 * i} +0000"
        title = titles(i) if titles else f"Change {i} (#{1000 + i})"
        message = (title + "\n").encode()
        chunks.append(
            f"commit refs/heads/{branch}\nmark :{i + 1}\n"
            f"author {AUTHOR} {when}\ncommitter {AUTHOR} {when}\n"
            f"data {len(message)}\n".encode()
            + message
        )
        if i:
            chunks.append(f"from :{i}\n".encode())
        state = "bad" if culprit is not None and i >= culprit else "good"
        content: dict[str, str | None] = {"counter": f"{i}\n", STATE_FILE: f"{state}\n"}
        if files:
            content.update(files(i))
        for name, text in content.items():
            if text is None:
                chunks.append(f"D {name}\n".encode())
            else:
                data = text.encode()
                chunks.append(f"M 100644 inline {name}\ndata {len(data)}\n".encode() + data + b"\n")
        chunks.append(b"\n")
    for index, tag in tags.items():
        chunks.append(f"reset refs/tags/{tag}\nfrom :{index + 1}\n\n".encode())
    return b"".join(chunks)


def add_commit(
    path: Path,
    title: str,
    files: Mapping[str, str | None] | None = None,
    when: int | None = None,
) -> str:
    """Commit `files` ({path: content, or None to delete}) on the checked-out branch; return the sha.

    For the odd shapes a linear history lacks (branches, merges, orphans); `when` defaults to a
    fixed date so shas stay deterministic. An empty `files` makes an empty commit.
    """
    for name, text in (files or {}).items():
        target = path / name
        if text is None:
            git(path, "rm", "-q", "--", name)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        git(path, "add", "--", name)
    stamp = f"{when if when is not None else BASE_TIME} +0000"
    subprocess.run(
        ["git", "-C", str(path), "commit", "-q", "--allow-empty", "-m", title],
        check=True,
        capture_output=True,
        env={**_git_env(), "GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp},
    )
    return git(path, "rev-parse", "HEAD")


MergeShape = list  # of items: "c" (a commit) or (fork_back, MergeShape): a side branch, then its merge


def make_merge_repo(path: Path, shape: MergeShape, culprit: int) -> list[str]:
    """A repository whose `main` is built from `shape` (one `git fast-import` run); return the shas in
    the order they were made, index 0 = the root.

    Each item of a line is a commit ("c") or a side branch `(fork_back, items)`: it forks from the
    line's commit `fork_back` commits before the tip (0: the tip; clamped to the line's start),
    holds `items` (side branches of its own included), and is then merged into the line. The commit
    made `culprit`-th (1-based; a merge too) adds the file `bug`, so every commit that contains it
    has it: `BUG_CMD` (`test ! -e bug`) is a `git bisect run` oracle whose first bad commit is
    `shas[culprit]`. Every commit adds its own file `c<N>`, so merges never conflict.
    """
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    files: list[frozenset[str]] = []
    chunks: list[bytes] = []

    def commit(parents: list[int]) -> int:
        mark = len(files) + 1
        own = {f"c{mark}"} | ({"bug"} if mark - 1 == culprit else set())
        have = frozenset().union(*(files[p - 1] for p in parents), own)
        files.append(have)
        when = f"{BASE_TIME + 60 * mark} +0000"
        message = f"{'Merge side' if len(parents) > 1 else 'Change'} {mark}\n".encode()
        chunks.append(f"commit refs/heads/main\nmark :{mark}\nauthor {AUTHOR} {when}\ncommitter {AUTHOR} {when}\n"
                      f"data {len(message)}\n".encode() + message)
        if parents:
            chunks.append(f"from :{parents[0]}\n".encode())
        chunks.extend(f"merge :{p}\n".encode() for p in parents[1:])
        new = have - (files[parents[0] - 1] if parents else frozenset())
        for name in sorted(new):
            data = f"{name}\n".encode()
            chunks.append(f"M 100644 inline {name}\ndata {len(data)}\n".encode() + data + b"\n")
        chunks.append(b"\n")
        return mark

    def build(items: MergeShape, start: int) -> int:
        line = [start]
        for item in items:
            if item == "c":
                line.append(commit([line[-1]]))
            else:
                fork_back, side = item
                side_tip = build(side, line[max(0, len(line) - 1 - fork_back)])
                line.append(commit([line[-1], side_tip]))
        return line[-1]

    tip = build(shape, commit([]))
    chunks.append(f"reset refs/heads/main\nfrom :{tip}\n\n".encode())
    marks = path / ".git" / "test-marks"
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet", f"--export-marks={marks}"],
                   input=b"".join(chunks), check=True, capture_output=True, env=_git_env())
    by_mark = dict(line.split(" ", 1) for line in marks.read_text().splitlines())
    marks.unlink()
    git(path, "reset", "-q", "--hard", "main")
    return [by_mark[f":{i + 1}"] for i in range(len(files))]


BUG_CMD = ["test", "!", "-e", "bug"]  # make_merge_repo's oracle: exit 0 without the culprit's file


def make_one_commit_repo(path: Path) -> Path:
    """A repository of one commit tagged v1: where a settings search runs at one commit."""
    git(path.parent, "init", "-q", str(path))
    (path / "README").write_text("x\n")
    git(path, "add", "README")
    git(path, "commit", "-q", "-m", "one")
    git(path, "tag", "v1")
    return path
