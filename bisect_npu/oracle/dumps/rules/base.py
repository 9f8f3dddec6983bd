"""The shape every dump rule has: a name, what it measures, and a judgement that names its thresholds' source.

Two kinds: a `TensorRule` reads one tensor pair's own metrics (an absolute pass line); a
`ModuleRule` reads a module's output against its baseline (its inputs, or the output before it)
and the pair's noise lines. A rule's thresholds are either measured on the pair (its peers, its
inputs) or set by a named source (a tool's convention, a bench and the split that set them, the
config); each `Finding` says which, so a verdict can be traced to where its line came from.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.noise import PeerLines
from bisect_npu.oracle.dumps.rows import TensorDiff

# Where the peer rules' spread settings were chosen (docs/benchmarks.md has the splits).
PEER_SETTINGS_SOURCE = "bench/dump_noise_bench.py, tune split (Qwen3 seeds 0-1, faults at layers 1 and 4)"


@dataclass(frozen=True)
class Finding:
    """A rule that fired: its name, the problem in words, where its thresholds came from, the noise it met."""

    rule: str
    problem: str
    provenance: str
    noise: dict[str, Any] | None = None


@dataclass(frozen=True)
class Context:
    """What a rule may read beyond the row: the settings and the pair's noise lines (None: not drawn)."""

    cfg: LogitsConfig
    lines: PeerLines | None = None


class TensorRule(ABC):
    """A rule on one tensor pair's own metrics."""

    name: ClassVar[str]
    measures: ClassVar[str]

    @abstractmethod
    def judge(self, row: TensorDiff, ctx: Context) -> Finding | None:
        """The finding when `row` breaks this rule, else None."""


class ModuleRule(ABC):
    """A rule on a module's output against its baseline (`noise.baseline`) and the pair's noise."""

    name: ClassVar[str]
    measures: ClassVar[str]

    @abstractmethod
    def judge(self, row: TensorDiff, base: dict[str, Any], ctx: Context) -> Finding | None:
        """The finding when `row` breaks this rule against `base`, else None."""
