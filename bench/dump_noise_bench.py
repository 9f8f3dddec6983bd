"""The dump diff on real kernel noise: msprobe compare, the fixed-line rules (git 53b5388) and the peers' noise.

    .venv/bin/python bench/dump_noise_bench.py [--work /tmp/dump-noise-bench] [--split report] [--only PREFIX]
                                               [--tools "peers' noise"]

Pairs are real MindStudio Probe dumps (PrecisionDebugger, task tensor, L0) of HF transformers'
Qwen3 on the CPU, made by tests/helpers/msprobe_qwen3.py: clean pairs of two correct kernels (SDPA vs
eager), precisions (a bf16 candidate against the fp32 golden) and thread counts, and faults at
a known module (RoPE theta, activation, 2% gain, a zeroed KV head, q/k norms skipped). The rules'
settings were tuned on the tune split; the table is the report split's (other seeds, sizes and
fault layers).

Each tool judges each pair in a process of its own, timed from start to exit, with the peak
resident memory of that process (os.wait4):
* msprobe: `msprobe compare -tp CAND/step0 -gp GOLDEN/step0 -o OUT`; its first flagged module is
  the first row (execution order) whose Result is error or warning;
* fixed line: git 53b5388's oracle/dumps/compare.py (the rules before this change), loaded from
  `git show`, with its default settings;
* peers' noise: this tree's compare_dumps with its default settings.
A false alarm is a clean pair flagged; a fault is named when the first flagged module is the one
the fault sits in. `--tools` runs some of them (commas): the dumps are the same from run to run,
so a tool whose code did not change need not be measured again.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import msprobe_qwen3  # noqa: E402

BASELINE_COMMIT = "53b5388"
TOOLS = ("msprobe", "fixed line", "peers' noise")


def _old_compare(work: Path) -> ModuleType:
    """git 53b5388's compare module, loaded beside this tree's (its imports resolve to this tree)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE_COMMIT}:bisect_npu/oracle/dumps/compare.py"],
                            check=True, capture_output=True, text=True).stdout
    path = work / "compare_53b5388.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("compare_53b5388", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def judge_once(tool: str, cand: str, ref: str, work: str) -> None:
    """One judgement in this process: prints {"module": first flagged module or null}."""
    from bisect_npu.oracle.config import LogitsConfig

    if tool == "fixed line":
        compare = _old_compare(Path(work))
        cfg = LogitsConfig(noise_from_peers=False)
    else:
        from bisect_npu.oracle.dumps import compare
        cfg = LogitsConfig()
    first = compare.compare_dumps(cand, ref, cfg).first_divergent
    print(json.dumps({"module": first.module if first is not None else None,
                      "rule": first.rule if first is not None else None}))


def _msprobe_first(out: Path) -> str | None:
    for path in sorted(out.glob("compare_result_*.csv")):
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row["Result"].strip().lower() in ("error", "warning"):
                    return row["NPU Name"]
    return None


def run_tool(tool: str, cand: Path, ref: Path, work: Path, msprobe: str) -> tuple[str | None, float, int]:
    """(first flagged module or tensor, seconds, peak RSS bytes) of one tool on one pair."""
    out = work / f"msprobe-out-{time.monotonic_ns()}"
    if tool == "msprobe":
        command = [msprobe, "compare", "-tp", str(cand), "-gp", str(ref), "-o", str(out)]
    else:
        command = [sys.executable, __file__, "--judge-once", tool, str(cand), str(ref), str(work)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stdout = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"{tool} failed on {cand} vs {ref} (status {status}); run it by hand to see why")
    flagged = _msprobe_first(out) if tool == "msprobe" else json.loads(stdout.strip().splitlines()[-1])["module"]
    return flagged, seconds, usage.ru_maxrss * 1024


def named(flagged: str | None, pair: msprobe_qwen3.Pair) -> bool:
    return flagged is not None and pair.faulty_module is not None and f".{pair.faulty_module}." in flagged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/dump-noise-bench"))
    parser.add_argument("--split", choices=sorted(msprobe_qwen3.SPLITS), default="report")
    parser.add_argument("--only", default="", help="only the pairs whose name starts with this")
    parser.add_argument("--msprobe", default=str(Path(sys.executable).parent / "msprobe"))
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"which of {', '.join(TOOLS)} (commas)")
    parser.add_argument("--judge-once", nargs=4, metavar=("TOOL", "CAND", "REF", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.judge_once:
        judge_once(*args.judge_once)
        return
    tools = [tool for tool in TOOLS if tool in args.tools.split(",")]
    if not tools:
        raise SystemExit(f"--tools {args.tools!r} names none of: {', '.join(TOOLS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    pairs = [pair for pair in msprobe_qwen3.pairs(args.split) if pair.name.startswith(args.only)]
    subprocess.run([sys.executable, "-m", "tests.helpers.msprobe_qwen3", str(args.work / "dumps"),
                    "--split", args.split, "--only", args.only], check=True, capture_output=True, cwd=ROOT)
    totals = {tool: {"false": 0, "clean": 0, "named": 0, "faults": 0, "seconds": 0.0, "peak": 0} for tool in tools}
    print("| pair | fault at | " + " | ".join(tools) + " |")
    print("|---|---|" + "---|" * len(tools))
    for pair in pairs:
        cand, ref = msprobe_qwen3.make_pair(args.work / "dumps", pair)
        cells = []
        for tool in tools:
            flagged, seconds, peak = run_tool(tool, cand, ref, args.work, args.msprobe)
            total = totals[tool]
            total["seconds"] += seconds
            total["peak"] = max(total["peak"], peak)
            if pair.fault is None:
                total["clean"] += 1
                total["false"] += flagged is not None
                cells.append("clean" if flagged is None else f"FALSE ALARM {flagged.removeprefix('Module.')}")
            else:
                total["faults"] += 1
                total["named"] += named(flagged, pair)
                cells.append(("named" if named(flagged, pair) else "missed: ")
                             + ("" if named(flagged, pair) else (flagged or "nothing").removeprefix("Module.")))
        print(f"| {pair.name} | {pair.faulty_module or '-'} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nSummary ({args.split} split, {len(pairs)} pairs; {date.today()}, {platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}):\n")
    print("| tool | false alarms (clean pairs) | faults named | seconds (all pairs) | peak RSS |")
    print("|---|---|---|---|---|")
    for tool, total in totals.items():
        print(f"| {tool} | {total['false']} of {total['clean']} | {total['named']} of {total['faults']} | "
              f"{total['seconds']:.0f} | {total['peak'] / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
