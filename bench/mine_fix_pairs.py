"""Mine culprit -> fix pairs from a clone's own history: fixes that name the commit they repair.

A fix qualifies when its message cites its culprit: `Revert "<title>"` or "This reverts commit <sha>",
or a trigger phrase ("introduced by", "caused by", "regression from", "broken by", ...) followed
closely by the culprit's PR number (`#N`, `.../pull/N` of this repository, not vLLM's) or sha. The
culprit must be an ancestor of the fix (the cited PR itself, or its cherry-pick on the fix's
branch). The bad end is the first tag on the fix's branch that holds the culprit and not the fix, else
the fix's parent:
what a user would have run.

    .venv/bin/python bench/mine_fix_pairs.py --repo CLONE [--out bench/data/fix_pairs.tsv]

Rerunning keeps the hand-written `keywords` column of the existing file (matched on the fix's sha);
new pairs get an empty one to fill in by hand (bench/data/README.md says how).
Pairs with the same culprit and fix titles on several branches are kept once (main first).
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bisect_npu.fix.propose import normalize_title  # noqa: E402

COLUMNS = ("split", "branch", "culprit", "fix", "bad", "fix_date", "citation", "keywords",
           "culprit_title", "fix_title")
SPLIT_DATE = datetime(2026, 1, 1, tzinfo=UTC)
BRANCH = re.compile(r"^(main|v\d[\w.]*-dev|releases/v[\w.]+)$")
TRIGGER = re.compile(r"(?:introduced|caused|broken|brought|regressed)\s+(?:by|in|from|since)|regression\s+"
                     r"(?:from|of|in|after|introduced|caused)|(?:breaks|broke)\s+(?:by|since)",
                     re.IGNORECASE)
# "introduced by/in" also names where a feature came from ("the op introduced in #N"): it counts only
# when its sentence speaks of a problem, or the fix's title says it undoes the change.
PROBLEM = re.compile(r"bug|issue|problem|error|regress|fail|brok|break|accura|precision|crash|wrong|mistake|"
                     r"accident|revert|\bhang|\bnan\b|\boom\b|incorrect", re.IGNORECASE)
UNDOES = re.compile(r"\b(?:revert|restore|roll\s*back)", re.IGNORECASE)  # a fix that undoes the cited change
SELF_EVIDENT = re.compile(r"caused|broken|regress|broke", re.IGNORECASE)
# A PR of this repository: `#N` not preceded by another project's name, or a pull URL of vllm-ascend.
PR_CITE = re.compile(r"(?<![\w/-])(?:vllm-project/vllm-ascend)?#(\d{2,6})\b|vllm-ascend/pull/(\d{2,6})\b")
SHA_CITE = re.compile(r"(?<![0-9a-zA-Z])([0-9a-f]{7,40})(?![0-9a-zA-Z])")
REVERT_TITLE = re.compile(r'^Revert\s+"(.+?)"?(?:\s*\(#\d+\))?\s*$')
REVERTS_SHA = re.compile(r"This reverts commit ([0-9a-f]{7,40})", re.IGNORECASE)
PR_SUFFIX = re.compile(r"\(#(\d+)\)\s*$")
# Read and set aside by hand: the citation is right, but the "fix" repairs no symptom a user would report.
EXCLUDED = {
    "a7450db1": "a vLLM upgrade; its citations are vLLM's PRs",
    "d1f0df7b": "a release-freeze revert, no symptom",
    "09f71c14": "a release-freeze revert, no symptom",
    "0b240395": "CI workflows of a vLLM upgrade",
    "dde19f7b": "a vLLM upgrade; the citation is one line of its table about a unit test",
}
WINDOW = 100  # characters after a trigger phrase in which the citation must stand
# A fix that only changes these repairs CI, tests or docs, not what a user runs.
IGNORABLE = re.compile(r"^\.github/|^docs?/|\.md$|\.rst$|^tests?/")
REAPPLY = re.compile(r"^Reapply\b", re.IGNORECASE)


@dataclass
class Commit:
    sha: str
    time: int
    title: str
    body: str
    paths: list[str]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def first_parent_log(repo: Path, branch: str) -> list[Commit]:
    out = git(repo, "log", "--first-parent", "--reverse", "--name-only", "--format=%x1e%H%x1f%ct%x1f%B%x1f", branch)
    commits = []
    for record in out.split("\x1e")[1:]:
        sha, ctime, message, files = record.split("\x1f")
        title, _, body = message.strip().partition("\n")
        commits.append(Commit(sha, int(ctime), title.strip(), body, [f for f in files.split("\n") if f]))
    return commits


def is_ancestor(repo: Path, older: str, newer: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", older, newer]).returncode == 0


def citations(commit: Commit) -> list[tuple[str, str]]:
    """(kind, value) the message cites as its culprit: ('revert-title', title), ('sha', hex), ('pr', N)."""
    message = commit.title + "\n" + commit.body
    found: list[tuple[str, str]] = []
    revert = REVERT_TITLE.match(commit.title)
    if revert:
        found += [("sha", s) for s in REVERTS_SHA.findall(message)]
        found.append(("revert-title", revert[1].rstrip('"')))
        return found
    for trigger in TRIGGER.finditer(message):
        sentence = re.split(r"[.!?]\s|\n\s*\n", message[:trigger.start()])[-1]
        if not SELF_EVIDENT.match(trigger[0]) and not PROBLEM.search(sentence) and not UNDOES.search(commit.title):
            continue
        if sentence.count("[") > sentence.count("]"):
            continue  # inside a link's text: the quoted title of another PR, not this fix's words
        window = message[trigger.end():trigger.end() + WINDOW]
        window = re.split(r"\n\s*\n", window)[0]  # the same paragraph
        for match in PR_CITE.finditer(window):
            found.append(("pr", match[1] or match[2]))
        for match in SHA_CITE.finditer(window):
            if not match[1].isdigit():
                found.append(("sha", match[1]))
    return found


def first_tag_between(repo: Path, branch: str, culprit: str, fix: str) -> str | None:
    """The oldest tag on the fix's branch that holds the culprit and not the fix: a release the user ran."""
    out = git(repo, "tag", "--merged", branch, "--contains", culprit, "--no-contains", fix, "--sort=creatordate")
    tags = out.split()
    return tags[0] if tags else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", required=True, type=Path, help="a full clone of vllm-ascend")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "data" / "fix_pairs.tsv")
    args = parser.parse_args()
    repo: Path = args.repo

    kept: dict[str, dict[str, str]] = {}
    if args.out.exists():
        with args.out.open() as handle:
            kept = {row["fix"]: row for row in csv.DictReader(handle, delimiter="\t")}

    branches = [b for b in git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads").split()
                if BRANCH.match(b)]
    branches.sort(key=lambda b: (b != "main", b))
    by_pr: dict[str, list[str]] = {}
    all_titles: dict[str, str] = {}
    logs = {b: first_parent_log(repo, b) for b in branches}
    for commits in logs.values():
        for c in commits:
            all_titles[c.sha] = c.title
            if (m := PR_SUFFIX.search(c.title)):
                by_pr.setdefault(m[1], []).append(c.sha)

    rows: list[dict[str, str]] = []
    seen_pairs: set[tuple[str, str]] = set()
    seen_fix: set[str] = set()
    for branch, commits in logs.items():
        earlier_by_title: dict[str, str] = {}
        for commit in commits:
            for kind, value in citations(commit):
                culprit = resolve(repo, kind, value, commit, earlier_by_title, by_pr, all_titles)
                if culprit is None or culprit == commit.sha or commit.sha in seen_fix or commit.sha[:8] in EXCLUDED:
                    continue
                if all(IGNORABLE.search(p) for p in commit.paths) or REAPPLY.match(commit.title):
                    continue
                key = (normalize_title(all_titles.get(culprit, "")), normalize_title(commit.title))
                if key in seen_pairs:
                    continue
                seen_pairs.add(key)
                seen_fix.add(commit.sha)
                bad = (first_tag_between(repo, branch, culprit, commit.sha)
                       or git(repo, "rev-parse", f"{commit.sha}^").strip())
                when = datetime.fromtimestamp(commit.time, UTC)
                old = kept.get(commit.sha, {})
                rows.append({
                    "split": "train" if when < SPLIT_DATE else "test", "branch": branch, "culprit": culprit,
                    "fix": commit.sha, "bad": bad, "fix_date": when.date().isoformat(), "citation": kind,
                    "keywords": old.get("keywords", ""), "culprit_title": all_titles.get(culprit, ""),
                    "fix_title": commit.title,
                })
            earlier_by_title[commit.title] = commit.sha
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} pairs ({sum(r['split'] == 'train' for r in rows)} train, "
          f"{sum(r['split'] == 'test' for r in rows)} test) -> {args.out}")


