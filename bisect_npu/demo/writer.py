"""Write a generated git history with `git fast-import`: the demo upstream and its dependency both.

Fixed authors, dates and PR numbers drawn from one seeded rng, so a seed always yields the same shas.
"""

from __future__ import annotations

import os
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bisect_npu.demo import patches as P
from bisect_npu.errors import InfrastructureError

_COMMITTER = "GitHub <noreply@github.com>"


@dataclass
class Commit:
    mark: int
    branch: str
    parent: int | None
    title: str
    paths: list[str]
    role: str | None


@dataclass
class History:
    """The commits of one repository in commit-date order, as a fast-import stream."""

    rng: random.Random
    files: dict[str, dict[str, str]]
    tips: dict[str, int | None]
    clock: int
    authors: tuple[str, ...]
    stream: bytearray = field(default_factory=bytearray)
    commits: list[Commit] = field(default_factory=list)
    tags: dict[str, int] = field(default_factory=dict)
    pr: int = 0
    fork_from: dict[str, int] = field(default_factory=dict)

    def commit(self, branch: str, change: P.Change, role: str | None = None, tag: str = "") -> Commit:
        files = self.files[branch]
        before = dict(files)
        P.apply_patches(files, change.patches)
        changed = sorted(p for p in files if files[p] != before.get(p))
        if not changed:
            raise ValueError(f"demo change {change.title!r} changes nothing on {branch}")
        self.pr += self.rng.randint(1, 4)
        self.clock += self.rng.randint(2, 14) * 3600 + self.rng.randint(0, 3599)
        title = f"{tag}{change.title} (#{self.pr})"
        author = self.rng.choice(self.authors)
        message = title + "\n\n" + (change.body + "\n\n" if change.body else "") + f"Signed-off-by: {author}\n"
        mark = len(self.commits) + 1
        out = self.stream
        out += f"commit refs/heads/{branch}\nmark :{mark}\n".encode()
        out += f"author {author} {self.clock} +0000\ncommitter {_COMMITTER} {self.clock} +0000\n".encode()
        out += _data(message)
        parent = self.tips[branch]
        if branch in self.fork_from:
            out += f"from :{self.fork_from.pop(branch)}\n".encode()
        for path in changed:
            out += f"M 100644 inline {path}\n".encode() + _data(files[path])
        out += b"\n"
        record = Commit(mark, branch, parent, title, changed, role)
        self.commits.append(record)
        self.tips[branch] = mark
        return record

    def tag(self, branch: str, name: str) -> None:
        mark = self.tips[branch]
        assert mark is not None
        self.tags[name] = mark
        self.stream += f"reset refs/tags/{name}\nfrom :{mark}\n\n".encode()

    def fork(self, branch: str, source: str) -> None:
        """Start `branch` at the tip of `source`; its first commit names that tip as its parent."""
        tip = self.tips[source]
        assert tip is not None
        self.files[branch] = dict(self.files[source])
        self.tips[branch] = tip
        self.fork_from[branch] = tip

    def pr_of(self, commit: Commit) -> int:
        """The PR number in a commit's title."""
        return int(commit.title.rsplit("(#", 1)[1].rstrip(")"))

    def write(self, dest: Path, head: str) -> dict[int, str]:
        """Write the repository at `dest` (must not exist or be empty), check out `head`; mark -> sha."""
        dest = Path(dest)
        if dest.exists() and any(dest.iterdir()):
            raise FileExistsError(f"{dest} is not empty; remove it or pick another directory")
        dest.mkdir(parents=True, exist_ok=True)
        git(dest, "init", "-q", "-b", head)
        marks = dest / ".git" / "demo-marks"
        git(dest, "fast-import", "--quiet", "--done", f"--export-marks={marks}", stdin=bytes(self.stream) + b"done\n")
        sha_of = {}
        for line in marks.read_text().splitlines():
            mark, sha = line.split()
            sha_of[int(mark[1:])] = sha
        marks.unlink()
        git(dest, "checkout", "-q", "-f", head)
        return sha_of


def _data(payload: str) -> bytes:
    raw = payload.encode("utf-8")
    return b"data %d\n" % len(raw) + raw + b"\n"


def templates(root: Path) -> dict[str, str]:
    """The files under a template directory, by repository path (no caches, no built objects)."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and "__pycache__" not in rel and not rel.endswith((".so", ".pyc")):
            files[rel] = path.read_text(encoding="utf-8")
    return files


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}
    result = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, env=env, check=False)
    if result.returncode != 0:
        raise InfrastructureError(f"git {' '.join(args[:2])} failed in {repo}: "
                                  f"{result.stderr.decode(errors='replace').strip()[-300:]}; is git installed?")
    return result.stdout.decode()
