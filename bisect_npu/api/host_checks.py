"""`doctor`: is this host ready to bisect? One check per thing the chosen executor needs, with
the fix when it is missing; what `bisect-npu doctor` prints.

Only what the executor needs is checked: local (run's default) needs git, and the NPUs only with
`npu=True` (`run --executor local --devices` on a host without containers); docker needs the
engine, its disk and, unless `npu=False`, the NPUs; ray the cluster and each of its nodes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bisect_npu import __version__
from bisect_npu.errors import BisectError
from bisect_npu.execute.ascend import DRIVER_MOUNTS, MANAGEMENT_DEVICES
from bisect_npu.execute.host_devices import HOST_ROOT, host_cards, missing_paths

DRIVER_VERSION_FILE = Path("/usr/local/Ascend/driver/version.info")
NPU_SMI = "/usr/local/bin/npu-smi"
MIN_FREE_BYTES = 50 << 30  # a vllm-ascend image is 10-20 GB; a bisection keeps a few


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    needed: bool = True  # does the chosen executor need it?


def check_git() -> Check:
    path = shutil.which("git")
    if path is None:
        return Check("git", False, "not on PATH", "install git (apt-get install git)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return Check("git", True, version)


def check_engine() -> Check:
    import docker
    import docker.errors

    where = os.environ.get("DOCKER_HOST", "the default docker context")
    try:
        client = docker.from_env(timeout=10)
        version = client.version()
    except (docker.errors.DockerException, OSError) as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        return Check("container engine", False, f"not reachable at {where} ({reason})",
                     "start Docker, or run containers/setup-podman.sh and export the DOCKER_HOST it prints")
    name = next((c.get("Name", "") for c in version.get("Components", []) if c.get("Name")), "engine")
    return Check("container engine", True, f"{name} {version.get('Version', '?')} "
                 f"(API {version.get('ApiVersion', '?')}) at {where}")


def check_npu_devices(root: Path = HOST_ROOT) -> Check:
    """The cards under `root`/dev and the management devices every NPU container is given."""
    cards = host_cards(root)
    missing = missing_paths(MANAGEMENT_DEVICES, root)
    if not cards or missing:
        what = "no /dev/davinciN" if not cards else f"missing {', '.join(missing)}"
        return Check("NPU devices", False, what, "install the Ascend driver (HDK) and check `npu-smi info`")
    return Check("NPU devices", True, f"{len(cards)} card(s): {', '.join(f'davinci{card}' for card in cards)}")


def check_driver_mounts(root: Path = HOST_ROOT) -> Check:
    """The driver's files an NPU container mounts (the same list `run --devices` checks)."""
    missing = missing_paths(DRIVER_MOUNTS, root)
    if missing:
        return Check("driver mounts", False, f"missing {', '.join(missing)}",
                     "install the Ascend driver (HDK); NPU containers mount these read-only")
    return Check("driver mounts", True, f"{len(DRIVER_MOUNTS)} path(s) present")


def check_npu_smi(path: str = NPU_SMI) -> Check:
    if not os.access(path, os.X_OK):
        return Check("npu-smi", False, f"{path} not found", "install the Ascend driver; it ships npu-smi")
    return Check("npu-smi", True, path)


def check_host(npu_smi: str = NPU_SMI) -> Check:
    from bisect_npu.execute.host import detect_host

    host = detect_host(npu_smi)
    if host is None:
        return Check("NPU host", False, "npu-smi info lists no NPU", "install the Ascend driver; check `npu-smi info`")
    if host.kind is None:
        return Check("NPU host", False, host.describe(), "set build.dockerfile in the recipe to the image variant "
                     "for this chip")
    return Check("NPU host", True, host.describe())


def check_driver_version(path: Path = DRIVER_VERSION_FILE) -> Check:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return Check("Ascend driver", False, f"{path} not found",
                     "install the Ascend driver (HDK); containers mount this file")
    version = next((line.split("=", 1)[1].strip() for line in text.splitlines()
                    if line.startswith("Version=")), text.strip().splitlines()[0] if text.strip() else "?")
    return Check("Ascend driver", True, f"version {version}")


def check_disk(path: Path, minimum: int = MIN_FREE_BYTES) -> Check:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    detail = f"{free / (1 << 30):.1f} GiB free at {probe}"
    if free < minimum:
        return Check("disk", False, detail, f"free at least {minimum >> 30} GiB for the image cache, "
                     "or lower --cache-size")
    return Check("disk", True, detail)


def engine_storage() -> Path:
    """Where images land: podman's or Docker's default storage root on this host."""
    for candidate in ("/var/lib/containers/storage", "/var/lib/docker"):
        if Path(candidate).exists():
            return Path(candidate)
    return Path.home()


def run_checks(executor: str, npu: bool | None = None) -> list[Check]:
    """The checks `executor` needs, nothing else: the NPUs for docker unless `npu` is False, for
    local only when it is True."""
    checks = [check_git()]
    if executor == "docker":
        checks.append(check_engine())
    if npu if npu is not None else executor == "docker":
        checks += [check_npu_devices(), check_npu_smi(), check_host()]
        if executor == "docker":  # what the containers mount; CANN on the host finds its own
            checks += [check_driver_mounts(), check_driver_version()]
    if executor == "docker":
        checks.append(check_disk(engine_storage()))
    return checks


