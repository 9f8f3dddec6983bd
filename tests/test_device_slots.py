"""Parallel slots on one Ascend host: each running candidate's container sees only its own cards."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import pytest

from bisect_npu.build.base import Environment
from bisect_npu.execute.ascend import ascend_container_spec
from bisect_npu.execute.docker import DevicePool, DockerExecutor, container_create_kwargs
from bisect_npu.models import UsageError


def cards_of(kwargs: dict) -> list[str]:
    return sorted(d.split(":")[0] for d in kwargs["devices"] if d.split(":")[0].removeprefix("/dev/davinci").isdigit())


def test_pool_splits_devices_into_disjoint_shares() -> None:
    pool = DevicePool(list(range(8)), 4)
    leased: list[list[int]] = []
    barrier = threading.Barrier(4)

    def hold() -> None:
        with pool.lease() as cards:
            leased.append(cards)
            barrier.wait(timeout=5)  # all four slots hold their share at the same time

    threads = [threading.Thread(target=hold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(map(tuple, leased)) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_a_fifth_run_waits_for_a_free_share() -> None:
    pool = DevicePool([0, 1], 2)
    with pool.lease(), pool.lease():
        got: list[list[int]] = []
        waiter = threading.Thread(target=lambda: got.append(pool.lease().__enter__()))
        waiter.start()
        time.sleep(0.2)
        assert got == []  # both shares are busy
    waiter.join(timeout=5)
    assert got and got[0] in ([0], [1])


def test_more_slots_than_cards_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--slots 3"):
        DevicePool([0, 1], 3)


def test_each_container_spec_gets_only_the_leased_cards(tmp_path: Path) -> None:
    """The executor asks the Ascend spec for the slot's cards, not for all of --devices."""
    factory = functools.partial(ascend_container_spec, devices=list(range(8)))
    executor = DockerExecutor(client=None, spec_factory=factory, session_id="t",
                              device_pool=DevicePool(list(range(8)), 4))
    env = Environment(kind="image", commit="a" * 40, image="bisect-npu/x:commit-aaaa")
    with executor.device_pool.lease() as cards:
        spec = executor.spec_for(env, ["true"], tmp_path, cards, {"BISECT_NPU_TRIAL": "3"})
    kwargs = container_create_kwargs(spec)
    assert cards_of(kwargs) == ["/dev/davinci0", "/dev/davinci1"]
    assert kwargs["environment"]["BISECT_NPU_TRIAL"] == "3"
    assert not kwargs.get("privileged")
    whole = container_create_kwargs(executor.spec_for(env, ["true"], tmp_path))
    assert cards_of(whole) == [f"/dev/davinci{i}" for i in range(8)]
