"""Steps to a culprit in a merge-based history, against `git bisect run` itself, for every commit of a
range taken as the culprit in turn.

    .venv/bin/python bench/merges_bench.py REPO GOOD BAD

For each commit C of `git rev-list BAD --not GOOD`, the predicate is "bad when the checkout contains
C" (what a regression that C introduced looks like to any oracle). `git bisect run` answers it with
`--no-checkout` (this script, called back with `--judge C`, reads BISECT_HEAD: no shell, no files
checked out); bisect-npu's answer goes through the same functions a run does: `history.resolve_range`
and `history.brought_in` for the first-parent line, `search.decide` (exact mode, its weights) for
every step, and a merge found is descended into with `history.merged_line` as `MergeLevel` does.
Both counts leave out the two end checks (git bisect run makes none); `plain` is the same descent
without the weights (the midpoint at every level). Prints one summary line and the distribution of
bisect-npu's steps minus git's.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import git

from bisect_npu import search
from bisect_npu.upstream import history


def contains(repo: git.Repo, commit: str, culprit: str) -> bool:
    return history.is_ancestor(repo, culprit, commit)


def line_search(repo: git.Repo, line: list[str], base: str, weights: dict[str, int] | None,
                culprit: str) -> tuple[str, int]:
    """The first bad commit of a first-parent line (ends known), and the steps it took."""
    problem = search.SearchProblem(n=len(line), check_ends=False,
                                   weights=tuple([1] + [weights.get(c, 1) for c in line]) if weights else None)
    evidence: dict[int, search.Evidence] = {}
    while isinstance(decision := search.decide(problem, evidence), search.Next):
        for query in decision.queries:
            commit = base if query.index == 0 else line[query.index - 1]
            evidence[query.index] = search.Evidence().add("bad" if contains(repo, commit, culprit) else "good")
    assert isinstance(decision, search.Found), decision
    return line[decision.index - 1], len(evidence)


def bisect_npu_steps(repo: git.Repo, good: str, bad: str, culprit: str, weighed: bool) -> tuple[str, int, int]:
    """The first bad commit, the steps to it and how many merge levels were descended."""
    brange = history.resolve_range(repo, good, bad)
    line, base = list(brange.candidates), brange.base
    scope_goods = weight_goods = [brange.good]  # as MergeLevel hands them down
    merge: str | None = None
    steps = descended = 0
    while True:
        candidates = line[:-1] if merge else line
        weights = history.brought_in(repo, candidates, weight_goods) if weighed else None
        found, taken = line_search(repo, line, base, weights, culprit)
        steps += taken
        parents = history.parents_of(repo, found)
        if len(parents) != 2 or found == merge:
            return found, steps, descended
        descended += 1
        if merge is not None:
            scope_goods = [*scope_goods, base]
        merge, base = found, parents[0]
        line = list(history.merged_line(repo, merge, scope_goods))
        weight_goods = [base, *scope_goods]


def git_bisect_run(path: Path, good: str, bad: str, culprit: str) -> tuple[str, int]:
    subprocess.run(["git", "-C", str(path), "bisect", "start", "--no-checkout", bad, good], check=True,
                   capture_output=True)
    try:
        out = subprocess.run(["git", "-C", str(path), "bisect", "run", sys.executable, __file__, "--judge", culprit],
                             check=True, capture_output=True, text=True).stdout
    finally:
        subprocess.run(["git", "-C", str(path), "bisect", "reset"], check=True, capture_output=True)
    first = re.search(r"^([0-9a-f]{40}) is the first bad commit", out, re.MULTILINE)
    assert first, out
    return first[1], out.count("running ")


def main(path: Path, good: str, bad: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:  # git bisect writes into the repository: a clone
        clone = Path(scratch) / "clone"
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(path), str(clone)], check=True)
        repo = git.Repo(clone)
        good, bad = history.resolve_ref(repo, good), history.resolve_ref(repo, bad)
        culprits = repo.git.rev_list(bad, "--not", good).split()
        totals = collections.Counter[str]()
        diffs = collections.Counter[int]()
        for culprit in culprits:
            first, git_runs = git_bisect_run(clone, good, bad, culprit)
            ours, weighted, _ = bisect_npu_steps(repo, good, bad, culprit, weighed=True)
            plain_found, plain, _ = bisect_npu_steps(repo, good, bad, culprit, weighed=False)
            assert first == ours == plain_found == culprit, (culprit, first, ours, plain_found)
            totals.update(git=git_runs, weighted=weighted, plain=plain)
            diffs[weighted - git_runs] += 1
        print(f"{len(culprits)} culprits, same answer as git bisect run for each; steps without the end checks: "
              f"git {totals['git']}, bisect-npu {totals['weighted']} (plain midpoints {totals['plain']})")
        print("bisect-npu minus git:", ", ".join(f"{d:+d}: {n}" for d, n in sorted(diffs.items())))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--judge"]:
        head = subprocess.run(["git", "rev-parse", "BISECT_HEAD"], check=True, capture_output=True, text=True).stdout
        inside = subprocess.run(["git", "merge-base", "--is-ancestor", sys.argv[2], head.strip()], check=False)
        raise SystemExit(1 if inside.returncode == 0 else 0)
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
