"""`align`'s Markdown draws each layer's error against its noise line: a reader sees where the drift enters."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from bisect_npu.alignment.align import align_records
from bisect_npu.alignment.record import read_record
from tests.helpers.records import make_record


def layers(seed: int, broken: int | None = None) -> list[tuple[str, np.ndarray]]:
    """Eight layers' outputs of a residual stack with rounding-sized noise; `broken` adds a 5% error there."""
    rng, noise = np.random.default_rng(0), np.random.default_rng(seed)
    state = rng.standard_normal((1, 16, 64)).astype(np.float32)
    out = []
    for layer in range(8):
        w = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
        y = np.tanh(state @ w) * (1 + 1e-3 * noise.standard_normal(state.shape)).astype(np.float32)
        if layer == broken:
            err = noise.standard_normal(y.shape).astype(np.float32)
            y = y + err * (0.05 * np.linalg.norm(y) / np.linalg.norm(err))
        out.append((f"model.layers.{layer}.mlp", y.astype(np.float32)))
        state = state + y
    return out


def chart(markdown: str) -> tuple[list[int], list[float], list[float]]:
    axis = re.search(r"^    x-axis \[(.*)\]$", markdown, re.M)
    bars = re.search(r"^    bar \[(.*)\]$", markdown, re.M)
    line = re.search(r"^    line \[(.*)\]$", markdown, re.M)
    assert axis and bars and line, markdown
    numbers = [[float(v.strip('"')) for v in found.group(1).split(", ")] for found in (axis, bars, line)]
    return [int(v) for v in numbers[0]], numbers[1], numbers[2]


def test_the_chart_shows_every_layer_under_its_line_and_where_drift_enters(tmp_path: Path) -> None:
    ref = read_record(make_record(tmp_path / "ref", tensors=layers(1)))
    clean = align_records(ref, read_record(make_record(tmp_path / "clean", tensors=layers(2))))
    markdown = clean.to_markdown()
    assert clean.aligned and "```mermaid" in markdown and "no layer above its noise line" in markdown
    axis, bars, line = chart(markdown)
    # Layer 0 has nothing before it to draw a line from (a dump without inputs).
    assert axis == list(range(1, 8)) and all(b <= v for b, v in zip(bars, line, strict=True))

    bad = align_records(ref, read_record(make_record(tmp_path / "bad", tensors=layers(2, broken=5))))
    markdown = bad.to_markdown()
    assert "drift enters at layer 5 (`model.layers.5.mlp`)" in markdown
    axis, bars, line = chart(markdown)
    assert axis[[b > v for b, v in zip(bars, line, strict=True)].index(True)] == 5
