"""Published release images as full builds: vllm-ascend publishes `quay.io/ascend/vllm-ascend:<tag>`
for each release tag, built from that tag's own Dockerfile. Where a candidate's build key equals
the key of a release tag, that image is the full build of the key: pulled (through the lab's
mirror map), checked to be the tag's commit by the commit it records, and labelled as ours. A
bisection between two releases then needs no full build for the keys the releases hold.

The commit an image records: the OCI label `org.opencontainers.image.revision` (docker's
metadata action sets it on vllm-ascend's published images), or bisect-npu's own commit label.
An image without one, or with another commit, is not used.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import git
from packaging.version import InvalidVersion, Version

from bisect_npu.builders.registry import pull_image
from bisect_npu.errors import InfrastructureError, UsageError

OCI_REVISION = "org.opencontainers.image.revision"
VLLM_ASCEND_RELEASES = "quay.io/ascend/vllm-ascend:{tag}"


@dataclass(frozen=True)
class ReleaseImage:
    """One release tag, its commit, and the image published for it (as pulled: through the map)."""

    tag: str
    commit: str
    image: str


def check_template(template: str) -> str:
    """A release-image template names the tag once: `quay.io/ascend/vllm-ascend:{tag}`."""
    if template.count("{tag}") != 1 or re.search(r"\{(?!tag\})", template) or any(c.isspace() for c in template):
        raise UsageError(f"release images {template!r}: expected an image name with {{tag}} once, e.g. "
                         f"{VLLM_ASCEND_RELEASES}")
    return template


def release_tags(repo: git.Repo) -> dict[str, str]:
    """{tag: commit} for the tags that name a release (a PEP 440 version, `v` prefix allowed)."""
    tags: dict[str, str] = {}
    for ref in repo.tags:
        try:
            Version(ref.name)
        except InvalidVersion:
            continue
        try:
            tags[ref.name] = ref.commit.hexsha
        except ValueError:  # a tag of a tree or a blob
            continue
    return tags


class ReleaseImages:
    """Release images by build key, for one repository; keys the release tags once, lazily."""

    def __init__(self, repo: git.Repo, template: str, key_of: Callable[[str], str],
                 image_map: Callable[[str], str] | None = None) -> None:
        self.repo = repo
        self.template = check_template(template)
        self.key_of = key_of
        self.image_map = image_map or (lambda image: image)
        self._by_key: dict[str, list[ReleaseImage]] | None = None
        self._lock = threading.Lock()

    def for_key(self, digest: str) -> list[ReleaseImage]:
        """The releases whose commit has build key `digest`, newest tag name last."""
        with self._lock:
            if self._by_key is None:
                self._by_key = {}
                for tag, commit in sorted(release_tags(self.repo).items(), key=lambda item: Version(item[0])):
                    image = self.image_map(self.template.format(tag=tag))
                    self._by_key.setdefault(self.key_of(commit), []).append(ReleaseImage(tag, commit, image))
            return list(self._by_key.get(digest, []))


def recorded_commit(labels: dict[str, str] | None, own_label: str) -> str:
    """The commit an image says it was built from ('' when it says nothing)."""
    labels = labels or {}
    return labels.get(OCI_REVISION) or labels.get(own_label) or ""


def fetch_release(client: Any, release: ReleaseImage, own_label: str) -> tuple[str | None, str]:
    """Pull `release.image` and check the commit it records: (image id or None, what happened)."""
    import docker.errors


    try:
        image_id = pull_image(client, release.image)
    except InfrastructureError as exc:
        return None, f"release image {release.image} of {release.tag} not used: {exc}"
    try:
        labels = client.api.inspect_image(image_id)["Config"].get("Labels")
    except docker.errors.ImageNotFound:
        return None, f"release image {release.image} of {release.tag} vanished after the pull"
    recorded = recorded_commit(labels, own_label)
    if recorded != release.commit:
        said = f"records commit {recorded}" if recorded else f"records no commit ({OCI_REVISION})"
        return None, (f"release image {release.image} {said}, not {release.tag}'s {release.commit}: "
                      "not used")
    return image_id, f"release image {release.image} is {release.tag} ({release.commit}), verified by its label"
