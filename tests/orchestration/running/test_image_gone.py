"""A candidate's image that leaves the engine between its acquire and its run (another session's
prune, a removal) is a cache miss: the evaluator acquires the commit again (built, logged) and the
run goes ahead, where it used to stop the session with exit 5 until a resume. One that keeps
leaving stops it still (exit 5). A real engine; images with no RUN step, built in a fraction of a second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import git
import pytest

from bisect_npu.builders.base import Environment, ImageGone
from bisect_npu.builders.docker import DockerBuilder
from bisect_npu.execute.docker import DockerExecutor
from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator

pytestmark = pytest.mark.container


class RemovedAfterAcquire(DockerBuilder):
    """The real DockerBuilder, the image of its first `times` acquires removed from the engine
    right after (another session's prune between the build and the run)."""

    def __init__(self, repo: git.Repo, client: Any, times: int) -> None:
        super().__init__(repo, client)
        self.times, self.acquired, self.released = times, 0, 0

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        env = super().acquire(commit, log_dir)
        self.acquired += 1
        if self.acquired <= self.times:  # the image itself, all its names (one name alone: `_reuse` names it again)
            api = self.client.api
            api.remove_image(api.inspect_image(env.image)["Id"], force=True)
        return env

    def release(self, env: Environment) -> None:
        self.released += 1
        super().release(env)


class NameTakenAfterAcquire(DockerBuilder):
    """The real DockerBuilder, the name of its first acquire's image moved right after to `foreign`,
    an image without bisect-npu's labels (a user's `podman tag`, another tool's build)."""

    def __init__(self, repo: git.Repo, client: Any, foreign: str) -> None:
        super().__init__(repo, client)
        self.foreign, self.acquired = foreign, 0

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        env = super().acquire(commit, log_dir)
        self.acquired += 1
        if self.acquired == 1:
            assert env.image is not None
            repository, _, tag = env.image.rpartition(":")
            self.client.api.tag(self.foreign, repository, tag)
        return env


def test_an_image_removed_before_its_run_is_built_again_and_runs(one_commit_upstream, docker_client, tmp_path):
    path, commit = one_commit_upstream
    builder = RemovedAfterAcquire(git.Repo(path), docker_client, times=1)
    with DockerExecutor(docker_client) as executor:
        step = Evaluator(builder, executor, tmp_path / "session", command=["true"]).evaluate(
            EvaluationRequest(commit, trials=1))
    assert step.verdict.kind == VerdictKind.GOOD, step.verdict.reason
    assert (builder.acquired, builder.released) == (2, 2)  # each acquire released once
    assert step.build.how == "built"
    log = Path(step.build.log or "").read_text()
    assert "# acquired again (built) before its run: image" in log and "is gone from the engine" in log


def test_an_image_that_keeps_leaving_stops_the_session_with_exit_5(one_commit_upstream, docker_client, tmp_path):
    path, commit = one_commit_upstream
    builder = RemovedAfterAcquire(git.Repo(path), docker_client, times=99)
    with DockerExecutor(docker_client) as executor, pytest.raises(ImageGone, match="keeps removing it") as stopped:
        Evaluator(builder, executor, tmp_path / "session", command=["true"]).evaluate(
            EvaluationRequest(commit, trials=1))
    assert stopped.value.exit_code == 5
    assert (builder.acquired, builder.released) == (3, 3)


def test_a_name_moved_to_an_image_without_our_labels_is_named_again_and_runs(one_commit_upstream, docker_client,
                                                                             demo_base_image, tmp_path):
    """The candidate's name on an image none of our builders made: running it would judge that
    image under the candidate's name. A cache miss: the commit's own image is named again (the
    listing finds it by its labels) and runs; the build log says why."""
    import io
    import uuid

    path, commit = one_commit_upstream
    foreign = f"localhost/bisect-npu-test-unlabelled:{uuid.uuid4().hex[:8]}"
    list(docker_client.api.build(fileobj=io.BytesIO(f"FROM {demo_base_image}\nENV NONCE={foreign[-8:]}\n".encode()),
                                 tag=foreign, rm=True, pull=False, decode=True))
    foreign_id = docker_client.api.inspect_image(foreign)["Id"]
    builder = NameTakenAfterAcquire(git.Repo(path), docker_client, foreign)
    try:
        with DockerExecutor(docker_client) as executor:
            step = Evaluator(builder, executor, tmp_path / "session", command=["true"]).evaluate(
                EvaluationRequest(commit, trials=1))
        assert step.verdict.kind == VerdictKind.GOOD, step.verdict.reason
        assert builder.acquired == 2 and step.build.how == "reused"
        log = Path(step.build.log or "").read_text()
        assert "# acquired again (reused) before its run: image" in log
        assert "now holds an image without bisect-npu's labels" in log
        named = docker_client.api.inspect_image(builder.tag(commit))["Config"]["Labels"]
        assert named["org.bisect-npu.commit"] == commit
    finally:
        docker_client.api.remove_image(foreign_id, force=True)
