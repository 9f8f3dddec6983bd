"""The upstream's git history: refs, the candidate commits of a range, and per-commit facts.

Everything here reads git objects (through GitPython, argument lists only) and never checks a
commit out or builds it: the session asks which commits to test and what each one is; the
builders decide how to build them from `CommitFacts`.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git
from packaging.version import InvalidVersion, Version

from bisect_npu.errors import UsageError
from bisect_npu.paths import cache_root
from bisect_npu.upstream.dockerfile import DockerfileFacts, DockerfileReader

_HEX_PREFIX = re.compile(r"[0-9a-fA-F]{4,40}")
# A squash-merged title ends with its pull request: "[BugFix] fix the kernel (#123)".
PR_SUFFIX = re.compile(r"\(#(\d+)\)\s*$")
_URL_LIKE = re.compile(r"^[a-z][a-z0-9+.-]*://|^[\w.-]+@[\w.-]+:")
_GITHUB_REMOTE = re.compile(
    r"^(?:https?://(?:[^@/]+@)?|ssh://(?:[^@/]+@)?|git://|[^@/]+@)github\.com[:/]"
    r"(?P<owner>[\w.-]+)/(?P<name>[\w.-]+?)(?:\.git)?/?$"
)
# What `git log -z --name-status` prints per commit for parse_log: sha, short sha, parents,
# committer time, author date, author, subject, message, then the changed paths.
LOG_FORMAT = "%x1e%H%x1f%h%x1f%P%x1f%ct%x1f%aI%x1f%an%x1f%s%x1f%B%x1f"
_LOG_BATCH = 2000  # shas per `git log` call: keeps the argument list far below ARG_MAX
_log = logging.getLogger(__name__)


def is_url(path_or_url: str) -> bool:
    """A remote to clone (scheme://... or user@host:path), not a local path."""
    return bool(_URL_LIKE.match(path_or_url))


def default_cache_dir() -> Path:
    return cache_root() / "repos"


RUN_REMEDY = "pass --repo with a clone of the upstream (or run from inside one)"


def open_repo(path_or_url: str, cache_dir: Path | None = None, remedy: str = RUN_REMEDY) -> git.Repo:
    """Open a local clone, or clone/fetch a URL into a bare cache under `cache_dir`.

    A cached clone keeps upstream branches as `origin/<branch>` (like a normal clone), so the
    same refs work whether the user points at their checkout or at the URL. `remedy` ends the
    error when the path is not a repository: what the command that asked can do about it.
    """
    if is_url(path_or_url):
        return _cached_clone(path_or_url, cache_dir or default_cache_dir())
    try:
        repo = git.Repo(path_or_url, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{path_or_url} is not a git repository; {remedy}") from None
    try:  # GitPython reads some directories git itself refuses (a bare copy without its config)
        repo.git.rev_parse("--git-dir")
    except git.GitCommandError as exc:
        raise UsageError(f"git cannot read the repository at {path_or_url} ({git_error_line(exc)}); "
                         "check `git -C PATH status` there, or clone it again") from None
    return repo


def _cached_clone(url: str, cache_dir: Path) -> git.Repo:
    name = re.sub(r"[^\w.-]+", "_", url.rstrip("/").rsplit("/", 1)[-1]).removesuffix(".git") or "repo"
    target = cache_dir / f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:12]}.git"
    try:
        if target.exists():
            repo = git.Repo(target)
            try:
                repo.git.fetch("--prune", "--quiet", "origin")
            except git.GitCommandError as exc:
                # Offline with a cache is still useful: the refs the user names are checked anyway.
                _log.warning("could not fetch %s (%s); using the cached clone %s", url, git_error_line(exc), target)
            return repo
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Clone into a temporary sibling and rename, so an interrupted clone never looks complete.
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir))
        try:
            repo = git.Repo.init(staging, bare=True)
            repo.git.remote("add", "origin", url)
            repo.git.config("--replace-all", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")
            repo.git.config("--add", "remote.origin.fetch", "+refs/tags/*:refs/tags/*")
            repo.git.fetch("--quiet", "origin")
            try:
                staging.rename(target)
            except OSError:
                if not target.exists():  # else another process finished the same clone first
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return git.Repo(target)
    except git.GitCommandError as exc:
        raise UsageError(
            f"cannot fetch {url}: {git_error_line(exc)}; check the URL or pass --repo with a local clone"
        ) from None


def git_error_line(exc: git.GitCommandError) -> str:
    """The last line git wrote to stderr (the one that says what went wrong), for one-line errors."""
    lines = str(exc.stderr or exc).strip().splitlines()
    return lines[-1].strip().strip("'") if lines else str(exc)


def resolve_ref(repo: git.Repo, ref: str) -> str:
    """Full sha of the commit `ref` names: tag, branch, remote branch, (short) sha, `HEAD~3`.

    A branch that exists only as `<remote>/<branch>` resolves too (as `git checkout` would).
    """
    if not ref or ref.startswith("-"):
        raise UsageError(f"invalid ref {ref!r}; pass a tag, branch or commit sha")
    tag, branch = _rev_parse_commit(repo, f"refs/tags/{ref}"), _rev_parse_commit(repo, f"refs/heads/{ref}")
    if tag and branch and tag != branch:
        raise UsageError(f"ref {ref} is both a tag ({tag[:12]}) and a branch ({branch[:12]}); pass tags/{ref} or "
                         f"heads/{ref}")
    sha = _rev_parse_commit(repo, ref)
    if sha:
        return sha
    remote_shas = {
        s for r in repo.remotes if (s := _rev_parse_commit(repo, f"refs/remotes/{r.name}/{ref}"))
    }
    if len(remote_shas) == 1:
        return remote_shas.pop()
    if len(remote_shas) > 1:
        raise UsageError(f"ref {ref} is ambiguous: it names different commits on several remotes; "
                         f"pass <remote>/{ref}")
    if _HEX_PREFIX.fullmatch(ref):
        matches = _commits_with_prefix(repo, ref)
        if len(matches) > 1:
            shown = ", ".join(repo.git.log("--no-walk", "--format=%h %s", m) for m in matches[:4])
            raise UsageError(f"short sha {ref} is ambiguous: {shown}; give more digits")
    nearest = nearest_tags(repo, ref)
    hint = f"nearest tags: {', '.join(nearest)}" if nearest else "pass a tag, branch or commit sha"
    raise UsageError(f"unknown ref {ref}; {hint}")


def has_commit(repo: git.Repo, sha: str) -> bool:
    """Whether the repository holds the commit `sha` (a force-push and `git gc` may have dropped it)."""
    return _rev_parse_commit(repo, sha) is not None


def _rev_parse_commit(repo: git.Repo, ref: str) -> str | None:
    try:
        return repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}") or None
    except git.GitCommandError:
        return None


