"""A step run on Ray nodes journals what the nodes ran, not the driver's placeholder ("reused"):
each node's build once, the costliest as the step's, the one image name; journals written before
the field read as they did; and a node's cache miss (the candidate's image gone there) lands in
the step's build log, as a host's own does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bisect_npu.builders.base import Environment, ImageGone
from bisect_npu.execute.base import RunResult
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator, build_record
from bisect_npu.records import NodeBuild, StepRecord, parse_record

PLACEHOLDER = Environment(kind="worktree", commit="c" * 40, build_key="k1", how="reused")  # the driver's


def _node(name: str, how: str, image: str | None = "up:commit-c", image_id: str | None = None,
          seconds: float = 0.0) -> NodeBuild:
    return NodeBuild(node=name, how=how, seconds=seconds, image=image, image_id=image_id or f"sha256:{name}")


def test_the_step_s_build_is_the_nodes_builds_each_once_the_costliest_its_how() -> None:
    nodes = [_node("n1", "built", seconds=90.0), _node("n2", "overlay", seconds=12.0),
             _node("n1", "reused"), _node("n2", "reused")]  # later batches on the same nodes reuse their builds
    record = build_record(PLACEHOLDER, nodes=nodes)
    assert record.how == "built" and record.seconds == 90.0 and record.key == "k1"
    assert [(n.node, n.how) for n in record.nodes] == [("n1", "built"), ("n2", "overlay")]
    assert record.image == "up:commit-c"  # the one name every node ran (each its own id)


def test_nodes_that_ran_other_names_leave_the_step_s_image_to_each_node() -> None:
    record = build_record(PLACEHOLDER, nodes=[_node("n1", "reused"), _node("n2", "reused", image="other:tag")])
    assert record.how == "reused" and record.image is None
    assert {n.image for n in record.nodes} == {"up:commit-c", "other:tag"}


def test_a_step_without_runs_on_nodes_keeps_its_environment_s_build() -> None:
    record = build_record(PLACEHOLDER.model_copy(update={"how": "built", "seconds": 5.0}))
    assert record.how == "built" and record.seconds == 5.0 and record.nodes == []


def test_the_nodes_come_back_from_the_journal_and_an_older_step_reads_without_them() -> None:
    step = StepRecord(index=3, commit="c" * 40, verdict=Verdict(kind=VerdictKind.BAD, reason="r"),
                      build=build_record(PLACEHOLDER, nodes=[_node("n1", "built", seconds=9.0)]))
    line = json.loads(step.model_dump_json())
    assert line["build"]["nodes"] == [{"node": "n1", "how": "built", "seconds": 9.0, "image": "up:commit-c",
                                       "image_id": "sha256:n1"}]
    read = parse_record(line)
    assert isinstance(read, StepRecord) and read.build == step.build
    del line["build"]["nodes"]  # as a journal before the field (a ray step's placeholder "reused")
    line["build"].update(how="reused", image=None)
    older = parse_record(line)
    assert isinstance(older, StepRecord) and older.build is not None
    assert older.build.how == "reused" and older.build.nodes == []


class KeysOnly:
    """The driver's side of builds on the nodes (execute/ray.py's RemoteBuilds): names, no build log."""

    def __init__(self) -> None:
        self.acquired = 0

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        self.acquired += 1
        return PLACEHOLDER.model_copy(update={"commit": commit})

    def release(self, env: Environment) -> None:
        """Nothing held."""

    def close(self) -> None:
        """Nothing held."""

    def build_key(self, commit: str) -> str | None:
        return "k1"

    def built_keys(self) -> frozenset[str]:
        return frozenset()


class ImageGoneOnceOnANode:
    """A node whose first run finds the candidate's image gone (named as a node's task names it),
    whose next one builds it again there and runs."""

    def __init__(self) -> None:
        self.runs = 0

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        self.runs += 1
        if self.runs == 1:
            raise ImageGone("Ray node 0fd12ed7ef7c: image up:commit-c is gone from the engine")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("# ray node 0fd12ed7ef7c0bd build built\n")
        return RunResult(returncode=0, seconds=0.1, log_path=str(log_path),
                         nodes=[_node("0fd12ed7ef7c0bd", "built", seconds=4.0)])

    def close(self) -> None:
        """Nothing runs."""


def test_an_image_gone_on_a_node_is_written_in_the_step_s_build_log_naming_the_node(tmp_path: Path) -> None:
    builder, executor = KeysOnly(), ImageGoneOnceOnANode()
    evaluator: Any = Evaluator(builder, executor, tmp_path, command=["true"])  # type: ignore[arg-type]
    step = evaluator.evaluate(EvaluationRequest("c" * 40, trials=1))
    assert step.verdict.kind == VerdictKind.GOOD and (builder.acquired, executor.runs) == (2, 2)
    assert step.build.how == "built" and [n.node for n in step.build.nodes] == ["0fd12ed7ef7c0bd"]
    assert step.build.log == str(tmp_path / "steps" / ("c" * 12) / f"build-{'c' * 12}.log")
    assert Path(step.build.log).read_text() == (
        "# acquired again (where it runs next) before its run: Ray node 0fd12ed7ef7c: image up:commit-c is gone "
        "from the engine; a cache miss\n")
