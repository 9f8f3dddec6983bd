"""How fast `propose_fixes` / `bisect-npu fix` is on a 5,000-commit history, against naive baselines.

The history (written with `git fast-import`): 40 modules of 120 lines; every commit edits one line
somewhere, every 7th commit inserts lines above the culprit's line in the culprit's module (so its
position moves), every 25th is an unrelated `[BugFix]`; the culprit is commit 100 and the fix
(which restores the culprit's line, title without a tag) is commit n - 100.

Baselines measured in the same run, both finding the commits that touch the culprit's lines:
  - `git log -L` once per culprit hunk over culprit..HEAD (what `git` offers for line history);
  - per-commit diff scanning: one `git show -U0` per later commit, parsed in Python
    (with --sample N only N commits are timed and the figure is extrapolated, and says so).

    .venv/bin/python bench/fix_bench.py [--commits 5000] [--sample 0] [--repo PATH --culprit SHA ...]

With ``--repo`` and ``--culprit`` it also times ``propose_fixes`` on a real repository (for
instance a clone of vllm-ascend, whose main has 4,700 first-parent commits) for each culprit.
With ``--repo`` and ``--reverts BRANCH`` it scores the ranking on the repository's own history:
every first-parent ``Revert "..."`` on BRANCH whose reverted commit is named in its message
("This reverts commit <sha>") or is the latest earlier commit with the quoted title is a known
(culprit, fix) pair; it prints where the revert ranks
among the proposals, against the baseline "the next commit that touches the culprit's files".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.gitrepo import make_linear_repo  # noqa: E402

MODULES = 40
LINES = 120
HOT = "vllm_ascend/sample/mod_7.py"
HOT_LINE = 60


def module_text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def build_history(path: Path, n: int) -> tuple[str, str]:
    modules = {f"vllm_ascend/sample/mod_{m}.py": [f"def f_{m}_{k}(x):" if k % 10 == 0 else f"    x = x + {k}"
                                                   for k in range(LINES)] for m in range(MODULES)}
    culprit, fix = 100, n - 100
    hot = modules[HOT]
    hot_index = [HOT_LINE]  # where the culprit's line is now (insertions above move it)

    def files(i: int) -> dict[str, str]:
        if i == 0:
            return {name: module_text(lines) for name, lines in modules.items()}
        if i == culprit:
            hot[hot_index[0]] = "    x = x  # skip repetition_penalty under async"
            return {HOT: module_text(hot)}
        if i == fix:
            hot[hot_index[0]] = f"    x = x + {HOT_LINE}"
            return {HOT: module_text(hot)}
        if i % 7 == 0:
            hot.insert(2, f"    # note {i}")
            hot_index[0] += 1
            return {HOT: module_text(hot)}
        name = f"vllm_ascend/sample/mod_{i % MODULES}.py"
        lines = modules[name]
        k = (i * 37) % len(lines)
        if name == HOT and abs(k - hot_index[0]) < 10:
            k = 1
        if not lines[k].startswith("def "):
            lines[k] = f"    x = x + {i}"
        return {name: module_text(lines)}

    def titles(i: int) -> str:
        if i == culprit:
            return "[Perf] Skip the async back-fill (#5100)"
        if i == fix:
            return "Restore the penalty history (#9900)"
        if i % 25 == 0:
            return f"[BugFix] Fix async crash {i} (#{5000 + i})"
        return f"Change {i} (#{5000 + i})"

    shas = make_linear_repo(path, n, titles=titles, files=files)
    return shas[culprit], shas[fix]


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout


def baseline_log_l(path: Path, culprit: str) -> tuple[float, set[str]]:
    diff = git(path, "show", "-U0", "--format=", culprit)
    ranges = [(line.split("+")[1].split(" ")[0]) for line in diff.splitlines() if line.startswith("@@")]
    start = time.perf_counter()
    touched: set[str] = set()
    for spec in ranges:
        first, _, count = spec.partition(",")
        last = int(first) + max(int(count or 1), 1) - 1
        out = git(path, "log", "--format=%x1e%H", "-L", f"{first},{last}:{HOT}", f"{culprit}..HEAD")
        touched.update(rec.split("\n", 1)[0] for rec in out.split("\x1e")[1:])
    return time.perf_counter() - start, touched


def baseline_per_commit(path: Path, culprit: str, sample: int) -> tuple[float, int, int]:
    shas = git(path, "rev-list", "--reverse", f"{culprit}..HEAD").split()
    timed = shas[:sample] if sample else shas
    start = time.perf_counter()
    hunks = 0
    for sha in timed:
        hunks += sum(1 for line in git(path, "show", "-U0", "--format=", sha).splitlines() if line.startswith("@@"))
    return time.perf_counter() - start, len(timed), len(shas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=5000)
    parser.add_argument("--sample", type=int, default=0, help="time only N commits of the per-commit baseline")
    parser.add_argument("--repo", help="a real repository to time propose_fixes on as well")
    parser.add_argument("--culprit", action="append", default=[], help="a culprit in --repo (repeatable)")
    parser.add_argument("--reverts", metavar="BRANCH", help="score the ranking on BRANCH's reverts in --repo")
    args = parser.parse_args()

    import git as gitpython

    from bisect_npu.fix import propose_fixes

    with tempfile.TemporaryDirectory(prefix="fix-bench-") as tmp:
        path = Path(tmp) / "upstream"
        start = time.perf_counter()
        culprit, fix = build_history(path, args.commits)
        print(f"history: {args.commits} commits written in {time.perf_counter() - start:.2f} s (git fast-import)")

        start = time.perf_counter()
        report = propose_fixes(gitpython.Repo(path), culprit, symptom=["repetition_penalty", "async"])
        ours = time.perf_counter() - start
        best = report.proposals[0] if report.proposals else None
        ok = best is not None and best.shas == [fix]
        print(f"propose_fixes: {ours:.2f} s; fix ranked first: {ok} "
              f"({len(report.proposals)} proposals, best score {best.score if best else 0:g})")

        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "bisect_npu", "fix", "--culprit", culprit, "--repo", str(path),
                               "--keyword", "async", "--json"], capture_output=True, text=True, cwd=ROOT)
        cli = time.perf_counter() - start
        print(f"bisect-npu fix (process, imports included): {cli:.2f} s, exit {done.returncode}")

        log_l, touched = baseline_log_l(path, culprit)
        print(f"baseline git log -L per culprit hunk: {log_l:.2f} s (finds {len(touched)} commit(s) "
              f"touching the lines; no ranking, no other signals) -> {log_l / ours:.1f}x ours")

        scan, timed, total = baseline_per_commit(path, culprit, args.sample)
        estimate = scan * total / max(timed, 1)
        label = "" if timed == total else f" (timed {timed} of {total}, extrapolated)"
        print(f"baseline per-commit git show -U0 scan: {estimate:.2f} s{label} -> {estimate / ours:.1f}x ours")
    for sha in args.culprit if args.repo else []:
        repo = gitpython.Repo(args.repo)
        start = time.perf_counter()
        report = propose_fixes(repo, sha)
        best = report.proposals[0] if report.proposals else None
        print(f"real repository, culprit {sha[:10]}: propose_fixes {time.perf_counter() - start:.2f} s, "
              f"{len(report.proposals)} proposals" + (f", best {best.shas[0][:10]} {best.title[:60]}" if best else ""))
    if args.repo and args.reverts:
        revert_ranks(gitpython.Repo(args.repo), args.reverts)
    if not ok:
        sys.exit(1)


def revert_ranks(repo, branch: str) -> None:
    """Rank of each revert among the proposals for the commit it reverts, and the baseline's hit."""
    import re

    import gitdb.exc

    from bisect_npu.fix import propose_fixes

    log = repo.git.log("--first-parent", "--reverse", "--format=%H%x1f%s%x1f%b%x1e", branch)
    records = [[*r.split("\x1f", 2), "", ""][:3] for r in (r.strip() for r in log.split("\x1e")) if r]
    pairs = []
    for at, (sha, title, body) in enumerate(records):
        if not title.startswith("Revert"):
            continue
        named = re.search(r"This reverts commit ([0-9a-f]{7,40})", body)
        quoted = re.match(r'Revert "(.+)"', title)
        if named:
            try:
                pairs.append((repo.commit(named.group(1)).hexsha, sha, title))
            except (ValueError, gitdb.exc.ODBError) as exc:  # a sha the clone does not hold
                print(f"  skipped {title[:60]}: {exc}")
        elif quoted:  # else the latest earlier commit with the quoted title (GitHub cuts long ones with …)
            inner = quoted.group(1).removesuffix("…")
            earlier = [s for s, t, _ in records[:at] if t == inner or (quoted.group(1).endswith("…")
                                                                        and t.startswith(inner))]
            if earlier:
                pairs.append((earlier[-1], sha, title))
    ranks, baseline_hits, seconds = [], 0, 0.0
    for culprit, revert, title in pairs:
        start = time.perf_counter()
        shas = [p.shas for p in propose_fixes(repo, culprit, top=0).proposals]
        seconds += time.perf_counter() - start
        rank = next((i + 1 for i, group in enumerate(shas) if revert in group), None)
        ranks.append(rank)
        files = repo.git.show("--format=", "--name-only", culprit).split()
        nxt = repo.git.log("--first-parent", "--reverse", "--format=%H", f"{culprit}..{branch}", "--", *files).split()
        baseline_hits += bool(nxt) and nxt[0] == revert
        print(f"  revert ranked {rank or '-'} of {len(shas)}: {title[:80]}", flush=True)
    first = sum(r == 1 for r in ranks)
    print(f"reverts on {branch}: {len(pairs)}; ranked first {first} ({first / max(len(pairs), 1):.0%}), "
          f"in the top 3 {sum(r is not None and r <= 3 for r in ranks)}; baseline (next commit touching the "
          f"culprit's files) right {baseline_hits} ({baseline_hits / max(len(pairs), 1):.0%}); "
          f"{seconds / max(len(pairs), 1):.1f} s per culprit")


if __name__ == "__main__":
    main()
