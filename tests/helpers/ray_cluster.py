"""A real Ray cluster made in the test process, with fake NPU resources per node, shut down
through Ray's API (never `ray stop`, which would kill every Ray process on the machine)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def ray_missing(reason: str) -> None:
    """Fail under CI=true (the Ray tier must run there), skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Ray required in CI: {reason} (make test-ray installs the ray extra)")
    pytest.skip(f"no Ray: {reason}; pip install -e '.[ray]'")


@contextmanager
def local_ray_cluster(head_npus: int, node_npus: tuple[int, ...], prefix: str) -> Iterator[Any]:
    """A head holding `head_npus` NPUs (none when 0) and one node per entry of `node_npus`, this
    process connected to it; RAY_TMPDIR short (Unix socket paths have a length limit) and restored."""
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError as exc:
        ray_missing(str(exc))
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    (tmp / "ray").mkdir()
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(tmp)
    node_args: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 << 20}
    head: dict[str, Any] = {**node_args, "include_dashboard": False}
    if head_npus:
        head["resources"] = {"NPU": head_npus}
    made = Cluster(initialize_head=True, head_node_args=head)
    try:
        for npus in node_npus:
            made.add_node(**node_args, resources={"NPU": npus})
        made.wait_for_nodes()
        ray.init(address=made.address, log_to_driver=False)
        yield made
    finally:
        ray.shutdown()
        made.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(tmp, ignore_errors=True)
