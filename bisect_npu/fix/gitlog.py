"""Read history from git in a handful of calls over a whole range, never one per commit: `git log` output
parsed into commits (history.parse_log), file diffs and -U0 hunks, and the refs and patch-ids the proposals
compare."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field

import git

from bisect_npu.errors import InfrastructureError
from bisect_npu.upstream.history import LOG_FORMAT, LoggedCommit, git_error_line, parse_log

_HUNK = re.compile(r"^@@@* -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@@*(.*)$")
# Docs and CI: a change there says nothing about a regression (nor makes a culprit more than a pin bump).
IGNORABLE_FILE = re.compile(r"^\.github/|^docs?/|\.md$|\.rst$")


@dataclass
class Hunk:
    """One -U0 hunk of a file diff: where it sits before and after, and the lines it swaps."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str
    removed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)


@dataclass
class FileDiff:
    """One file's change in a commit (renames followed), as hunks."""

    old_path: str | None  # None: file created
    new_path: str | None  # None: file deleted
    hunks: list[Hunk] = field(default_factory=list)


DIFF_FORMAT = "%x1e%H"
_COMMON = ("-c", "core.quotePath=false")


def read_git(repo: git.Repo, *args: str) -> str:
    """Run a read-only git command; a failure is the clone's (objects a partial or shallow clone
    never fetched), said in one line with what to do, not a traceback."""
    try:
        return repo.git.execute(["git", *_COMMON, *args], strip_newline_in_stdout=False)
    except git.GitCommandError as exc:
        raise InfrastructureError(
            f"git {args[0]} failed in {repo.git_dir}: {git_error_line(exc)}; if the clone is partial "
            "(--filter) or shallow, fetch what it lacks (`git fetch --unshallow`, or clone it whole) "
            "and run again") from None


def logged_commits(repo: git.Repo, *args: str) -> list[LoggedCommit]:
    """`git log ARGS` as commits with their changed paths (renames followed where ARGS say -M)."""
    return parse_log(read_git(repo, "log", "-z", "--name-status", f"--format={LOG_FORMAT}", *args))


def parse_diffs(text: str) -> dict[str, list[FileDiff]]:
    """`git log -U0 --format=%x1e%H` output -> {sha: [file diffs]}."""
    result: dict[str, list[FileDiff]] = {}
    for record in text.split("\x1e")[1:]:
        lines = record.split("\n")
        files: list[FileDiff] = []
        result[lines[0].strip()] = files
        current: FileDiff | None = None
        hunk: Hunk | None = None
        for line in lines[1:]:
            if hunk is not None:  # most lines are a hunk's: one test each, not the header tests below
                first = line[:1]
                if first == "+":
                    hunk.added.append(line[1:])
                    continue
                if first == "-":
                    hunk.removed.append(line[1:])
                    continue
            if line.startswith("diff --git ") or line.startswith("diff --cc "):
                current, hunk = FileDiff(None, None), None
                files.append(current)
                current.old_path, current.new_path = _paths_from_diff_line(line)
            elif current is None:
                continue
            elif hunk is None and line.startswith("rename from "):
                current.old_path = line[len("rename from "):]
            elif hunk is None and line.startswith("rename to "):
                current.new_path = line[len("rename to "):]
            elif hunk is None and line.startswith("new file mode"):
                current.old_path = None
            elif hunk is None and line.startswith("deleted file mode"):
                current.new_path = None
            elif hunk is None and line.startswith("--- "):
                current.old_path = None if line == "--- /dev/null" else _strip_prefix(line[4:])
            elif hunk is None and line.startswith("+++ "):
                current.new_path = None if line == "+++ /dev/null" else _strip_prefix(line[4:])
            elif line.startswith("@@"):
                match = _HUNK.match(line)
                if match:
                    old_len = 1 if match[2] is None else int(match[2])
                    new_len = 1 if match[4] is None else int(match[4])
                    hunk = Hunk(int(match[1]), old_len, int(match[3]), new_len, match[5].strip())
                    current.hunks.append(hunk)
    return result


def _paths_from_diff_line(line: str) -> tuple[str | None, str | None]:
    rest = line.split(" ", 2)[2] if line.count(" ") >= 2 else ""
    if rest.startswith("a/") and " b/" in rest:
        old, new = rest[2:].split(" b/", 1)
        return old, new
    return rest or None, rest or None


def _strip_prefix(path: str) -> str:
    path = path.rstrip("\t")
    return path[2:] if path[:2] in ("a/", "b/") else path


def branch_refs(repo: git.Repo) -> dict[str, str]:
    """Local and remote branches (full ref name -> sha), without symbolic refs like origin/HEAD, and
    without `origin/X` when the local `X` is at the same commit (it would only repeat the name)."""
    out = read_git(repo, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)",
                   "refs/heads", "refs/remotes")
    refs = {}
    for line in out.splitlines():
        name, sha, symref = line.split("\0")
        if not symref:
            refs[name] = sha
    local = {name.removeprefix("refs/heads/"): sha for name, sha in refs.items() if name.startswith("refs/heads/")}
    return {name: sha for name, sha in refs.items()
            if not (name.startswith("refs/remotes/") and local.get(name.split("/", 3)[-1]) == sha)}


def refs_containing(repo: git.Repo, sha: str, refs: dict[str, str]) -> list[str]:
    """Which of `refs` (branches, local and remote) hold `sha`."""
    out = read_git(repo, "for-each-ref", "--contains", sha, "--format=%(refname)", "refs/heads", "refs/remotes")
    return sorted(name for name in out.split() if name in refs)


def default_branch(repo: git.Repo, refs: dict[str, str]) -> str | None:
    """Short name of the default branch: what origin/HEAD points at, else main, else master."""
    try:
        target = repo.git.symbolic_ref("--quiet", "refs/remotes/origin/HEAD").strip()
    except git.GitCommandError:
        target = ""
    for ref in (target, "refs/heads/main", "refs/remotes/origin/main", "refs/heads/master",
                "refs/remotes/origin/master"):
        if ref in refs:
            return short_ref(ref)
    return None


def short_ref(ref: str) -> str:
    """A branch as people write it: `main`, `origin/v0.9.1-dev`."""
    return ref.removeprefix("refs/heads/").removeprefix("refs/remotes/")


def show_commit(repo: git.Repo, sha: str) -> tuple[LoggedCommit, list[FileDiff]]:
    """One commit's metadata and its -U0 diff."""
    meta = logged_commits(repo, "-1", "-M", sha)[0]
    diffs = parse_diffs(read_git(repo, "log", "-1", "-M", "-U0", f"--format={DIFF_FORMAT}", sha))
    return meta, diffs.get(sha, [])


def reachable(repo: git.Repo, tip: str, exclude: str) -> set[str]:
    """Commits reachable from `tip` but not from `exclude`."""
    return set(read_git(repo, "rev-list", tip, "--not", exclude).split())


def patch_ids(repo: git.Repo, shas: Iterable[str]) -> dict[str, str]:
    """`git patch-id --stable` of many commits in two processes: equal for the same change on another base."""
    wanted = "".join(f"{sha}\n" for sha in shas)
    if not wanted:
        return {}
    base = ["git", "--git-dir", repo.git_dir]
    diffs = subprocess.run([*base, "diff-tree", "--stdin", "-p", "--no-color"], input=wanted.encode(),
                           capture_output=True, check=False).stdout
    out = subprocess.run([*base, "patch-id", "--stable"], input=diffs, capture_output=True, check=False).stdout
    return {commit: pid for pid, commit in (line.split() for line in out.decode().splitlines() if line.strip())}
