"""One engine on two Ray nodes against one node: the demo bisected both ways on one real cluster.

A Ray cluster made in this process (a head without cards, three nodes of one fake NPU each), the
demo upstream's rope-longseq range bisected with `--executor ray` twice: the engine on two nodes
(tests/data/ray/demo-rope-longseq-two-nodes.yaml: the serving rank and a headless one over gloo)
and the same recipe without `engine.nodes` (one server on one node), one slot each, so the only
difference is the engine's span. Prints each run's wall seconds, steps, seconds per step, the
probe's own seconds per trial, and the ratios two-node / one-node.

    .venv/bin/python bench/two_nodes_bench.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "tests" / "data" / "ray" / "demo-rope-longseq-two-nodes.yaml"
CASE = "rope-longseq"


def one_node_recipe(where: Path) -> Path:
    body = yaml.safe_load(RECIPE.read_text())
    del body["engine"]["nodes"]
    body["name"] = "demo-rope-longseq-one-node"
    path = where / "one-node.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def bisect(repo: Path, good: str, bad: str, recipe: Path, session: Path, address: str) -> dict[str, Any]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", good, "--bad",
                           bad, "--recipe", str(recipe), "--session", str(session), "--executor", "ray", "--slots",
                           "1", "--no-fix", "--json"], capture_output=True, text=True, cwd=session.parent,
                          env={**os.environ, "RAY_ADDRESS": address}, timeout=3600)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{recipe.name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    entries = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    trials = [e for e in entries if e["type"] == "trial"]
    return {"culprit": json.loads(done.stdout.strip().splitlines()[-1])["culprit"], "seconds": seconds,
            "steps": sum(e["type"] == "step" for e in entries),
            "trial_seconds": sum(t.get("seconds", 0.0) for t in trials) / max(1, len(trials))}


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    from bisect_npu.demo.generate import generate_upstream

    work = Path(tempfile.mkdtemp(prefix="b2n", dir="/tmp"))
    (work / "ray").mkdir()
    os.environ["RAY_TMPDIR"] = str(work)
    node_args: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    try:
        for _ in range(3):
            cluster.add_node(**node_args, resources={"NPU": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        manifest = generate_upstream(work / "upstream", seed=0)
        truth = manifest.case(CASE)
        runs = {}
        for name, recipe in (("one node", one_node_recipe(work)), ("two nodes", RECIPE)):
            (work / name.replace(" ", "-")).mkdir()
            runs[name] = bisect(work / "upstream", truth.good_ref, truth.bad_ref, recipe,
                                work / name.replace(" ", "-") / "session", cluster.address)
        print(f"{'engine':<10} {'culprit ok':>10} {'steps':>6} {'wall s':>8} {'s/step':>7} {'probe s/trial':>14}")
        for name, run in runs.items():
            print(f"{name:<10} {run['culprit'] == truth.culprit.sha!s:>10} {run['steps']:>6} "
                  f"{run['seconds']:>8.1f} {run['seconds'] / run['steps']:>7.1f} {run['trial_seconds']:>14.1f}")
        one, two = runs["one node"], runs["two nodes"]
        print(f"two / one: wall {two['seconds'] / one['seconds']:.2f}, per step "
              f"{(two['seconds'] / two['steps']) / (one['seconds'] / one['steps']):.2f}, probe per trial "
              f"{two['trial_seconds'] / one['trial_seconds']:.2f}")
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