def _commits_with_prefix(repo: git.Repo, prefix: str) -> list[str]:
    try:
        candidates = repo.git.rev_parse(f"--disambiguate={prefix}").split()
    except git.GitCommandError:
        return []
    return [c for c in candidates if repo.git.cat_file("-t", c) == "commit"]


def nearest_tags(repo: git.Repo, ref: str, limit: int = 3) -> list[str]:
    """Existing tags closest to a mistyped `ref`, for error messages.

    Tags that extend `ref` come first (`v0.9.0` -> `v0.9.0rc1, v0.9.0rc2`, as vllm-ascend has
    no `v0.9.0`); else, for a version, its neighbours in version order; else spelling closeness.
    """
    tags = [t.name for t in repo.tags]
    extending = [t for t in tags if t.lower().startswith(ref.lower())]
    if extending:
        return sorted(extending, key=_version_key)[:limit]
    wanted = _parse_version(ref)
    versioned = sorted((v, t) for t in tags if (v := _parse_version(t)) is not None)
    if wanted is not None and versioned:
        # Neighbours by rank, nearest first: the tags just below and just above the wanted version.
        split = sum(1 for v, _ in versioned if v < wanted)
        ranked = sorted(range(len(versioned)), key=lambda i: (abs(i - split + 0.5), i))  # below first on a tie
        return [versioned[i][1] for i in ranked[:limit]]
    return difflib.get_close_matches(ref, tags, n=limit, cutoff=0.5)


