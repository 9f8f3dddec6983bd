"""A cached image that leaves the engine between the listing that named it and its use (another
session's prune, a removal) is a cache miss the builder builds, logged; an engine that fails on an
image it still has stays an infrastructure error (exit 5). On a real engine, the removal replayed
right after the listing; images with no RUN step, so each build is a fraction of a second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker.errors
import git
import pytest

from bisect_npu.builders.docker import DockerBuilder
from bisect_npu.errors import InfrastructureError

pytestmark = pytest.mark.container


def removed_after_each_listing(client: Any, commit: str) -> None:
    """The engine's next listing naming `commit`'s image, that image then removed (another session's prune
    right then). Only this test's commit's: the engine is shared with other tests and sessions."""
    images = client.api.images

    def listing_then_removal(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        rows = images(*args, **kwargs)
        for row in rows:
            if (row.get("Labels") or {}).get("org.bisect-npu.commit") == commit:
                client.api.remove_image(row["Id"], force=True)
                client.api.images = images  # once: the rebuilt image stays
        return rows

    client.api.images = listing_then_removal


def test_an_image_removed_between_its_listing_and_its_reuse_is_a_miss_that_builds(one_commit_upstream, tmp_path):
    path, commit = one_commit_upstream
    client = docker.from_env(timeout=600)  # its own client: the replay below is this test's alone
    try:
        first = DockerBuilder(git.Repo(path), client).acquire(commit, tmp_path / "first")
        assert first.how == "built"
        removed_after_each_listing(client, commit)
        env = DockerBuilder(git.Repo(path), client).acquire(commit, tmp_path / "later")
    finally:
        client.close()
    assert env.how == "built" and env.image == first.image
    log = Path(env.log_path or "").read_text()
    assert "left the container engine between their listing and their use" in log and "a cache miss" in log


def test_an_engine_failing_on_an_image_it_still_has_is_an_infrastructure_error(one_commit_upstream, tmp_path):
    path, commit = one_commit_upstream
    client = docker.from_env(timeout=600)
    try:
        DockerBuilder(git.Repo(path), client).acquire(commit, tmp_path / "first")

        def refused(*args: Any, **kwargs: Any) -> None:
            raise docker.errors.APIError("500 Server Error: Internal Server Error (storage is read-only)")

        client.api.tag = refused
        with pytest.raises(InfrastructureError, match=r"container engine failed on image .*storage is read-only"):
            DockerBuilder(git.Repo(path), client).acquire(commit, tmp_path / "later")
    finally:
        client.close()