def ray_checks(address: str | None) -> list[Check]:
    """`--executor ray`: the cluster, then per node its NPUs, the engines of each bundled recipe
    it holds and its container engine (asked on the node)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return [Check("ray", False, "not installed", "pip install 'bisect-npu[ray]' here and on every node")]
    from bisect_npu.execute.ray import START_CLUSTER, cluster_nodes, connect, node_engines, node_versions
    from bisect_npu.recipe.loader import bundled_recipes, load_recipe

    try:
        connect(address)
    except BisectError as exc:  # an address nothing answers on, or not an address: the run's words
        return [Check("ray cluster", False, str(exc).removesuffix(f"; {START_CLUSTER}"), START_CLUSTER)]
    except Exception as exc:  # Ray's own errors for an address with no cluster behind it
        return [Check("ray cluster", False, f"not reachable ({str(exc).splitlines()[0][:150]})", START_CLUSTER)]
    nodes = cluster_nodes(1)
    with_npus = [node for node in nodes if node.npus]
    checks = [Check("ray cluster", bool(with_npus), f"{len(nodes)} node(s), {sum(n.npus for n in nodes)} NPU(s)",
                    "start each Ascend host's node where it sees its cards (`ray start ... --resources "
                    "'{\"NPU\": 8}'` where Ray cannot count them)")]
    sizes = {name: load_recipe(text).cards_per_run() for name, text in bundled_recipes().items()}
    engines = node_engines()
    for node in nodes:
        per_recipe = ", ".join(f"{name} {node.npus // size}" for name, size in sorted(sizes.items()))
        checks.append(Check(f"node {node.node_id[:12]} ({node.address})", True,
                            f"{node.npus} NPU(s); engines per recipe: {per_recipe}", needed=False))
        engine = engines.get(node.node_id, "unknown")
        checks.append(Check(f"node {node.node_id[:12]} container engine", not engine.startswith(("none", "unknown")),
                            engine, "run containers/setup-podman.sh on that host (or start Docker) for container "
                            "builds there", needed=False))
    return [*checks, *version_checks(node_versions())]


def version_checks(versions: dict[str, str], driver: str = __version__) -> list[Check]:
    """One row a node: its bisect-npu version. Another one than the driver's (or none) is missing,
    with the words of the run's refusal (exit 5); a node that did not answer is not needed, as
    the run leaves it to its batches."""
    from bisect_npu.execute.ray import VERSION_RISK, other_versions, version_next_step

    odd = other_versions(versions, driver)
    return [Check(f"node {node[:12]} bisect-npu", node not in odd and not version.startswith("unknown"),
                  f"{version}, this driver {driver}: {VERSION_RISK}" if node in odd else version,
                  version_next_step(driver) if node in odd else "check that the node is alive (`ray status`)",
                  needed=not version.startswith("unknown"))
            for node, version in sorted(versions.items())]


def unit_test_venv_checks(prune_days: float | None = None) -> list[Check]:
    """`run --unit-test`'s venvs, one per vLLM pin (builders/pin_venv.py), with their sizes and last
    use; with `prune_days`, those unused for longer go first. Informational: none is needed."""
    import time

    from bisect_npu.builders.pin_venv import PinVenvs, default_pin_venv_cache

    venvs = PinVenvs(default_pin_venv_cache())
    checks = []
    if prune_days is not None:
        gone = venvs.prune(prune_days * 86400)
        freed = sum(v.bytes for v in gone) / (1 << 30)
        checks.append(Check("unit-test venvs pruned", True, f"{len(gone)} unused for over {prune_days:g} days, "
                            f"{freed:.1f} GiB freed", needed=False))
    now = time.time()
    for venv in venvs.listing():
        state = "" if venv.complete else ", unfinished build (goes on at its next use)"
        checks.append(Check(f"unit-test venv {venv.name}", True, f"{venv.bytes / (1 << 30):.1f} GiB, last used "
                            f"{(now - venv.last_used) / 86400:.1f} days ago{state} ({venv.path})", needed=False))
    return checks


@dataclass(frozen=True)
class Doctor:
    """The checks made for `executor`, and whether everything it needs is there."""

    executor: str
    checks: list[Check]

    @property
    def failed(self) -> list[str]:
        """The names of the checks the executor needs that did not pass."""
        return [check.name for check in self.checks if check.needed and not check.ok]

    @property
    def ready(self) -> bool:
        return not self.failed


def doctor(executor: Literal["local", "docker", "ray"] = "local", *, npu: bool | None = None,
           ray_address: str | None = None, prune_days: float | None = None) -> Doctor:
    """Check what `executor` needs on this host (`npu`: the NPUs too, see `run_checks`;
    `ray_address`: the cluster for ray), then list the `run --unit-test` venvs, pruning those
    unused for `prune_days` days first."""
    checks = [check_git(), *ray_checks(ray_address)] if executor == "ray" else run_checks(executor, npu)
    return Doctor(executor, [*checks, *unit_test_venv_checks(prune_days)])
