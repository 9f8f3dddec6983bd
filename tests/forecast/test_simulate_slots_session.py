"""`simulate --slots` forecasts what a session with several slots spends: a real `run --slots 2` of a
nightly throughput case on a made history (tests/helpers/nightly_server.py, slow where the commit
is bad), against the forecast of the same search at the drop and the spread the session measured."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bisect_npu.forecast.simulate import Throughput, simulate
from bisect_npu.observations import Observation
from bisect_npu.oracle.sequential import pooled_spread
from bisect_npu.oracle.throughput import sample_of
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import HELPERS

CASE_PATH = "tests/e2e/nightly/single_node/models/configs/Speed-A2.yaml"
THRESHOLD = 0.3  # the bad side runs at about 1/8 of the good side's speed; a loaded host slows the good side less


def _case_file() -> str:
    return f"""\
test_cases:
  - name: "speed-a2"
    model: "tiny"
    envs: {{SERVER_PORT: "DEFAULT_PORT"}}
    launcher: ["{{python}}", "{HELPERS / "nightly_server.py"}", "{{model}}"]
    server_cmd: ["--port", "$SERVER_PORT"]
    benchmarks:
      perf:
        case_type: performance
        dataset_path: vllm-ascend/GSM8K-in3500-bs400
        request_conf: vllm_api_stream_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_cot_str_perf
        num_prompts: 8
        max_out_len: 48
        batch_size: 4
        baseline: 800
        threshold: {THRESHOLD}
"""


def _runs_by_commit(session: Path, records: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Every throughput the session measured, commit by commit (as its steps pool the spread)."""
    runs: dict[str, list[float]] = {}
    for record in records:
        if record["type"] == "step":
            for trial in record["trials"]:
                if trial.get("observation"):
                    value = sample_of(Observation.load(session / trial["observation"]))
                    if value is not None:
                        runs.setdefault(record["commit"], []).append(value)
    return runs


@pytest.mark.e2e
@pytest.mark.heavy  # a real two-slot nightly session: 45-90 s
def test_a_forecast_with_two_slots_holds_the_runs_a_two_slot_session_spends(tmp_path: Path) -> None:
    candidates, culprit = 11, 6
    shas = make_linear_repo(tmp_path / "up", candidates + 1, culprit=culprit,
                            files=lambda i: {CASE_PATH: _case_file()} if i == 0 else {})
    session = tmp_path / "session"
    env = {**os.environ, "PYTHONPATH": str(Path.cwd()), "BISECT_NPU_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(tmp_path / "up"), "--good",
                           shas[0], "--bad", "main", "--nightly-case", f"{CASE_PATH}::speed-a2::perf",
                           "--slots", "2", "--no-fix", "--quiet", "--json", "--session", str(session),
                           "--timeout", "120"], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    assert f"first bad commit: {shas[culprit][:12]}" in done.stdout
    records = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    trials = [r["index"] for r in records if r["type"] == "trial"]
    steps = [r for r in records if r["type"] == "step" and r["index"] != 0]
    # Two slots: some round ran two commits' steps at once.
    spans = sorted((r["t"] - r["seconds"], r["t"]) for r in steps)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)), spans

    level = next(r for r in records if r["type"] == "step" and r["index"] == 0)["verdict"]["figures"]["reference_mean"]
    bad = [r["verdict"]["figures"]["throughput_mean"] for r in steps if r["verdict"]["kind"] == "bad"]
    measured = pooled_spread(_runs_by_commit(session, records).values())
    spread = math.sqrt(measured.squares / measured.df) / level
    regression = Throughput(1 - float(np.mean(bad)) / level, spread, threshold=THRESHOLD)
    forecast = simulate(candidates, culprit, bad_rate=1.0, good_rate=0.0, runs=200, seed=0, slots=2,
                        throughput=regression)
    alone = simulate(candidates, culprit, bad_rate=1.0, good_rate=0.0, runs=200, seed=0, throughput=regression)
    # The forecast's stated bound: the session's runs lie within the range of its 200 sessions,
    # at least half their mean and at most their most (their p95 is passed by one in twenty).
    assert forecast.accuracy >= 0.95
    assert forecast.mean_trials / 2 <= len(trials) <= forecast.max_trials, (len(trials), forecast)
    # and it forecasts the slots' own search: fewer rounds than one slot's.
    assert forecast.mean_rounds < alone.mean_rounds
