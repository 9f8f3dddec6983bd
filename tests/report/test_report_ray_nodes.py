"""A step run on Ray nodes: the report's step row and report.json name each node's build and the
image id its containers started from, as the journal's step record keeps them."""

from __future__ import annotations

from pathlib import Path

from bisect_npu.journal import Journal
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.records import BuildInfo, NodeBuild, StepRecord
from bisect_npu.report import load_view, render_json, render_markdown
from tests.report.test_report_golden import commits_header

NODES = [NodeBuild(node="1df845f0df1c6998b7a5", how="built", seconds=40.0, image="up:commit-3333",
                   image_id="sha256:" + "9f" * 32),
         NodeBuild(node="bd29e889a53066036897", how="reused", image="up:commit-3333", image_id="sha256:" + "a1" * 32),
         NodeBuild(node="c0ffee0c0ffee0c0ffee", how="built")]  # a worktree: no image to name


def test_a_ray_step_s_row_names_its_nodes_builds_and_images(tmp_path: Path) -> None:
    session = tmp_path / "session"
    with Journal.create(session, commits_header(tmp_path, command=["true"])) as journal:
        journal.append(StepRecord(index=3, commit="3" * 40, verdict=Verdict(kind=VerdictKind.BAD, reason="exit 1"),
                                  build=BuildInfo(how="built", key="k", image="up:commit-3333", nodes=NODES)))
        journal.append(StepRecord(index=1, commit="1" * 40, verdict=Verdict(kind=VerdictKind.GOOD, reason="exit 0"),
                                  build=BuildInfo(how="reused", key="k")))  # a journal from before the field
    view = load_view(session)
    row = next(line for line in render_markdown(view).splitlines() if line.startswith("| 1 | 3 |"))
    assert ("built (ray node 1df845f0df1c built up:commit-3333 (9f9f9f9f9f9f); ray node bd29e889a530 reused "
            "up:commit-3333 (a1a1a1a1a1a1); ray node c0ffee0c0ffe built) |") in row
    other = next(line for line in render_markdown(view).splitlines() if line.startswith("| 2 | 1 |"))
    assert "| reused |" in other
    steps = render_json(view)["steps"]
    assert [n["image_id"] for n in steps[0]["nodes"]] == [n.image_id for n in NODES] and steps[1]["nodes"] == []
