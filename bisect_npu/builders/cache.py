"""ImageCache: keep bisect-npu's images under a size limit, least recently used out first.

Only images with our kind label are ever counted or removed; images the current session still
needs are pinned. Last use is kept in a small JSON file (image id -> epoch seconds), so a later
session knows which images were useful lately. An image's size is what it adds on top of its
parent (the label `org.bisect-npu.parent`): an overlay of a few MB over a 10 GB full image
counts as a few MB.

Sessions share one engine, and pins hold only within one process, so prune also keeps what
another session may need: an image any container (running or only created) was made from, and
an image built or used by someone else within the last `grace_s`. Removal is never forced: the
engine's "in use" refusal means kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from bisect_npu.builders.base import LABEL_KIND, LABEL_PARENT
from bisect_npu.errors import UsageError
from bisect_npu.paths import cache_root

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
GRACE_S = 15 * 60.0  # a prefetched image may wait a whole candidate run before its container starts


def list_images(api: Any, filters: dict[str, str] | None = None, attempts: int = 5) -> list[dict[str, Any]]:
    """The engine's images matching `filters`. Podman answers a listing with 500 "image not known"
    when another process removes an image while it is listed (sessions share one store), so that
    answer is asked again, a few times, before it counts."""
    import docker.errors

    for attempt in range(attempts - 1):
        try:
            return list(api.images(filters=filters))
        except docker.errors.APIError as exc:
            if "image not known" not in str(exc).lower():
                raise
            time.sleep(0.2 * (attempt + 1))
    return list(api.images(filters=filters))


def parse_size(text: str) -> int:
    """Bytes from `--cache-size` text: `200G`, `512MiB`, `1.5t`, `1048576`."""
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"--cache-size {text!r}: give a size such as 200G, 512M or a byte count")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def full_id(image_id: str) -> str:
    """The engine lists `sha256:<hex>`; a commit's answer may give the bare hex."""
    return image_id if ":" in image_id else f"sha256:{image_id}"


def remove_unforced(api: Any, image_id: str, tags: list[str]) -> str | None:
    """Remove an image unless a container (running or only created) was made from it; None when
    removed, else why it was kept. Never forced: a forced removal takes such containers with it.
    The engine removes an image with several tags by id only with force, so the tags go first,
    and only once no container was seen: a run looking its image up by tag must still find it.
    A container made in between still makes the engine refuse, and that refusal means kept too.
    ImageNotFound when the image is gone already."""
    import docker.errors

    users = [row for row in api.containers(all=True) if row.get("ImageID") == image_id]
    if users:
        return f"container {str(users[0].get('Id'))[:12]} was made from it"
    try:
        for tag in tags[:-1]:
            api.remove_image(tag)
        api.remove_image(image_id)
    except docker.errors.ImageNotFound:
        raise
    except docker.errors.APIError as exc:  # in use, or a full image with overlays on it
        return f"the engine refused: {exc.explanation or exc}"
    return None


def default_state_path() -> Path:
    return cache_root() / "image-cache.json"


