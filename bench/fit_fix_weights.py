"""Refit the fix ranking's weights (bisect_npu/fix/weights.json) on the train split of the pairs.

Every train pair is ranked twice, with the citation shown and hidden (as bench/fix_eval.py does), and
the evidence of every proposal kept: per query a matrix of features and the row of the true fix
(none when the fix is not among the proposals, which teaches the model's "none of them" score). A
conditional logit is fitted on those queries (bench/fix_logit.py); test pairs are never read.

    .venv/bin/python bench/fit_fix_weights.py --repo CLONE [--pairs bench/data/fix_pairs.tsv]
        [--cache FILE | --from-dump FILE] [--l2 0.05 | --cv 4]

`--cache` keeps the collected evidence in FILE (JSON) and reuses it when it exists, so changing
only the regularisation does not re-read the history (delete it after changing a signal).
`--from-dump FILE` fits on the train queries of a `bench/fix_eval.py --dump FILE` run instead (the same
evidence, one pass over the history for both; then `bench/fix_eval.py --rescore FILE` re-ranks that run
with the new weights).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fix_eval import MODES, PAIRS, load_pairs, rank_of, rank_pair  # noqa: E402
from fix_logit import fit, vector  # noqa: E402

from bisect_npu.fix.model import FEATURES  # noqa: E402

WEIGHTS = ROOT / "bisect_npu" / "fix" / "weights.json"


def collect(repo_path: str, pairs: list[dict[str, str]]) -> list[dict[str, object]]:
    import git

    repo = git.Repo(repo_path)
    queries: list[dict[str, object]] = []
    for pair in pairs:
        for mode in MODES:
            report = rank_pair(repo, pair, mode)
            rows = [p.features for p in report.proposals]
            rank = rank_of(report, pair["fix"])  # as bench/fix_eval.py counts it: the proposal the fix names
            answer = None if rank is None else rank - 1
            queries.append({"fix": pair["fix"], "mode": mode, "rows": rows, "answer": answer})
            print(f"{mode:6} {len(rows):4} proposals, fix at {answer if answer is None else answer + 1} "
                  f"{pair['fix_title'][:60]}", flush=True)
    return queries


L2_GRID = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003)


def choose_l2(queries: list[dict[str, object]], data: list[tuple[np.ndarray, int | None]], folds: int) -> float:
    """The regularisation with the best held-out top-1 (then top-3): pairs, with both their queries,
    split into `folds` groups by order; each group ranked by weights fitted on the others."""
    pairs = sorted({str(q["fix"]) for q in queries})
    fold_of = {fix: i % folds for i, fix in enumerate(pairs)}
    best = (-1.0, -1.0, L2_GRID[0])
    for l2 in L2_GRID:
        hits1 = hits3 = 0
        for fold in range(folds):
            train = [d for q, d in zip(queries, data, strict=True) if fold_of[str(q["fix"])] != fold]
            weights, _ = fit(train, l2=l2)
            for q, (matrix, answer) in zip(queries, data, strict=True):
                if fold_of[str(q["fix"])] != fold or answer is None:
                    continue
                scores = matrix @ weights
                rank = int((scores > scores[answer]).sum()) + 1
                hits1 += rank == 1
                hits3 += rank <= 3
        print(f"l2 {l2:<6} held-out top-1 {hits1}/{len(queries)}, top-3 {hits3}/{len(queries)}", flush=True)
        best = max(best, (hits1, hits3, l2))
    return best[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", help="a full clone of vllm-ascend (needed unless --cache exists)")
    parser.add_argument("--pairs", type=Path, default=PAIRS)
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--from-dump", type=Path, help="the evidence of a `bench/fix_eval.py --dump` file's train "
                                                        "queries (its test queries are not read), not the history")
    parser.add_argument("--l2", type=float, default=0.05)
    parser.add_argument("--cv", type=int, default=0, metavar="K",
                        help="choose --l2 by K-fold cross-validation over the train pairs (top-1, then top-3)")
    parser.add_argument("--out", type=Path, default=WEIGHTS)
    args = parser.parse_args()
    train = [p for p in load_pairs(args.pairs) if p["split"] == "train"]
    if args.from_dump:
        queries = [q for q in json.loads(args.from_dump.read_text()) if q["split"] == "train" and q["mode"] in MODES]
    elif args.cache and args.cache.exists():
        queries = json.loads(args.cache.read_text())
    else:
        if not args.repo:
            parser.error("--repo is needed to collect the evidence")
        queries = collect(args.repo, train)
        if args.cache:
            args.cache.write_text(json.dumps(queries))
    data = [(np.array([vector(r) for r in q["rows"]]).reshape(-1, len(FEATURES)), q["answer"]) for q in queries]
    if args.cv:
        args.l2 = choose_l2(queries, data, args.cv)
    weights, null_score = fit(data, l2=args.l2)
    found = sum(q["answer"] is not None for q in queries)
    chosen = f"l2 {args.l2}" + (f" (by {args.cv}-fold cross-validation)" if args.cv else "")
    args.out.write_text(json.dumps({
        "weights": {name: round(float(w), 4) for name, w in zip(FEATURES, weights, strict=True)},
        "null_score": round(null_score, 4),
        "trained_on": f"{len(train)} train pairs of {args.pairs.name} ({len(queries)} queries, the fix among "
                      f"the proposals in {found}), {chosen}, fitted {date.today().isoformat()}",
    }, indent=1) + "\n")
    for name, w in sorted(zip(FEATURES, weights, strict=True), key=lambda x: -abs(x[1])):
        print(f"{name:18} {w:+.3f}")
    print(f"null score {null_score:+.3f} -> {args.out}")


if __name__ == "__main__":
    main()
