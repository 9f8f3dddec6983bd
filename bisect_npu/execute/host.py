"""Which Atlas host this is, from `npu-smi info`: the image variant its candidates need, how many
dies an engine can have, and how slots may split them.

vllm-ascend builds its kernels per chip: an A2 image (910B) fails on an A3 (Ascend910 9391, two
dies per NPU), and 310P runs float16 only. The table `npu-smi info` prints names each NPU and,
on the second line of each entry, its chip and the device number `/dev/davinciN` and
ASCEND_RT_VISIBLE_DEVICES use (the Phy-ID column on A3, Device on 310P, the NPU itself on A2).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Literal

from bisect_npu.errors import UsageError
from bisect_npu.recipe.schema import Recipe

NPU_SMI = "/usr/local/bin/npu-smi"
HostKind = Literal["A2", "A3", "310P"]
DOCKERFILES: dict[str, str] = {"A2": "Dockerfile", "A3": "Dockerfile.a3", "310P": "Dockerfile.310p"}
PRODUCTS: dict[str, str] = {"A2": "Atlas A2 (800I A2, 910B)", "A3": "Atlas A3 (800 A3, 910_93: two dies per NPU)",
                            "310P": "Atlas 300I (310P)"}
DTYPES: dict[str, str] = {"310P": "float16"}  # vllm-ascend's quick start: Atlas 300I Duo uses float16
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d$")


@dataclass(frozen=True)
class Die:
    """One chip as the runtime sees it: `device` is its /dev/davinciN."""

    npu: int
    chip: int
    device: int
    name: str


@dataclass(frozen=True)
class NpuHost:
    kind: HostKind | None  # None: a chip this tool does not know
    dies: tuple[Die, ...]

    @property
    def devices(self) -> list[int]:
        return sorted(die.device for die in self.dies)

    @property
    def dockerfile(self) -> str:
        return DOCKERFILES.get(self.kind or "", "Dockerfile")

    @property
    def dtype(self) -> str | None:
        """The dtype every engine on this host runs in, where the chip allows only one."""
        return DTYPES.get(self.kind or "")

    @property
    def die_unit(self) -> int:
        """Dies a slot takes at a time: an A3 NPU's two dies stay together."""
        return 2 if self.kind == "A3" else 1

    def pairs(self) -> list[tuple[int, ...]]:
        """The devices of each NPU, in NPU order."""
        by_npu: dict[int, list[int]] = {}
        for die in self.dies:
            by_npu.setdefault(die.npu, []).append(die.device)
        return [tuple(sorted(devices)) for _, devices in sorted(by_npu.items())]

    def describe(self) -> str:
        names = ", ".join(sorted({die.name for die in self.dies}))
        product = PRODUCTS.get(self.kind or "", "an NPU this tool does not know")
        return (f"{product}: {len(self.dies)} dies on {len(self.pairs())} NPUs ({names}); images from "
                f"{self.dockerfile}" + (f"; engines run in {self.dtype}" if self.dtype else ""))


def parse_npu_smi_info(text: str) -> NpuHost:
    """The NPUs and dies of `npu-smi info`'s table (the process table after it is ignored)."""
    dies: list[Die] = []
    npu: int | None = None
    name = ""
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if any(cell.startswith("Process id") for cell in cells):
            break  # the process table: its NPU column is not an inventory
        words = cells[0].split()
        if len(cells) < 2 or not words or not words[0].isdigit():
            continue
        if _BUS_ID.match(cells[1]):  # the chip line of an entry
            if npu is None:
                continue
            chip = int(words[0])
            device = int(words[1]) if len(words) > 1 and words[1].isdigit() else npu
            dies.append(Die(npu, chip, device, name))
        elif len(words) >= 2:  # the NPU line: id and name
            npu, name = int(words[0]), words[1]
    if not dies:
        raise UsageError("npu-smi info lists no NPU (no table rows with a bus id); check the driver with "
                         "`npu-smi info`")
    return NpuHost(_kind(dies), tuple(dies))


