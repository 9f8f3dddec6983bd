"""One prune brings the cache under its size where only the engine's order of removal stood in the
way: a full image refused while an overlay stood on it goes in the same prune, once that overlay
went. Docker's daemon refuses such a removal (409, "image has dependent child images"); podman, the
engine here, removes the parent's record at once, so the refusal is a named stand-in."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors

from bisect_npu.builders.base import LABEL_KIND, LABEL_PARENT
from bisect_npu.builders.cache import ImageCache

BASE = "localhost/base:1"
GB = 1 << 30


class DockerDaemonRefusingParentsStub:
    """The engine API as Docker's daemon answers it: an image with a child image is not removed."""

    def __init__(self, images: list[dict[str, Any]]) -> None:
        self.rows = images

    def images(self, filters: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return [dict(row) for row in self.rows]

    def containers(self, all: bool = False) -> list[dict[str, Any]]:
        return []

    def inspect_image(self, reference: str) -> dict[str, Any]:
        return {"Size": 10 * GB} if reference == BASE else next(r for r in self.rows if r["Id"] == reference)

    def remove_image(self, image: str) -> None:
        if any((row.get("Labels") or {}).get(LABEL_PARENT) == image for row in self.rows):
            raise docker.errors.APIError("409 Client Error: Conflict (conflict: unable to delete "
                                         f"{image[7:19]} (cannot be forced) - image has dependent child images)")
        self.rows = [row for row in self.rows if row["Id"] != image]


def image(image_id: str, kind: str, parent: str, size: int) -> dict[str, Any]:
    return {"Id": image_id, "Size": size, "Created": 0, "RepoTags": [f"bisect-npu/up:{image_id[7:]}"],
            "Labels": {LABEL_KIND: kind, LABEL_PARENT: parent}}


def test_a_full_image_refused_under_its_overlay_goes_in_the_same_prune(tmp_path: Path) -> None:
    full, overlay = "sha256:full", "sha256:overlay"
    api = DockerDaemonRefusingParentsStub([image(full, "full", BASE, 13 * GB), image(overlay, "overlay", full,
                                                                                       13 * GB + 1024)])
    cache = ImageCache(SimpleNamespace(api=api), max_bytes=GB, state_path=tmp_path / "cache.json")
    cache.use(full)  # the least recently used: tried first, refused while its overlay stands
    cache.use(overlay)
    log = io.StringIO()
    assert cache.prune(log) == [overlay, full]
    assert cache.total_bytes() == 0 and log.getvalue() == ""


def test_what_cannot_go_is_said_once_and_the_rest_still_goes(tmp_path: Path) -> None:
    full, overlay, other = "sha256:full", "sha256:overlay", "sha256:other"
    api = DockerDaemonRefusingParentsStub([image(full, "full", BASE, 13 * GB),
                                           image(overlay, "overlay", full, 13 * GB + 1024),
                                           image(other, "full", BASE, 12 * GB)])
    cache = ImageCache(SimpleNamespace(api=api), max_bytes=0, state_path=tmp_path / "cache.json")
    for image_id in (full, overlay, other):
        cache.use(image_id)
    cache.use(overlay, pin=True)  # this session runs it: its full image must stay under it
    log = io.StringIO()
    assert cache.prune(log) == [other]
    assert log.getvalue().count("kept sha256:full over the budget: the engine refused") == 1