class ImageCache:
    """LRU pruning of bisect-npu images above `max_bytes`; thread-safe within one process."""

    def __init__(self, client: Any, max_bytes: int, state_path: Path | None = None,
                 grace_s: float = GRACE_S) -> None:
        self.client = client
        self.max_bytes = max_bytes
        self.state_path = state_path or default_state_path()
        self.grace_s = grace_s
        self._pinned: set[str] = set()
        self._used_at: dict[str, float] = {}  # when this process last used an image
        self._foreign_sizes: dict[str, int] = {}
        self._lock = threading.Lock()

    def use(self, image_id: str, pin: bool = False) -> None:
        """Record that `image_id` was used now; `pin` keeps it until `unpin` (this process only)."""
        image_id = full_id(image_id)
        with self._lock:
            state = self._load()
            state[image_id] = self._used_at[image_id] = time.time()
            self._save(state)
            if pin:
                self._pinned.add(image_id)

    def unpin(self, image_id: str) -> None:
        with self._lock:
            self._pinned.discard(full_id(image_id))

    def pinned(self) -> frozenset[str]:
        """The images `prune` leaves alone now (pinned by this process)."""
        with self._lock:
            return frozenset(self._pinned)

    def images(self, rows: list[dict[str, Any]] | None = None) -> list[tuple[str, int, float]]:
        """(id, bytes it adds, last use) of every bisect-npu image in the engine (or in `rows`, a
        listing of them)."""
        if rows is None:
            rows = list_images(self.client.api, {"label": LABEL_KIND})
        sizes = {row["Id"]: int(row.get("Size") or 0) for row in rows}
        state = self._load()
        result = []
        for row in rows:
            parent = (row.get("Labels") or {}).get(LABEL_PARENT, "")
            parent_size = sizes[parent] if parent in sizes else self._size_of(parent)
            own = max(sizes[row["Id"]] - (parent_size or 0), 0)
            result.append((row["Id"], own, state.get(row["Id"], float(row.get("Created") or 0))))
        return result

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self.images())

    def prune(self, log: IO[str] | None = None) -> list[str]:
        """Remove unpinned images, least recently used first, until the total fits; return their ids.
        Each image kept for another session's sake gets a line in `log`. Passes over the one listing
        until one removes nothing: a full image the engine refused while overlays stood on it is
        removable once a later image in the same pass took them away."""
        import docker.errors

        with self._lock:
            listing = list_images(self.client.api, {"label": LABEL_KIND})
            rows = sorted(self.images(listing), key=lambda row: row[2])
            total = sum(size for _, size, _ in rows)
            listed = {row["Id"]: row for row in listing}
            now = time.time()
            removed: list[str] = []
            gone: set[str] = set()  # removed meanwhile by another session: counted no more
            why: dict[str, str] = {}  # the images kept in the last pass, and why
            while total > self.max_bytes:
                why.clear()
                before = len(removed) + len(gone)
                for image_id, size, last_use in rows:
                    if total <= self.max_bytes:
                        break
                    if image_id in self._pinned or image_id in removed or image_id in gone:
                        continue
                    why_kept = self._kept_for_others(image_id, listed[image_id], last_use, now)
                    if why_kept is None:
                        try:
                            why_kept = remove_unforced(self.client.api, image_id,
                                                       listed[image_id].get("RepoTags") or [])
                        except docker.errors.ImageNotFound:
                            gone.add(image_id)
                            total -= size
                            continue
                    if why_kept is not None:
                        why[image_id] = why_kept
                        continue
                    total -= size
                    removed.append(image_id)
                if len(removed) + len(gone) == before:
                    break
            if log is not None:
                for image_id, why_kept in why.items():
                    log.write(f"# cache: kept {image_id} over the budget: {why_kept}\n")
            if removed:
                state = self._load()
                for image_id in removed:
                    state.pop(image_id, None)
                    self._used_at.pop(image_id, None)
                self._save(state)
            return removed

    def _kept_for_others(self, image_id: str, row: dict[str, Any], last_use: float, now: float) -> str | None:
        """Why another session may be about to start a container from the image, or None. What this
        process used last is its own to judge (its pins say so); someone else's recent build or use
        is not."""
        mine = self._used_at.get(image_id)
        touched = [last_use] if mine is None or last_use > mine else []
        if mine is None:
            touched.append(float(row.get("Created") or 0))
        if touched and now - max(touched) < self.grace_s:
            return f"another session built or used it {now - max(touched):.0f} s ago (grace {self.grace_s:.0f} s)"
        return None

    def _size_of(self, reference: str) -> int | None:
        """Size of an image that is not ours (a full image's FROM), looked up once per process."""
        import docker.errors

        if not reference:
            return None
        if reference not in self._foreign_sizes:
            try:
                self._foreign_sizes[reference] = int(self.client.api.inspect_image(reference).get("Size") or 0)
            except docker.errors.APIError:
                return None
        return self._foreign_sizes[reference]

    def _load(self) -> dict[str, float]:
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _save(self, state: dict[str, float]) -> None:
        """Atomic replace: a second session reading the file never sees half of it."""
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.state_path.parent, prefix=".image-cache-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(state, fh)
            os.replace(tmp, self.state_path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
