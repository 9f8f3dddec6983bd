"""Base images through a lab's mirrors: `--base-image-map quay.io=mirror.example/quay.io`.

vllm-ascend's Dockerfiles name `quay.io/ascend/cann:*` in a literal FROM; a lab without quay.io
has it under its own registry. The map rewrites each FROM of the candidate's Dockerfile in the
build context (never in git), so the commit builds as it is, from the mirror. Docker's registry
mirrors cover Docker Hub only; this covers any registry, for any engine.

A plain-HTTP mirror must be known to the engine as insecure: podman's registries.conf
(`[[registry]] location = "host:port"`, `insecure = true`), Docker's `insecure-registries`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bisect_npu.builders.failures import classify_build_failure
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.upstream.dockerfile import parse_dockerfile, substitute_args

_FROM_LINE = re.compile(r"^(?P<head>\s*FROM\s+(?:--\S+\s+)*)(?P<image>\S+)(?P<tail>.*)$", re.IGNORECASE | re.MULTILINE)
_STAGE_NAME = re.compile(r"\bAS\s+(\S+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class BaseImageMap:
    """Image-name prefixes and what replaces them; the longest matching prefix wins."""

    rules: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str], base: Mapping[str, str] | None = None) -> BaseImageMap:
        """`FROM=TO` entries (the command line's) over a recipe's `{FROM: TO}` mapping."""
        rules = dict(base or {})
        for entry in entries:
            prefix, sep, target = entry.partition("=")
            if not sep or not prefix.strip() or not target.strip() or "=" in target:
                raise UsageError(f"--base-image-map {entry!r}: expected PREFIX=MIRROR, e.g. "
                                 "quay.io=mirror.example/quay.io")
            rules[prefix.strip()] = target.strip()
        for prefix, target in rules.items():
            if any(c.isspace() for c in prefix + target):
                raise UsageError(f"base image map {prefix}={target}: names cannot hold spaces")
        return cls(tuple(sorted(((p.rstrip("/"), t.rstrip("/")) for p, t in rules.items()),
                                key=lambda rule: -len(rule[0]))))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def entries(self) -> list[str]:
        """The map as `PREFIX=MIRROR` words (journal header, report, reproduce line)."""
        return [f"{prefix}={target}" for prefix, target in self.rules]

    def apply(self, image: str) -> str:
        """`image` through the map: a prefix matches whole name components (`quay.io` matches
        `quay.io/ascend/cann:x`, not `quay.io.example/...`), Docker Hub's short names included."""
        candidates = [image]
        first = image.split("/", 1)[0]
        if "/" not in image or not ("." in first or ":" in first or first == "localhost"):
            candidates.append("docker.io/" + (image if "/" in image else "library/" + image))
        for prefix, target in self.rules:
            for name in candidates:
                if name == prefix or (name.startswith(prefix) and name[len(prefix)] in "/:@"):
                    return target + name[len(prefix):]
        return image

    def rewrite_dockerfile(self, text: str, build_args: Mapping[str, str] | None = None) -> str:
        """The Dockerfile with each FROM's image through the map, its ARG variables resolved as
        the build would (defaults, then `build_args`); a FROM naming an earlier stage is kept."""
        if not self.rules:
            return text
        args = {**parse_dockerfile(text).args, **dict(build_args or {})}
        stages: set[str] = set()

        def rewrite(match: re.Match[str]) -> str:
            image = match.group("image")
            stage = _STAGE_NAME.search(match.group("tail"))
            resolved = substitute_args(image, args)
            mapped = resolved if resolved in stages or resolved == "scratch" else self.apply(resolved)
            if stage:
                stages.add(stage.group(1))
            return match.group("head") + (mapped if mapped != resolved else image) + match.group("tail")

        return _FROM_LINE.sub(rewrite, text)


def pull_image(client: Any, image: str) -> str:
    """Pull `image` through the engine (its own registry configuration: credentials, insecure
    mirrors); the image id, or an InfrastructureError naming the registry and the next step."""
    import docker.errors
    import requests


    repository, tag = split_reference(image)
    error = ""
    try:
        for chunk in client.api.pull(repository, tag, stream=True, decode=True):
            if "error" in chunk:
                error = str(chunk["error"]).strip()
    except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
        error = str(getattr(exc, "explanation", None) or exc)
    if not error:
        try:
            return str(client.api.inspect_image(image)["Id"])
        except docker.errors.ImageNotFound:
            error = f"the engine reported no error but holds no {image}"
    failure = classify_build_failure(error, f"STEP 1/1: FROM {image}\n")
    if failure is not None:
        raise failure.error()
    raise InfrastructureError(f"pulling {image} failed: {error}; check the registry and the engine's registry "
                              "configuration")


def split_reference(image: str) -> tuple[str, str | None]:
    """`repo/name:tag` -> (`repo/name`, `tag`); a digest stays in the name; no tag -> `latest`."""
    if "@" in image:
        return image, None
    name, sep, tag = image.rpartition(":")
    if sep and "/" not in tag:
        return name, tag
    return image, "latest"
