"""`make test-vllm-ascend-ut`: `run --unit-test` on a real vllm-ascend clone, against breakage pairs
mined from its history (tests/helpers/vllm_ascend_ut.py; the pairs are in tests/data/vllm_ascend_ut_pairs.json,
ids and node ids only).

Each pair is bisected with `bisect-npu run` over the range it was mined on: the culprit must be
the ground truth, and the steps stand beside `git bisect run`'s on the same range (counted when
the pair was mined), with seconds per step (the pin's venv cached) and the repair's rank among the
fix proposals. The train pairs were the ones looked at while the oracle was tuned; the eval pairs
were not. Hand-run like the other real tiers: BISECT_NPU_VLLM_ASCEND=CLONE (a full clone of
vllm-ascend), disk for the venvs in ~/.cache/bisect-npu/unit-test-venvs (the shared torch layer,
4.6 GiB, and ~1.6 GiB per vLLM pin).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import DATA

CLONE = os.environ.get("BISECT_NPU_VLLM_ASCEND")
PAIRS = DATA / "vllm_ascend_ut_pairs.json"
RESULTS = Path(os.environ.get("BISECT_NPU_UT_RESULTS", "/tmp/bisect-npu-vllm-ascend-ut-results.jsonl"))
ONLY = os.environ.get("BISECT_NPU_UT_SPLIT")  # "train" or "eval": only that split

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CLONE, reason="set BISECT_NPU_VLLM_ASCEND to a vllm-ascend clone")]


def pairs() -> list[dict[str, object]]:
    if not PAIRS.exists():
        return []
    return [p for p in json.loads(PAIRS.read_text()) if ONLY is None or p["split"] == ONLY]


def bisect(tmp_path: Path, *args: str) -> tuple[dict[str, object], Path, str]:
    session = tmp_path / "session"
    proc = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(CLONE), *args, "--session",
                           str(session), "--no-verdict-store", "--json", "--quiet"],
                          capture_output=True, text=True, check=False, timeout=7200)
    lines = proc.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return summary, session, proc.stdout[-3000:] + proc.stderr[-3000:]


def step_seconds(session: Path) -> list[float]:
    """Seconds of each step's test run (the venv was cached: no build in them)."""
    seconds = []
    for line in (session / "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "trial" and record.get("seconds") is not None:
            seconds.append(float(record["seconds"]))
    return seconds


def repair_rank(session: Path, repair: str) -> int | None:
    """Where the repair stands among the culprit's fix proposals (1 = first; None: not among them)."""
    for line in (session / "journal.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "fix":
            for rank, proposal in enumerate(record["report"]["proposals"], 1):
                if any(str(sha).startswith(repair[:12]) for sha in proposal["shas"]):
                    return rank
    return None


@pytest.mark.parametrize("pair", pairs(), ids=lambda p: f"{p['split']}-{str(p['culprit'])[:10]}")
def test_run_finds_the_mined_culprit(pair: dict[str, object], tmp_path: Path) -> None:
    summary, session, output = bisect(tmp_path, "--good", str(pair["good"]), "--bad", str(pair["bad"]),
                                      "--unit-test", str(pair["node_id"]))
    seconds = step_seconds(session) if (session / "journal.jsonl").exists() else []
    result = {"culprit": pair["culprit"], "split": pair["split"], "node_id": pair["node_id"],
              "found": summary.get("culprit"), "steps": summary.get("steps"),
              "git_bisect_steps": pair["git_bisect_steps"],
              "seconds_per_step": round(sum(seconds) / len(seconds), 1) if seconds else None,
              "repair": pair["repair"], "repair_rank": repair_rank(session, str(pair["repair"]))
              if (session / "journal.jsonl").exists() else None}
    with RESULTS.open("a") as out:
        out.write(json.dumps(result) + "\n")
    print(json.dumps(result))
    assert summary.get("culprit") == pair["culprit"], output


def test_refuses_a_test_that_needs_an_npu(tmp_path: Path) -> None:
    summary, _, output = bisect(tmp_path, "--good", "HEAD~3", "--bad", "HEAD", "--unit-test",
                                "tests/ut/ops/a2/test_anything.py")
    assert "need NPU cards" in output and summary.get("exit_code") == 2 and not summary.get("culprit")


def test_refuses_a_node_id_that_matches_nothing_at_either_end(tmp_path: Path) -> None:
    summary, _, output = bisect(tmp_path, "--good", "HEAD~3", "--bad", "HEAD", "--unit-test",
                                "tests/ut/no_such_dir/test_nothing.py::test_x")
    assert "exists at neither the good end" in output and summary.get("exit_code") == 2


@pytest.mark.ray
def test_one_pair_over_a_three_node_ray_cluster(tmp_path: Path) -> None:
    """The first train pair through `--executor ray` on a three-node cluster made here (one CPU
    each): every run a task on some node, the worktree made there and the pin venv taken from
    that node's cache (one host here, so one cache); the culprit is the pair's."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    pair = next(p for p in pairs() if p["split"] == "train")
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                         "resources": {"NPU": 1}})
    try:
        for _ in range(2):
            made.add_node(num_cpus=1, resources={"NPU": 1})
        made.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = made.address
        summary, session, output = bisect(tmp_path, "--good", str(pair["good"]), "--bad", str(pair["bad"]),
                                          "--unit-test", str(pair["node_id"]), "--executor", "ray", "--no-fix")
    finally:
        os.environ.pop("RAY_ADDRESS", None)
        ray.shutdown()
        made.shutdown()
    assert summary.get("culprit") == pair["culprit"], output
    logs = [p.read_text().splitlines()[0] for p in session.rglob("command-t*.log")]
    assert logs and all(line.startswith("# ray node ") for line in logs)
    print(json.dumps({"ray_nodes": sorted({line.split()[3] for line in logs}), "steps": summary.get("steps")}))
