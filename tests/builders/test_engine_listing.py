"""Image listings survive podman's race with a concurrent removal (a 500 "image not known"
while another session deletes an image from the shared store); other engine errors do not."""

from __future__ import annotations

from typing import Any

import docker.errors
import pytest

from bisect_npu.builders.cache import list_images


class RacingEngineAPIStub:
    """Stands in for the engine's API: the race cannot be produced on demand with a real engine."""

    def __init__(self, failures: int, message: str = "image not known") -> None:
        self.failures, self.message, self.calls = failures, message, 0

    def images(self, filters: dict[str, str]) -> list[dict[str, Any]]:
        self.calls += 1
        if self.calls <= self.failures:
            raise docker.errors.APIError(f"500 Server Error: Internal Server Error ({self.message})")
        return [{"Id": "sha256:abc", "Labels": filters}]


def test_a_listing_raced_by_a_removal_is_asked_again() -> None:
    api = RacingEngineAPIStub(failures=2)
    assert list_images(api, {"label": "k=v"}) == [{"Id": "sha256:abc", "Labels": {"label": "k=v"}}]
    assert api.calls == 3


def test_a_race_that_does_not_end_is_the_engine_error() -> None:
    api = RacingEngineAPIStub(failures=10)
    with pytest.raises(docker.errors.APIError, match="image not known"):
        list_images(api, {"label": "k=v"}, attempts=3)
    assert api.calls == 3


def test_other_engine_errors_are_not_retried() -> None:
    api = RacingEngineAPIStub(failures=1, message="no such host")
    with pytest.raises(docker.errors.APIError, match="no such host"):
        list_images(api, {"label": "k=v"})
    assert api.calls == 1
