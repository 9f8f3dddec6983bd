"""What a dependency-level step costs against a full image build, from a finished session that
crossed into a dependency (e.g. `bisect-npu demo --case dependency --executor docker`), and
projected for vllm-ascend with `plan`'s cost model (a full build, an overlay and a run, in
minutes: `bisect-npu plan`'s defaults).

    .venv/bin/python bench/dependency_bench.py SESSION_DIR [--build-min 30 --overlay-min 2 --run-min 5]

SESSION_DIR is the upstream session (the one whose report has a "Dependency level" section).
Without the dependency level, each vLLM commit between two pins would be a full vllm-ascend
image build (the Dockerfile's VLLM_TAG/VLLM_COMMIT is a build input: no two candidates share a
key); with it, the held upstream image is built once and each vLLM commit is one layer.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def _steps(session: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines() if line.strip()]
    return lines[0], [r for r in lines if r.get("type") == "step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("session", type=Path)
    parser.add_argument("--build-min", type=float, default=30.0)
    parser.add_argument("--overlay-min", type=float, default=2.0)
    parser.add_argument("--run-min", type=float, default=5.0)
    args = parser.parse_args()
    _, upstream = _steps(args.session)
    level = next(json.loads(line) for line in (args.session / "journal.jsonl").read_text().splitlines()
                 if '"next_level"' in line)
    header, dependency = _steps(Path(level["session"]))
    built = [s["build"]["seconds"] for s in upstream if s.get("build") and s["build"]["how"] == "built"]
    layers = [s["build"]["seconds"] for s in dependency
              if s.get("build") and s["build"]["how"] in ("overlay", "reused")]
    step_s = [s["seconds"] for s in dependency]
    candidates = len(header["range"]["candidates"])
    full = f"median {statistics.median(built):.2f} s" if built else "none: every image was in the engine already"
    print(f"upstream level: {len(upstream)} steps, full builds {len(built)} ({full})")
    print(f"dependency level: {len(dependency)} steps over {candidates} commits, full builds "
          f"{sum(1 for s in dependency if s.get('build') and s['build']['how'] == 'built')}; laying a tree in: "
          f"median {statistics.median(layers):.2f} s (max {max(layers):.2f}); a whole step median "
          f"{statistics.median(step_s):.2f} s")
    if built:
        print(f"full build / dependency layer: {statistics.median(built) / max(statistics.median(layers), 1e-3):.1f}x")
    print(f"projection for vllm-ascend (build {args.build_min:g} min, overlay {args.overlay_min:g} min, "
          f"run {args.run_min:g} min per step):")
    for n in (50, 200, 800):
        steps = math.ceil(math.log2(n + 1)) + 2  # the search and its two ends
        crossed = args.build_min + steps * (args.overlay_min + args.run_min)  # the held image once, then layers
        rebuilt = steps * (args.build_min + args.run_min)  # every vLLM commit its own image
        print(f"  {n} vLLM commits between the pins: ~{steps} steps, {crossed:.0f} min crossed vs {rebuilt:.0f} min "
              f"with a full build per step ({rebuilt / crossed:.1f}x)")


if __name__ == "__main__":
    main()
