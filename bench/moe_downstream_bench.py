"""MoE faults after an earlier MoE layer's routing flips: the family bench's pairs on DeepSeek-V3 families of its own.

    .venv/bin/python bench/moe_downstream_bench.py [--work /tmp/moe-downstream-bench] [--seeds 30 31] [--why]

The family bench (bench/family_bench.py) puts its MoE faults at the middle layer of 5- and 6-layer models:
layer 2 or 3, after layer 1's router has already moved some tokens' experts. Here the same pairs (its
`pairs`, `make_pair`: real MindStudio Probe dumps, clean pairs and faults alike) are made on DeepSeek-V3
families it does not have: seeds 30 and up, its router saturated or "peaked" (off its plateau, its experts'
scores close together), with and without `norm_topk_prob`, 5 and 6 layers, so the faults sit at layers 2
and 3. This is a tune split: the family bench's own families (seeds 40-43) stay held out. Each pair is
judged with the peer setting the family bench chooses (`--setting`, default 12,5); `--why` prints, for each
pair, every MoE layer's routing (flips, those beyond their bound, the worst margin over bound) and the
module lines met before the first flagged one.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from family_bench import MoeFamily, make_pair, pairs  # noqa: E402

from bisect_npu.oracle.config import LogitsConfig  # noqa: E402
from bisect_npu.oracle.dumps.compare import compare_dumps  # noqa: E402
from tests.helpers.tiny_moe import MoeSpec  # noqa: E402

# Router kinds as the family bench builds them: saturated (shared logit part 20) or peaked (shared part 4,
# experts' own part x0.1, correction bias x0.1).
ROUTERS: dict[str, dict[str, float]] = {
    "saturated": {"router_offset": 20.0},
    "peaked": {"router_offset": 4.0, "router_scale": 0.1, "bias_scale": 0.1},
}
SHAPES = [("saturated", True, 5, 128, 4.0), ("saturated", False, 6, 160, 1.0), ("peaked", False, 6, 160, 1.0),
          ("peaked", True, 5, 128, 4.0)]


def families(seeds: list[int]) -> list[MoeFamily]:
    """One family per seed and shape: (router, norm_topk_prob, layers, hidden, logit scale)."""
    out = []
    for seed in seeds:
        for router, norm, layers, hidden, scale in SHAPES:
            name = f"dsv3-{router}-{'norm' if norm else 'nonorm'}-l{layers}-h{hidden}-s{seed}"
            spec = MoeSpec("deepseek_v3", hidden=hidden, layers=layers, norm_topk_prob=norm, seed=seed,
                           **ROUTERS[router])  # type: ignore[arg-type]
            out.append(MoeFamily(name, spec, scale, router == "peaked"))
    return out


def why(result: object, first: str | None) -> list[str]:
    """The evidence: each MoE layer's routing, and each flagged or near-line module row up to the first flagged."""
    lines = []
    for report in result.routing:  # type: ignore[attr-defined]
        beyond = report.unexplained
        lines.append(f"    routing {report.module}: {len(report.flips)} flips, {len(beyond)} beyond bound, worst "
                     f"x{report.worst_ratio():.3g}, explainable {report.explainable}"
                     + (f"; FINDING {report.finding}" if report.finding else ""))
    for row in result.rows:  # type: ignore[attr-defined]
        if row.problem is not None:
            lines.append(f"    first flagged {row.name}: {row.problem}")
            break
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/moe-downstream-bench"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[30, 31])
    parser.add_argument("--setting", default="12,5", help="peer_mads,peer_min_factor")
    parser.add_argument("--only", default="", help="pair names to judge (commas; default all)")
    parser.add_argument("--why", action="store_true", help="print each pair's routing and first flagged row")
    args = parser.parse_args()
    os.environ.setdefault("MSPROBE_LOG_LEVEL", "3")
    mads, factor = (float(part) for part in args.setting.split(","))
    config = LogitsConfig(peer_mads=mads, peer_min_factor=factor)
    print(f"# moe_downstream_bench {date.today()} {platform.machine()} load {os.getloadavg()[0]:.1f} "
          f"seeds {args.seeds} setting {mads:g},{factor:g}")
    print("| family | pair | fault at | verdict | first flagged |")
    print("|---|---|---|---|---|")
    tally = {"false": 0, "clean": 0, "named": 0, "faults": 0}
    for family in families(args.seeds):
        for pair in pairs(family):
            if args.only and pair.name not in args.only.split(","):
                continue
            cand, ref = make_pair(args.work, pair)
            result = compare_dumps(cand, ref, config)
            first = result.first_divergent
            flagged = first.module if first is not None else None
            if pair.fault is None:
                cell = "false alarm" if flagged else "clean"
                tally["clean"] += 1
                tally["false"] += flagged is not None
            elif pair.above_noise:
                cell = "named" if pair.sits_in(flagged) else "missed"
                tally["faults"] += 1
                tally["named"] += pair.sits_in(flagged)
            else:
                cell = "listed apart"
            print(f"| {family.name} | {pair.name} | {pair.faulty_module or '-'} | {cell} | {flagged or '-'} |",
                  flush=True)
            if args.why:
                print("\n".join(why(result, flagged)), flush=True)
    print(f"\n- clean pairs: {tally['false']}/{tally['clean']} false alarms")
    print(f"- above-noise faults named at their module: {tally['named']}/{tally['faults']}")


if __name__ == "__main__":
    main()
