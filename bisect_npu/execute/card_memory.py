"""Whether the NPU cards' memory is free before an engine starts on them.

The engine a previous run started may still hold its card's memory for a while after its process
exited; an engine started then fails for a reason that says nothing about the commit. vllm-ascend's
own e2e tests wait for the memory between tests; the evaluator waits the same way before each
probe run, a bounded wait: past it the run starts anyway, and a start that fails is retried.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

# A used/total pair of one chip's HBM in `npu-smi info`'s table: "| 0 | 0000:C1:00.0 | 0  0 / 0  3384 / 65536 |".
_CHIP_ROW = re.compile(r"^\|\s*\d+\s+\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*\|(?P<rest>.*)\|\s*$")
_USED_TOTAL = re.compile(r"(\d+)\s*/\s*(\d+)")
_SMI_TIMEOUT_S = 30.0


class CardMemory(Protocol):
    """The used share (0..1) of each card's memory, in card order."""

    def used_shares(self) -> list[float]: ...


def parse_npu_smi(text: str) -> list[float]:
    """Each chip's used share of its HBM, from `npu-smi info` (the last used/total pair of a chip's row)."""
    shares: list[float] = []
    for line in text.splitlines():
        row = _CHIP_ROW.match(line.strip())
        if row is None:
            continue
        pairs = [(int(used), int(total)) for used, total in _USED_TOTAL.findall(row.group("rest"))]
        if pairs and pairs[-1][1] > 0:
            shares.append(pairs[-1][0] / pairs[-1][1])
    return shares


class NpuSmi:
    """The cards of an Ascend host, as `npu-smi info` shows them."""

    def __init__(self, program: str = "npu-smi") -> None:
        self.program = program

    def used_shares(self) -> list[float]:
        done = subprocess.run([self.program, "info"], capture_output=True, text=True, timeout=_SMI_TIMEOUT_S,
                              check=False)
        return parse_npu_smi(done.stdout) if done.returncode == 0 else []


def host_card_memory() -> CardMemory | None:
    """This host's cards when it has npu-smi; None elsewhere (nothing to wait for)."""
    return NpuSmi() if shutil.which("npu-smi") else None


@dataclass(frozen=True)
class CardWait:
    """Wait until every watched card uses at most `max_used_share` of its memory, for at most `limit_s`."""

    memory: CardMemory
    cards: Sequence[int] | None = None  # None: every card the host shows
    max_used_share: float = 0.1
    limit_s: float = 300.0
    poll_s: float = 2.0

    def wait(self, sleep: Callable[[float], None] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> str:
        """"" once the cards are free; else, when `limit_s` passed, which cards are still held."""
        deadline = clock() + self.limit_s
        while True:
            busy = self._busy()
            if not busy:
                return ""
            if clock() >= deadline:
                return "card memory still held after {:.0f}s: {}".format(
                    self.limit_s, ", ".join(f"card {card} {share:.0%} used" for card, share in busy))
            sleep(self.poll_s)

    def _busy(self) -> list[tuple[int, float]]:
        shares = self.memory.used_shares()
        watched = range(len(shares)) if self.cards is None else [c for c in self.cards if c < len(shares)]
        return [(card, shares[card]) for card in watched if shares[card] > self.max_used_share]
