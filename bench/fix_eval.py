"""How often the fix proposal finds the real fix: recall on culprit -> fix pairs from a real history.

Every pair is ranked twice: as is, and with the citation hidden (`propose_fixes(hide_citation_of=
culprit)`: the fix's message read without the culprit's PR number, sha and title, the revert relation
unused), which measures what the ranking knows when a fix does not cite its culprit. Prints top-1/3/10
recall per split (train: fixes before 2026, test: 2026) for both, the seconds per query, and in the
same run a baseline: the bug-fix-tagged commits on the fix's branch that touch the culprit's files,
most recent first.

    .venv/bin/python bench/fix_eval.py --repo CLONE [--pairs bench/data/fix_pairs.tsv] [--verbose] [--dump FILE]
    .venv/bin/python bench/fix_eval.py --rescore FILE      # after bench/fit_fix_weights.py, without git

CLONE is a full clone of https://github.com/vllm-project/vllm-ascend with its branches (a plain
`git clone` has them as origin/*; `git clone --mirror` as local branches); the committed figures were
measured on /work/fixrank-vllm-ascend.git (`git clone --mirror`, then `git commit-graph write
--reachable`, as `git gc` leaves a clone). CI does not run this: it has neither network nor clone.
`--pairs` takes any TSV with the columns of bench/data/fix_pairs.tsv (split, branch, culprit, fix,
bad, keywords at least).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import git  # noqa: E402

from bisect_npu.fix import FixReport, propose_fixes  # noqa: E402
from bisect_npu.fix.model import RankModel, load_model  # noqa: E402

PAIRS = ROOT / "bench" / "data" / "fix_pairs.tsv"
MODES = ("shown", "hidden")
CUTS = (1, 3, 10)
_BUGFIX_TAG = re.compile(r"\[\s*(?:bug\s*-?\s*fix|hot\s*-?\s*fix|fix(?:es|ed)?|bug)\s*\]|^\s*(?:bug|hot)?fix\b",
                         re.IGNORECASE)


def load_pairs(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def keywords_of(pair: dict[str, str]) -> list[str]:
    return [k.strip() for k in pair.get("keywords", "").split(";") if k.strip()]


def rank_pair(repo: git.Repo, pair: dict[str, str], mode: str, model: RankModel | None = None) -> FixReport:
    return propose_fixes(repo, pair["culprit"], bad=pair["bad"] or None, symptom=keywords_of(pair), top=0,
                         hide_citation_of=pair["culprit"] if mode == "hidden" else None, model=model)


def rank_of(report: FixReport, fix: str) -> int | None:
    """Rank of the proposal named by the fix: a proposal that lists the fix only as a twin on another
    branch (named by a commit on the user's branch that is not the fix) does not count."""
    return next((i + 1 for i, p in enumerate(report.proposals) if p.shas[0] == fix), None)


def cpu_seconds() -> float:
    """CPU time of this process and the git processes it waited for: what a query costs on a loaded machine."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def baseline_rank(repo: git.Repo, pair: dict[str, str]) -> int | None:
    """Rank of the fix among the bug-fix-tagged commits after the culprit on the fix's branch that touch
    the culprit's files, most recent first: what a maintainer would scan without this tool."""
    files = [f for f in repo.git.show("--format=", "--name-only", pair["culprit"]).split("\n") if f]
    if not files:
        return None
    branch = pair["branch"] if _has_ref(repo, pair["branch"]) else f"origin/{pair['branch']}"
    log = repo.git.log("--format=%H%x1f%s", branch, "--not", pair["culprit"], "--", *files)
    tagged = [line.split("\x1f", 1)[0] for line in log.splitlines() if _BUGFIX_TAG.search(line.split("\x1f", 1)[1])]
    return tagged.index(pair["fix"]) + 1 if pair["fix"] in tagged else None


def _has_ref(repo: git.Repo, name: str) -> bool:
    try:
        repo.git.rev_parse("--verify", "--quiet", f"refs/heads/{name}")
        return True
    except git.GitCommandError:
        return False


def recall(ranks: Sequence[int | None], cut: int) -> str:
    hits = sum(1 for r in ranks if r is not None and r <= cut)
    return f"{hits}/{len(ranks)} {hits / max(len(ranks), 1):.0%}"


def rescored_rank(record: dict[str, object], model: RankModel) -> int | None:
    """The fix's rank among a dumped query's proposals under `model` (ties keep the dumped order)."""
    rows = record["rows"]
    answer = record["answer"]
    assert isinstance(rows, list)
    if not isinstance(answer, int):
        return None
    order = sorted(range(len(rows)), key=lambda i: -model.score(rows[i]))
    return order.index(answer) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", help="a full clone of vllm-ascend (see above)")
    parser.add_argument("--pairs", type=Path, default=PAIRS)
    parser.add_argument("--split", choices=("train", "test"), help="only this split")
    parser.add_argument("--verbose", action="store_true", help="one line per pair and mode: rank, confidence")
    parser.add_argument("--dump", type=Path, help="also write every query's evidence and ranks to this JSON file")
    parser.add_argument("--rescore", type=Path, help="no git: re-rank a --dump file's evidence with the "
                                                     "shipped weights (after a refit)")
    args = parser.parse_args()
    if args.rescore:
        model = load_model()
        records = json.loads(args.rescore.read_text())
        ranks: dict[tuple[str, str], list[int | None]] = {}
        seconds: dict[str, list[float]] = {m: [] for m in MODES}
        for record in records:
            if args.split and record["split"] != args.split:
                continue
            key = (record["split"], record["mode"])
            if record["mode"] == "baseline":
                ranks.setdefault(key, []).append(record["rank"])
                continue
            rank = rescored_rank(record, model)
            ranks.setdefault(key, []).append(rank)
            seconds[record["mode"]].append(record["seconds"])
            if "cpu_seconds" in record:
                seconds.setdefault(f"{record['mode']} CPU", []).append(record["cpu_seconds"])
            if args.verbose:
                print(f"{record['split']:5} {record['mode']:6} rank {rank or '-':>3} of {len(record['rows']):4} "
                      f"{record['fix'][:10]} {record['title'][:60]}")
        report(ranks, seconds)
        return
    if not args.repo:
        parser.error("--repo is needed (or --rescore a dump)")
    repo = git.Repo(args.repo)
    pairs = [p for p in load_pairs(args.pairs) if not args.split or p["split"] == args.split]

    ranks = {}
    seconds = {m: [] for m in MODES}
    cpu = {f"{m} CPU": [] for m in MODES}
    dumped: list[dict[str, object]] = []
    for pair in pairs:
        for mode in MODES:
            start, start_cpu = time.perf_counter(), cpu_seconds()
            result = rank_pair(repo, pair, mode)
            seconds[mode].append(time.perf_counter() - start)
            cpu[f"{mode} CPU"].append(cpu_seconds() - start_cpu)
            rank = rank_of(result, pair["fix"])
            ranks.setdefault((pair["split"], mode), []).append(rank)
            dumped.append({"split": pair["split"], "mode": mode, "fix": pair["fix"], "title": pair["fix_title"],
                           "seconds": seconds[mode][-1], "cpu_seconds": cpu[f"{mode} CPU"][-1],
                           "rows": [p.features for p in result.proposals],
                           "answer": None if rank is None else rank - 1})
            if args.verbose:
                best = result.proposals[0] if result.proposals else None
                print(f"{pair['split']:5} {mode:6} rank {rank or '-':>3} of {len(result.proposals):4} "
                      f"conf {best.confidence if best else 0:.2f} {seconds[mode][-1]:5.1f}s "
                      f"(CPU {cpu[f'{mode} CPU'][-1]:4.1f}s) "
                      f"{pair['fix'][:10]} {pair['fix_title'][:60]}", flush=True)
        base = baseline_rank(repo, pair)
        ranks.setdefault((pair["split"], "baseline"), []).append(base)
        dumped.append({"split": pair["split"], "mode": "baseline", "fix": pair["fix"], "rank": base})
        if args.dump:
            args.dump.write_text(json.dumps(dumped))
    report(ranks, {**seconds, **cpu})


def report(ranks: dict[tuple[str, str], list[int | None]], seconds: dict[str, list[float]]) -> None:
    print(f"\n{'split':6} {'ranking':9} {'pairs':>5}  {'top-1':>10}  {'top-3':>10}  {'top-10':>10}")
    for split in ("train", "test"):
        for mode in (*MODES, "baseline"):
            got = ranks.get((split, mode))
            if got:
                print(f"{split:6} {mode:9} {len(got):5}  {recall(got, 1):>10}  {recall(got, 3):>10}  "
                      f"{recall(got, 10):>10}")
    for mode in seconds:
        times = sorted(seconds[mode])
        if times:
            print(f"seconds per query ({mode}): mean {sum(times) / len(times):.1f}, "
                  f"median {times[len(times) // 2]:.1f}, max {times[-1]:.1f}")


if __name__ == "__main__":
    main()
