"""Effective sampling parameters: what the engine applied, against what the case expects.

A server default that never arrives (`--override-generation-config` dropping presence_penalty)
changes no text at first; only the parameter the engine really used shows it. The probe records
those in `observation.sampling`.
"""

from __future__ import annotations

import math
from typing import Any

from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.oracle.config import PenaltyConfig


def same_value(expected: Any, effective: Any, rel_tolerance: float) -> bool:
    if isinstance(expected, bool) or isinstance(effective, bool):
        return bool(expected == effective)
    if isinstance(expected, int | float) and isinstance(effective, int | float):
        return math.isclose(float(expected), float(effective), rel_tol=rel_tolerance, abs_tol=rel_tolerance)
    return bool(expected == effective)


def judge_penalty(obs: Observation, cfg: PenaltyConfig) -> Verdict:
    if not cfg.expected:
        return Verdict(kind=VerdictKind.SKIP, reason="penalty oracle has no `expected` parameters in the recipe")
    if not obs.sampling:
        return Verdict(kind=VerdictKind.SKIP, reason="observation does not record the effective sampling parameters")
    differing = {name: {"expected": want, "effective": obs.sampling.get(name)}
                 for name, want in cfg.expected.items()
                 if not same_value(want, obs.sampling.get(name), cfg.rel_tolerance)}
    figures: dict[str, Any] = {"expected": dict(cfg.expected),
                               "effective": {k: obs.sampling.get(k) for k in cfg.expected}}
    if differing:
        figures["differing"] = differing
        said = ", ".join(f"{k} {v['effective']!r} (expected {v['expected']!r})" for k, v in differing.items())
        return Verdict(kind=VerdictKind.BAD, figures=figures,
                       reason=f"the engine applied {said}")
    return Verdict(kind=VerdictKind.GOOD, figures=figures,
                   reason="effective sampling parameters match: " +
                          ", ".join(f"{k}={v!r}" for k, v in cfg.expected.items()))
