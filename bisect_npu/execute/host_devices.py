"""Are the host files an Ascend container needs here? Asked by `doctor` and by `run` before any
clone or build: a host without `/dev/davinci0` would otherwise build for tens of minutes and then
fail to start the first container.

The paths come from the container spec (execute/ascend.py), so the check and the spec cannot
drift apart. `root` is the filesystem they are looked up under: `/` on a host, a directory of
fake device files in a test.
"""

from __future__ import annotations

import re
from pathlib import Path

from bisect_npu.errors import InfrastructureError
from bisect_npu.execute.ascend import DRIVER_MOUNTS, device_files

HOST_ROOT = Path("/")


def host_cards(root: Path = HOST_ROOT) -> list[int]:
    """The cards whose `/dev/davinciN` exists under `root`, in ascending order."""
    found = (re.fullmatch(r"davinci(\d+)", path.name) for path in (root / "dev").glob("davinci*"))
    return sorted(int(match.group(1)) for match in found if match)


def missing_paths(paths: list[str] | tuple[str, ...], root: Path = HOST_ROOT) -> list[str]:
    """The host paths of `paths` (absolute, as the container spec names them) not under `root`."""
    return [path for path in paths if not (root / path.lstrip("/")).exists()]


def check_host_devices(cards: list[int], root: Path = HOST_ROOT) -> None:
    """Every device file and driver mount the Ascend container spec for `cards` needs exists, or
    an InfrastructureError naming what is missing and `bisect-npu doctor --executor docker`."""
    missing = missing_paths([*device_files(cards), *DRIVER_MOUNTS], root)
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise InfrastructureError(
            f"--devices {','.join(map(str, cards))}: this host lacks {shown}, which the NPU containers need; "
            "`bisect-npu doctor --executor docker` checks the host (install the Ascend driver, pick cards that "
            "exist, or drop --devices to run the containers on the CPU)")
