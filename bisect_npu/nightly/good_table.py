"""The nightly's good table as the good end: `good_table.csv` with the columns `name, yaml/path,
link, status, vLLM Git information, vLLM-Ascend Git information, soc, scene, time`.

Matched as vllm-ascend's `tools/bisect/good_table.py` matches (`lookup_last_good`): `name`
exactly and `yaml/path` by suffix or file name, at least one of them given; `status` success
(or pass/passed/ok); `soc` and `scene` exactly, or a legacy seven-column row (neither filled)
when no nine-column row matches; the newest `time` wins. Nightly and weekly runs keep separate
tables (`.../nightly/good_table.csv`, `.../weekly/good_table.csv`); a table named for one is
refused for the other. When nothing matches, the error names the first dimension that left no row.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Literal

from bisect_npu.errors import UsageError

COLUMNS = ("name", "yaml/path", "link", "status", "vllm git information", "vllm-ascend git information", "soc",
           "scene", "time")
SUCCESS = ("success", "pass", "passed", "ok")
SCENES = ("single_node", "multi_node")
_TIME_FORMATS = ("%Y-%m-%d %H:%M:%S %z", "%Y-%m-%d %H:%M:%S")
Frequency = Literal["nightly", "weekly"]


@dataclass(frozen=True)
class GoodRow:
    name: str
    path: str
    link: str
    status: str
    vllm_commit: str
    vllm_ascend_commit: str
    soc: str
    scene: str
    time: str
    line: int

    @property
    def succeeded(self) -> bool:
        return self.status.strip().lower() in SUCCESS

    @property
    def legacy(self) -> bool:
        return not self.soc and not self.scene


@dataclass(frozen=True)
class Lookup:
    """What the good end is matched on (run's --name, --config-yaml, --soc, --scene)."""

    soc: str
    scene: str
    name: str | None = None
    config_yaml: str | None = None


def _when(row: GoodRow, source: str) -> datetime:
    """A row's time in UTC: the table's own forms or ISO 8601 (`2026-06-14T03:40:00Z`); a time that
    is none of them is refused (which row is the newest cannot be told); none at all is the oldest."""
    text = row.time.strip()
    if not text:
        return datetime.min
    parsed = None
    for fmt in _TIME_FORMATS:
        try:
            parsed = datetime.strptime(text, fmt)
            break
        except ValueError:
            continue
    if parsed is None:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise UsageError(f"{source}:{row.line}: time {row.time!r} is not a time (write it as the table does, "
                             "2026-06-14 03:40:00 +08:00, or ISO 8601); fix the row, or pass --good REF") from None
    return parsed.astimezone(UTC).replace(tzinfo=None) if parsed.tzinfo else parsed


def read_rows(text: str, source: str) -> list[GoodRow]:
    """Every row with a name or a path; header names are matched case- and space-insensitively."""
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    header = [h.strip().lower() for h in next(reader, [])]
    if "name" not in header and "yaml/path" not in header:
        raise UsageError(f"{source}: not a good table (its header has neither `name` nor `yaml/path`; expected "
                         f"{', '.join(COLUMNS)})")
    rows = []
    for line, cells in enumerate(reader, start=2):
        cell = dict(zip(header, (c.strip() for c in cells), strict=False))
        if not cell.get("name") and not cell.get("yaml/path"):
            continue
        rows.append(GoodRow(cell.get("name", ""), cell.get("yaml/path", ""), cell.get("link", ""),
                            cell.get("status", ""), cell.get("vllm git information", ""),
                            cell.get("vllm-ascend git information", ""), cell.get("soc", ""),
                            cell.get("scene", ""), cell.get("time", ""), line))
    return rows


def _same_yaml(path: str, wanted: str) -> bool:
    p, q = path.rstrip("/"), wanted.rstrip("/")
    return p.endswith(q) or PurePosixPath(p).name == PurePosixPath(q).name


def frequency_of(source: str) -> Frequency | None:
    """`nightly` or `weekly` when the table's path says so (the pipeline's layout)."""
    parts = PurePosixPath(source.replace("\\", "/")).parts
    found = [p for p in parts if p in ("nightly", "weekly")]
    return found[-1] if found else None  # type: ignore[return-value]


def last_good(rows: list[GoodRow], lookup: Lookup, source: str) -> GoodRow:
    """The newest successful row of the case (see the module's docstring)."""
    if not lookup.name and not lookup.config_yaml:
        raise UsageError("--good-table needs the case: --name NAME and/or --config-yaml FILE (--nightly-case gives "
                         "both)")
    if not lookup.soc.strip() or lookup.soc.strip().lower() in ("unknown", "none", "null"):
        raise UsageError(f"--soc {lookup.soc!r}: give the hardware generation of the table's rows, e.g. a2 or a3")
    if lookup.scene not in SCENES:
        raise UsageError(f"--scene {lookup.scene!r}: one of {', '.join(SCENES)}")
    asked = " ".join(f"{k} {v}" for k, v in (("name", lookup.name), ("yaml", lookup.config_yaml)) if v)
    named = [r for r in rows if (not lookup.name or r.name == lookup.name)
             and (not lookup.config_yaml or _same_yaml(r.path, lookup.config_yaml))]
    if not named:
        which = "name" if lookup.name and not any(r.name == lookup.name for r in rows) else "yaml/path"
        known = sorted({r.name for r in rows})[:8]
        raise UsageError(f"{source}: no row matches {which} ({asked}); its names: {', '.join(known) or 'none'}")
    passed = [r for r in named if r.succeeded and r.vllm_ascend_commit]
    if not passed:
        statuses = sorted({r.status or '(empty)' for r in named})
        raise UsageError(f"{source}: {len(named)} row(s) for {asked}, none with status success and a vLLM-Ascend "
                         f"commit (status: {', '.join(statuses)}); pass --good REF")
    on_soc = [r for r in passed if r.soc == lookup.soc or r.legacy]
    if not on_soc:
        raise UsageError(f"{source}: no successful row for {asked} matches soc {lookup.soc} (its socs: "
                         f"{', '.join(sorted({r.soc for r in passed}))}); pass --soc as the table writes it")
    exact = [r for r in on_soc if r.soc == lookup.soc and r.scene == lookup.scene]
    legacy = [r for r in on_soc if r.legacy]
    if not exact and not legacy:
        raise UsageError(f"{source}: no successful row for {asked} on soc {lookup.soc} matches scene "
                         f"{lookup.scene} (its scenes: {', '.join(sorted({r.scene for r in on_soc}))})")
    return max(exact or legacy, key=lambda r: _when(r, source))
