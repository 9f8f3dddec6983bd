"""The image cache's listing: what one prune pays at N of bisect-npu's images on the engine.

A prune (builders/cache.py's `ImageCache.prune`) lists the images that carry our kind label and
reads each one's size against its parent's; it runs after each build or layer, never on a timer.
This bench adds images of ours in steps (a LABEL over the demo base image: no RUN, a fraction of a
second each), times a prune that removes nothing (its budget above all they hold) at each count,
and prints the median seconds and the ratio against the same prune before any was added, in the
same run.

Needs the engine and the demo base image (`make engine`; DOCKER_HOST exported). Every image it
adds carries a label unique to the run and is removed at the end: the engine is shared, nothing
else on it is touched. Usage:
`.venv/bin/python bench/cache_listing_bench.py [--counts 25,50,100,200] [--repeats 5]`.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bisect_npu.builders.base import LABEL_COMMIT, LABEL_KEY, LABEL_KIND, LABEL_PARENT
from bisect_npu.builders.cache import ImageCache, list_images
from bisect_npu.builders.docker import connect_engine

BASE = os.environ.get("BISECT_NPU_DEMO_BASE", "localhost/bisect-npu-demo-base:py311")
RUN_LABEL = "org.bisect-npu.bench"  # this run's images, and only they, are removed at the end


def add_images(client: Any, run: str, start: int, stop: int, base_id: str) -> None:
    """Images `start` .. `stop - 1` of this run: overlays of ours in the labels' eyes, no layer."""
    for index in range(start, stop):
        commit = f"{run}{index:08x}".ljust(40, "0")[:40]
        labels = {LABEL_COMMIT: commit, LABEL_KEY: f"bench-{run}", LABEL_KIND: "overlay", LABEL_PARENT: base_id,
                  RUN_LABEL: run}
        dockerfile = f"FROM {BASE}\nLABEL " + " ".join(f'"{k}"="{v}"' for k, v in labels.items()) + "\n"
        list(client.api.build(fileobj=io.BytesIO(dockerfile.encode()), tag=f"localhost/bisect-npu-bench-{run}:{index}",
                              rm=True, pull=False, decode=True))


def timed_prune(cache: ImageCache, repeats: int) -> tuple[float, float]:
    """Median seconds of a prune that removes nothing, and of its listing alone."""
    prunes, listings = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        list_images(cache.client.api, {"label": LABEL_KIND})
        listings.append(time.perf_counter() - started)
        started = time.perf_counter()
        removed = cache.prune()
        prunes.append(time.perf_counter() - started)
        assert not removed, removed
    return statistics.median(prunes), statistics.median(listings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="25,50,100,200", help="images of ours on the engine at each row")
    parser.add_argument("--repeats", type=int, default=5, help="prunes timed per row (median)")
    args = parser.parse_args()
    counts = sorted({int(c) for c in args.counts.split(",") if c})
    client = connect_engine()
    base_id = client.api.inspect_image(BASE)["Id"]
    run = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="cache-listing-") as scratch:
        cache = ImageCache(client, max_bytes=1 << 60, state_path=Path(scratch) / "image-cache.json")
        try:
            print(f"load average {os.getloadavg()[0]:.1f}; run {run}; median of {args.repeats} prunes per row")
            print("| ours added | ours on the engine | images on the engine | prune | its listing alone "
                  "| prune per image of ours | prune, ratio to none added |")
            print("|---|---|---|---|---|---|---|")
            added, baseline = 0, 0.0
            for count in [0, *counts]:
                add_images(client, run, added, count, base_id)
                added = max(added, count)
                seconds, listing = timed_prune(cache, args.repeats)
                baseline = baseline or seconds
                ours = len(list_images(client.api, {"label": LABEL_KIND}))
                every = len(list_images(client.api))
                each = f"{seconds / ours * 1000:.1f} ms" if ours else "-"
                print(f"| {added} | {ours} | {every} | {seconds:.3f} s | {listing:.3f} s | {each} "
                      f"| {seconds / baseline:.1f}x |", flush=True)
        finally:
            for row in list_images(client.api, {"label": f"{RUN_LABEL}={run}"}):
                client.api.remove_image(row["Id"], force=True)


if __name__ == "__main__":
    main()
