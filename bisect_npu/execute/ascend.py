"""The container an Ascend candidate runs in: NPU devices, driver mounts, determinism switches.

Mirrors the `docker run` that vllm-ascend's quick start documents: one `/dev/davinciN` per card
plus the three management devices, the driver's libraries and tools mounted read-only, never
`--privileged`, docker's default bridge network and no published port.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from bisect_npu.errors import UsageError
from bisect_npu.execute.docker import OUT_DIR, ContainerSpec, Mount

MANAGEMENT_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_MOUNTS = (
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64/",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
)
DETERMINISM_ENV = {
    "LCCL_DETERMINISTIC": "1",
    "HCCL_DETERMINISTIC": "true",
    "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
    "ATB_LLM_LCOC_ENABLE": "0",
}
# Per host type, beside the determinism switches. A3: HCCL expands its collectives on the vector
# cores (AIV), as vllm-ascend's A3 tutorials (DeepSeek-R1, DeepSeek-V3.1) and its tuning guide set it;
# CANN's HCCL_DETERMINISTIC reference says that on A3 with AIV, `true` makes AllReduce and
# ReduceScatter (the two that are not deterministic there) deterministic, so runs stay comparable.
HOST_ENV: dict[str, dict[str, str]] = {"A3": {"HCCL_OP_EXPANSION_MODE": "AIV"}}
DEFAULT_SHM_SIZE = "16g"  # vLLM's workers share tensors through /dev/shm; docker's 64 MB default is too small
MAX_DEVICE = 63
_PART = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_devices(text: str) -> list[int]:
    """`0-7`, `0,1`, `3`, `0-1,4` -> sorted card numbers; anything else is a UsageError."""
    cards: set[int] = set()
    for part in (text or "").split(","):
        match = _PART.match(part.strip())
        if not match:
            raise UsageError(f"--devices {text!r}: expected card numbers such as 0,1 or a range 0-7")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high > MAX_DEVICE:
            raise UsageError(f"--devices {text!r}: range {part.strip()} is empty or beyond card {MAX_DEVICE}")
        cards.update(range(low, high + 1))
    return sorted(cards)


def device_files(cards: list[int]) -> list[str]:
    """The device files a container on `cards` is given: one `/dev/davinciN` per card, then the
    management devices."""
    return [f"/dev/davinci{card}" for card in cards] + list(MANAGEMENT_DEVICES)


def npu_run_env(host: str | None) -> dict[str, str]:
    """What every run on the NPUs gets before the recipe's environment: the determinism switches
    and those of the host type (`host`: A2, A3, 310P or None when unknown)."""
    return {**DETERMINISM_ENV, **HOST_ENV.get(host or "", {})}


def ascend_container_spec(image: str, out_dir: Path, *, devices: list[int], model_dir: Path | None = None,
                          model_path: str | None = None, env: Mapping[str, str] | None = None,
                          shm_size: str = DEFAULT_SHM_SIZE, host: str | None = None,
                          inputs: Sequence[Path] = ()) -> ContainerSpec:
    """The spec for one candidate on the NPUs `devices`.

    `model_dir` (host) is mounted read-only at `model_path` (the recipe's path inside the container;
    the same path when not given); each of `inputs` (an accuracy trial's dataset and configs) at
    its own path, read-only. DETERMINISM_ENV is always set, with the `host` type's HOST_ENV,
    under the recipe's `env` (whose word wins): a token match or a logits diff means nothing when
    collectives reorder sums between runs. The network is docker's default bridge, as in
    vllm-ascend's quick start: HCCL and vLLM look for a host address on a real interface, and a
    loopback-only container is not the setup their multi-card runs are made for (nothing is
    published; the probe talks to a `vllm serve` in the same container over loopback).
    """
    if not devices:
        raise UsageError("no NPU selected; pass --devices, e.g. --devices 0")
    mounts = [Mount(source=path, target=path, read_only=True) for path in DRIVER_MOUNTS]
    if model_dir is not None:
        mounts.append(Mount(source=str(model_dir), target=model_path or str(model_dir), read_only=True))
    mounts += [Mount(source=str(path), target=str(path), read_only=True) for path in inputs]
    mounts.append(Mount(source=str(out_dir), target=OUT_DIR, read_only=False))
    return ContainerSpec(
        image=image,
        devices=device_files(devices),
        mounts=mounts,
        environment={**npu_run_env(host), **(env or {})},
        network_mode="bridge",
        privileged=False,
        shm_size=shm_size,
    )