def _kind(dies: list[Die]) -> HostKind | None:
    names = {die.name.lower() for die in dies}
    if all(n.startswith("310p") for n in names):
        return "310P"
    if all(n.startswith("910b") for n in names):
        return "A2"
    if names == {"ascend910"}:  # A3 reports the family name, one entry per die, two dies per NPU
        return "A3"
    return None


def detect_host(npu_smi: str | None = None, timeout_s: float = 30.0) -> NpuHost | None:
    """This host's NPUs, or None where npu-smi is missing or fails (a CPU-only host)."""
    try:
        done = subprocess.run([npu_smi or NPU_SMI, "info"], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return parse_npu_smi_info(done.stdout)
    except UsageError:
        return None


def check_devices_on_host(host: NpuHost, devices: list[int], cards_per_run: int) -> int:
    """The dies one slot takes (the engine's, rounded up to whole A3 NPUs); refuse devices the
    host lacks, an engine larger than the host, and --devices that split an A3 NPU."""
    if cards_per_run > len(host.dies):
        raise UsageError(f"the recipe's engine needs {cards_per_run} dies (its parallel sizes multiplied) but this "
                         f"host has {len(host.dies)}: {host.describe()}; run it on a host with enough dies "
                         "(an Atlas 800 A3 has 16)")
    missing = sorted(set(devices) - set(host.devices))
    if missing:
        raise UsageError(f"--devices {','.join(map(str, missing))}: this host has devices "
                         f"{','.join(map(str, host.devices))} ({host.describe()})")
    if host.die_unit > 1:
        split = [pair for pair in host.pairs() if 0 < len(set(pair) & set(devices)) < len(pair)]
        if split:
            halves = ", ".join("+".join(map(str, pair)) for pair in split)
            raise UsageError(f"--devices takes one die of the A3 NPU(s) {halves}; an A3 NPU's two dies go "
                             "together: give both")
    unit = host.die_unit
    return -(-cards_per_run // unit) * unit


def check_slot_shares(host: NpuHost, devices: list[int], slots: int) -> None:
    """Each slot's share of --devices (consecutive, as execute/devices.py deals them) must hold
    whole A3 NPUs: one die of a pair in each of two slots would break both engines."""
    if host.die_unit == 1 or not devices:
        return
    size = len(devices) // slots
    ordered = sorted(devices)
    npu_of = {die.device: die.npu for die in host.dies}
    shares = [ordered[slot * size:(slot + 1) * size] for slot in range(slots)]
    owners = [{npu_of[device] for device in share} for share in shares]
    if any(a & b for index, a in enumerate(owners) for b in owners[index + 1:]) or size % host.die_unit:
        fitting = [n for n in range(1, len(devices) // host.die_unit + 1)
                   if (len(devices) // n) % host.die_unit == 0]
        raise UsageError(f"--slots {slots} over {len(devices)} A3 dies gives {size} per slot and splits an NPU's "
                         f"two dies between slots; use --slots {' or '.join(map(str, fitting[-3:]))}")


def host_changes(recipe: Recipe, kind: str | None) -> dict[str, str]:
    """The recipe fields a host of `kind` changes, by their path (`model.dtype`: float16 on 310P),
    with their new values: what the journal header keeps so the report can say so."""
    changes: dict[str, str] = {}
    if kind is None:
        return changes
    if ("dockerfile" not in recipe.build.model_fields_set and kind in DOCKERFILES
            and recipe.build.dockerfile != DOCKERFILES[kind]):
        changes["build.dockerfile"] = DOCKERFILES[kind]
    if kind in DTYPES and recipe.model.dtype != DTYPES[kind]:
        changes["model.dtype"] = DTYPES[kind]
    return changes


def recipe_for_host(recipe: Recipe, kind: str | None) -> Recipe:
    """The recipe as it runs on a host of `kind`: the host's Dockerfile variant unless the recipe
    names one, and the one dtype the chip runs (310P: float16)."""
    changes = host_changes(recipe, kind)
    update: dict[str, object] = {}
    if "build.dockerfile" in changes:
        update["build"] = recipe.build.model_copy(update={"dockerfile": changes["build.dockerfile"]})
    if "model.dtype" in changes:
        update["model"] = recipe.model.model_copy(update={"dtype": changes["model.dtype"]})
    return recipe.model_copy(update=update) if update else recipe
