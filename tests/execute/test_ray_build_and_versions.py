"""`--executor ray`'s shapes, without a cluster: what a batch sends back names each node's build
and image (and its probe log's first line says it), and a node with another bisect-npu version
than the driver's is refused, naming the node, both versions and the next step."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_npu import __version__
from bisect_npu.builders.base import Environment
from bisect_npu.errors import InfrastructureError
from bisect_npu.execute.base import RunResult
from bisect_npu.execute.ray import BatchOutcome, RayExecutor, check_versions, images_said, node_build
from bisect_npu.records import NodeBuild

NODE = "a1b2c3d4e5f6a7b8c9d0" * 2
IMAGE_ID = "sha256:" + "9f" * 32


def test_a_node_with_the_driver_s_version_or_no_answer_is_accepted() -> None:
    check_versions({NODE: __version__, "other": __version__}, {NODE: "10.0.0.2"})
    check_versions({NODE: "unknown (the node did not answer: GetTimeoutError)"}, {})  # left to its batches


@pytest.mark.parametrize("version", ["0.1.3", "none"])
def test_a_node_with_another_version_is_refused_naming_node_versions_and_next_step(version: str) -> None:
    with pytest.raises(InfrastructureError) as refused:
        check_versions({NODE: version, "b" * 40: __version__}, {NODE: "10.0.0.2"}, driver="0.2.0")
    said = str(refused.value)
    assert f"Ray node {NODE[:16]} (10.0.0.2) has bisect-npu {version}, this driver 0.2.0" in said
    assert "b" * 16 not in said  # the node that matches is not named
    assert "pip install 'bisect-npu[ray]==0.2.0'" in said and "`bisect-npu resume` for a session" in said


def test_a_batch_names_its_node_s_build_and_the_image_id_its_container_started_from(tmp_path: Path) -> None:
    env = Environment(kind="image", commit="c" * 40, how="built", seconds=41.5, image="bisect-npu/up:commit-cccc")
    result = RunResult(returncode=0, seconds=3.0, log_path="probe.log", image_id=IMAGE_ID)
    assert node_build(NODE, env, result) == NodeBuild(node=NODE, how="built", seconds=41.5,
                                                      image="bisect-npu/up:commit-cccc", image_id=IMAGE_ID)
    worktree = Environment(kind="worktree", commit="c" * 40, how="reused", path="/w")
    assert node_build(NODE, worktree, result.model_copy(update={"image_id": None})).image is None


def test_a_landed_batch_carries_its_nodes_builds_and_its_log_names_the_image(tmp_path: Path) -> None:
    built = NodeBuild(node=NODE, how="built", seconds=41.5, image="bisect-npu/up:commit-cccc", image_id=IMAGE_ID)
    log = "probe-server-t0.log"
    outcome = BatchOutcome(NODE, [2, 3], RunResult(returncode=0, seconds=3.0, log_path=log, image_id=IMAGE_ID),
                           {log: (b"served\n", 0.0)}, {"how": "built"}, [built])
    landed = RayExecutor._land(RayExecutor.__new__(RayExecutor), outcome, {"case_id": "server", "trial": 0}, tmp_path)
    assert landed.nodes == [built]
    first = (tmp_path / log).read_text().splitlines()[0]
    assert first == f"# ray node {NODE} cards 2,3 build built image bisect-npu/up:commit-cccc (9f9f9f9f9f9f)"
    assert images_said([built.model_copy(update={"image": None, "image_id": None})]) == ""