def _parse_version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _version_key(tag: str) -> tuple[int, Version | str]:
    version = _parse_version(tag)
    return (0, version) if version is not None else (1, tag)


@dataclass(frozen=True)
class CommitFacts:
    sha: str
    short: str
    title: str
    pr: int | None
    author_date: str
    author: str
    paths: tuple[str, ...]
    dockerfile: DockerfileFacts | None


Change = tuple[str, str | None, str | None]  # status letter, old path (None: added), new path (None: deleted)


@dataclass(frozen=True)
class LoggedCommit:
    """A commit as `git log --format=LOG_FORMAT -z --name-status` gives it: what the builders and
    the fix ranking read of a commit, for a whole range in one git call (no GitPython object each)."""

    sha: str
    short: str
    parents: tuple[str, ...]
    time: int  # committer time, seconds since the epoch
    author_date: str  # ISO 8601
    author: str
    subject: str  # git's %s: the first paragraph of the message, on one line
    message: str
    changes: tuple[Change, ...]

    @property
    def title(self) -> str:
        """The message's first line (what `git revert` quotes)."""
        return self.message.split("\n", 1)[0].strip()


def pr_number(title: str) -> int | None:
    """The pull request a title names at its end ("... (#123)"), else None."""
    match = PR_SUFFIX.search(title)
    return int(match[1]) if match else None


def parse_log(text: str) -> list[LoggedCommit]:
    """Commits from `git log -z --name-status --format=LOG_FORMAT` output, in git's order.

    With -z paths come verbatim, NUL-separated: a rename or copy (R100, C75) has two paths, every
    other status one."""
    commits = []
    for record in text.split("\x1e")[1:]:
        sha, short, parents, ctime, author_date, author, subject, message, rest = record.split("\x1f", 8)
        tokens = rest.lstrip("\0\n").split("\0")
        changes: list[Change] = []
        at = 0
        while at < len(tokens):
            status = tokens[at][:1]
            if not status:
                at += 1
            elif status in "RC":
                changes.append((status, tokens[at + 1], tokens[at + 2]))
                at += 3
            else:
                path = tokens[at + 1]
                changes.append((status, None if status == "A" else path, None if status == "D" else path))
                at += 2
        commits.append(LoggedCommit(sha, short, tuple(parents.split()), int(ctime), author_date, author, subject,
                                    message.strip(), tuple(changes)))
    return commits


def commit_facts(repo: git.Repo, sha: str) -> CommitFacts:
    return commits_facts(repo, [sha])[0]


def commits_facts(repo: git.Repo, shas: list[str] | tuple[str, ...]) -> list[CommitFacts]:
    """Facts of many commits with one `git log` per 2,000 commits (in the order given).

    Changed paths are against the first parent (a merge shows what it brought to its line);
    renames count as a deletion plus an addition, so both paths reach the build key.
    """
    unique = list(dict.fromkeys(shas))
    dockerfiles = DockerfileReader(repo, "Dockerfile")
    by_sha: dict[str, CommitFacts] = {}
    for start in range(0, len(unique), _LOG_BATCH):
        batch = unique[start : start + _LOG_BATCH]
        logged = parse_log(repo.git.log(
            # Explicit flags for what user config could change (log.showRoot, log.showSignature).
            "--no-walk=unsorted", "-z", "--name-status", "--no-renames", "--diff-merges=first-parent",
            "--root", "--no-show-signature", f"--format={LOG_FORMAT}", *batch, "--",
        ))
        if len(logged) != len(batch):
            raise RuntimeError(f"git log returned {len(logged)} commits for {len(batch)} requested")
        for requested, commit in zip(batch, logged, strict=True):
            by_sha[requested] = CommitFacts(
                sha=commit.sha,
                short=commit.short,
                title=commit.subject,
                pr=pr_number(commit.subject),
                author_date=commit.author_date,
                author=commit.author,
                paths=tuple(path for _, old, new in commit.changes if (path := new or old)),
                dockerfile=dockerfiles.facts(commit.sha),
            )
    return [by_sha[s] for s in shas]


