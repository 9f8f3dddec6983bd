"""Parallel slots on one host's NPUs: each running candidate leases its own share of --devices,
whether it runs in a container (its /dev/davinciN) or as a local process (ASCEND_RT_VISIBLE_DEVICES)."""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Iterator

from bisect_npu.errors import UsageError

VISIBLE_DEVICES_ENV = "ASCEND_RT_VISIBLE_DEVICES"  # the CANN runtime's CUDA_VISIBLE_DEVICES


def device_pool(devices: list[int], slots: int | None) -> DevicePool | None:
    """The pool that shares --devices among `slots` runs; None when one run has them all."""
    return DevicePool(list(devices), slots) if devices and slots and slots > 1 else None


class DevicePool:
    """`--devices 0-7 --slots 4` gives each running candidate its own two cards, leased for the
    length of one run."""

    def __init__(self, devices: list[int], slots: int) -> None:
        if not 1 <= slots <= len(devices):
            raise UsageError(f"--slots {slots} needs at least as many --devices (got {len(devices)}); "
                             "give one card or more per slot")
        size = len(devices) // slots
        self._free: queue.Queue[list[int]] = queue.Queue()
        for slot in range(slots):
            self._free.put(devices[slot * size:(slot + 1) * size])

    @contextlib.contextmanager
    def lease(self) -> Iterator[list[int]]:
        cards = self._free.get()
        try:
            yield cards
        finally:
            self._free.put(cards)