def resolve(repo: Path, kind: str, value: str, fix: Commit, earlier_by_title: dict[str, str],
            by_pr: dict[str, list[str]], titles: dict[str, str]) -> str | None:
    """The culprit commit a citation names, an ancestor of the fix; else None."""
    if kind == "revert-title":
        inner = value.removesuffix("…")
        if value in earlier_by_title:
            return earlier_by_title[value]
        matches = [sha for title, sha in earlier_by_title.items() if value.endswith("…") and title.startswith(inner)]
        return matches[-1] if matches else None
    if kind == "sha":
        try:
            sha = git(repo, "rev-parse", "--verify", "--quiet", f"{value}^{{commit}}").strip()
        except subprocess.CalledProcessError:
            return None
        return sha if sha and is_ancestor(repo, sha, fix.sha) else None
    shas = by_pr.get(value, [])
    for sha in shas:
        if is_ancestor(repo, sha, fix.sha):
            return sha
    # The cited PR was cherry-picked to the fix's branch under another number: its twin by title.
    for sha in shas:
        twin = earlier_by_title.get(titles[sha]) or next(
            (s for t, s in earlier_by_title.items() if normalize_title(t) == normalize_title(titles[sha])), None)
        if twin:
            return twin
    return None


if __name__ == "__main__":
    main()