@dataclass(frozen=True)
class BisectRange:
    good: str
    bad: str
    base: str
    merge_base_note: str | None
    candidates: tuple[str, ...]


def _is_shallow(repo: git.Repo) -> bool:
    return Path(repo.git_dir, "shallow").is_file()


def resolve_range(repo: git.Repo, good_ref: str, bad_ref: str) -> BisectRange:
    """The commits to bisect: first-parent commits of `bad` not contained in the good end.

    Candidates are `git rev-list --first-parent base..bad`, oldest first. When `base` (good, or
    its merge-base with bad) is on bad's first-parent line, that is exactly (base, bad]. When it
    is not (good sits on a side branch merged into bad's line), the list starts at the first
    first-parent commit that does not contain base; its parent is an ancestor of base and so good
    by git bisect's rule (ancestors of a good commit are good). `--ancestry-path` would instead
    start at the merge that brought base in and assume the unknown mainline before it is good,
    so it is not used. The note then says where the line really starts.
    """
    good = resolve_ref(repo, good_ref)
    bad = resolve_ref(repo, bad_ref)
    if good == bad:
        raise UsageError(f"good and bad are the same commit ({good[:10]}); pass two different refs")
    if is_ancestor(repo, bad, good):
        raise UsageError(
            f"good {good_ref} is newer than bad {bad_ref} (bad is an ancestor of good); "
            "swap --good and --bad, or, if the newer end is the one that works (you are looking for "
            "the fix), add --find-fix"
        )
    notes: list[str] = []
    if is_ancestor(repo, good, bad):
        base = good
    else:
        try:
            base = repo.git.merge_base(good, bad)
        except git.GitCommandError:
            if _is_shallow(repo):  # a shallow clone cuts the history that joins them
                raise UsageError(
                    f"{good_ref} and {bad_ref} share no history in this shallow clone (no merge-base "
                    "within its depth); run `git fetch --unshallow` in the repository, then start again"
                ) from None
            raise UsageError(
                f"{good_ref} and {bad_ref} share no history (no merge-base); pick a good commit that "
                f"is an ancestor of {bad_ref}"
            ) from None
        notes.append(
            f"{good_ref} is not an ancestor of {bad_ref}; bisecting from their merge-base "
            f"{_tagged_name(repo, base)}"
        )
    candidates = tuple(repo.git.rev_list("--first-parent", "--reverse", f"{base}..{bad}", "--").split())
    oldest = repo.commit(candidates[0])
    if not oldest.parents and _is_shallow(repo):
        raise UsageError(f"{bad_ref}'s history in this shallow clone ends at {oldest.hexsha[:10]}, before it reaches "
                         f"{good_ref}; run `git fetch --unshallow` in the repository, then start again")
    if not oldest.parents:
        raise UsageError(
            f"{good_ref} is not on {bad_ref}'s first-parent line and shares no first-parent ancestor "
            f"with it; pick a good commit on {bad_ref}'s first-parent line"
        )
    line_base = oldest.parents[0].hexsha
    if line_base != base:
        notes.append(
            f"{_tagged_name(repo, base)} is not on {bad_ref}'s first-parent line; candidates start "
            f"after {_tagged_name(repo, line_base)}, the last first-parent commit it contains"
        )
    return BisectRange(
        good=good,
        bad=bad,
        base=base,
        merge_base_note="; ".join(notes) or None,
        candidates=candidates,
    )


def parents_of(repo: git.Repo, sha: str) -> tuple[str, ...]:
    """The commit's parents, first parent first (two or more: a merge)."""
    return tuple(repo.git.rev_list("--no-walk", "--parents", sha, "--").split()[1:])


def merged_line(repo: git.Repo, merge: str, goods: list[str]) -> tuple[str, ...]:
    """The candidates of a merge level, oldest first: the first-parent line of the merge's second
    parent down to what the first parent and `goods` already hold (git bisect's candidates are the
    commits of neither: ancestors of a good commit are good), then the merge itself, bad when each
    side is good alone (a conflict resolved badly, two changes that break only together)."""
    first, second = parents_of(repo, merge)
    line = repo.git.rev_list("--first-parent", "--reverse", second, "--not", first, *goods, "--").split()
    return (*line, merge)


def brought_in(repo: git.Repo, line: tuple[str, ...] | list[str], goods: list[str]) -> dict[str, int]:
    """How many commits each merge of a first-parent `line` (oldest first) brings in, itself
    included, that `goods` do not hold (`git rev-list --count M --not M^1 GOODS`): what the culprit
    is as likely to be any one of, so what the search weighs that position by. Plain commits bring
    in one and are left out. One `git rev-list` for the whole range: walking the line oldest first,
    a commit is brought in by the first line commit that reaches it."""
    if not line:
        return {}
    parents: dict[str, list[str]] = {}
    for row in repo.git.rev_list("--parents", line[-1], "--not", *goods, "--").splitlines():
        sha, *of = row.split()
        parents[sha] = of
    seen: set[str] = set()
    weights: dict[str, int] = {}
    for commit in line:
        seen.add(commit)
        todo, count = list(parents.get(commit, [])[1:]), 1
        while todo:
            sha = todo.pop()
            if sha in parents and sha not in seen:
                seen.add(sha)
                count += 1
                todo.extend(parents[sha])
        if count > 1 or len(parents.get(commit, [])) > 1:
            weights[commit] = count
    return weights


def is_ancestor(repo: git.Repo, older: str, newer: str) -> bool:
    """Whether `older` is reachable from `newer`; git failures other than "no" are raised."""
    try:
        repo.git.merge_base("--is-ancestor", older, newer)
    except git.GitCommandError as exc:
        if exc.status == 1:
            return False
        raise
    return True


def _tagged_name(repo: git.Repo, sha: str) -> str:
    """`v0.9.0rc1 (abc1234)` when a tag points at `sha`, else the short sha."""
    short = repo.git.rev_parse("--short", sha)
    tags = sorted(repo.git.tag("--points-at", sha).split(), key=_version_key)
    return f"{tags[0]} ({short})" if tags else short


def github_url(repo: git.Repo) -> str | None:
    """https://github.com/OWNER/NAME of the `origin` remote, or None when it is not GitHub."""
    try:
        url = repo.git.remote("get-url", "origin")
    except git.GitCommandError:
        return None
    return github_base(url)


def github_base(url: str) -> str | None:
    """https://github.com/OWNER/NAME of a clone URL, or None when it is not GitHub."""
    match = _GITHUB_REMOTE.match(url.strip())
    return f"https://github.com/{match['owner']}/{match['name']}" if match else None


def describe(repo: git.Repo, sha: str) -> str:
    """Short human name for reports: the nearest tag that contains it (`v0.9.1~3`), or short sha."""
    try:
        name = str(repo.git.name_rev("--tags", "--name-only", "--no-undefined", sha))
    except git.GitCommandError:
        return str(repo.git.rev_parse("--short", sha))
    return name.removeprefix("tags/").removesuffix("^0")


def first_tag_containing(repo: git.Repo, sha: str) -> str | None:
    """The earliest tag (by its date) whose commit holds `sha`: the first release with a fix."""
    try:
        tags = repo.git.tag("--contains", sha, "--sort=creatordate").split()
    except git.GitCommandError:
        return None
    return tags[0] if tags else None
