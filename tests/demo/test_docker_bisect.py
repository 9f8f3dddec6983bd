"""The demo upstream bisected with `--executor docker`: images through the engine's API, one
container per candidate run, a full build only per distinct build key, nothing left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import git
import pytest

from bisect_npu.builders.cache import remove_unforced
from bisect_npu.builders.docker import DockerBuilder
from bisect_npu.builders.key import BuildKeyReader
from bisect_npu.demo.generate import ensure_upstream
from bisect_npu.execute.docker import SESSION_LABEL, DockerExecutor
from bisect_npu.journal import session_label
from bisect_npu.orchestration.session import Session
from bisect_npu.report import write_reports
from tests.helpers.asked import spec_of
from tests.helpers.paths import REPO_ROOT
from tests.helpers.signals import interruptible

pytestmark = pytest.mark.container
# The build-avoidance test forgets its upstream's images first; a seed no other test uses gives it
# commits (so images) of its own, and tiers bisecting the seed-0 demo beside it keep theirs.
OWN_SEED = 51


def session_containers(client, session_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"})


def forget_demo_images(client, repo: git.Repo) -> None:
    """Start from an empty cache for the demo upstream, so every build in the run is counted.
    Never forced: a tier run beside this one may have a container from a demo image, and it keeps
    it (this test then cannot count its builds, and says so)."""
    import docker.errors

    shas = {c.hexsha for c in repo.iter_commits("--all")}
    rows = [r for r in client.api.images(filters={"label": "org.bisect-npu.kind"})
            if (r.get("Labels") or {}).get("org.bisect-npu.commit") in shas]
    for row in sorted(rows, key=lambda r: r["Labels"]["org.bisect-npu.kind"] != "overlay"):  # children first
        try:
            kept = remove_unforced(client.api, row["Id"], row.get("RepoTags") or [])
        except docker.errors.ImageNotFound:
            continue
        if kept is not None:
            pytest.skip(f"demo image {row['Id'][:19]} is in use by another run ({kept}); "
                        "run this test when no other demo run shares the engine")


@pytest.mark.heavy
def test_demo_bisects_in_containers_with_build_avoidance(docker_client, demo_base_image, tmp_path):
    repo_path, manifest = ensure_upstream(seed=OWN_SEED)
    truth = manifest.case(manifest.default_case)
    repo = git.Repo(repo_path)
    forget_demo_images(docker_client, repo)
    builder = DockerBuilder(repo, docker_client)
    options = spec_of(good=truth.good_ref, bad=truth.bad_ref, repo=str(repo_path), recipe=truth.recipe,
                         executor="docker", propose_fix=False)
    session_dir = tmp_path / "session"
    with DockerExecutor(docker_client, session_id=session_dir.name + "-" + str(os.getpid())) as executor:
        result = Session.start(options, session_dir=session_dir, builder=builder, executor=executor).run()
        assert session_containers(docker_client, executor.session_id) == []
    assert result.culprit == truth.culprit.sha

    steps = [json.loads(line) for line in (session_dir / "journal.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "build" in s]
    keys = BuildKeyReader(repo)
    by_how: dict[str, list[str]] = {}
    for step in steps:
        by_how.setdefault(step["build"]["how"], []).append(step["commit"])
    distinct = {keys.key(step["commit"]).digest for step in steps}
    full_builds = by_how.get("built", []) + by_how.get("failed", [])  # a failed build was a full build too
    assert len(full_builds) == len(distinct)
    assert set(by_how) <= {"built", "failed", "overlay"}
    assert len(by_how.get("overlay", [])) == len(steps) - len(full_builds) > 0

    # The search was told the build groups and what a full build and an overlay cost against a
    # step, measured from this journal alone (resume decides the same).
    session = Session.resume(session_dir, builder=DockerBuilder(repo, docker_client), executor=executor)
    try:
        problem = session.problem()
    finally:
        session.evaluator.close()
        session.journal.close()
    digests = [keys.key(session.commit_at(i)).digest for i in range(session.n + 1)]
    groups = problem.build_groups
    assert groups is not None and len(set(groups)) == len(set(digests)) > 1
    assert all((groups[i] == groups[j]) == (digests[i] == digests[j]) for i in range(len(digests)) for j in range(i))
    step_probe = [sum(t["seconds"] for t in entries_of(session_dir, s["index"])) for s in ran_steps(steps)]
    built_s = [s["build"]["seconds"] for s in steps if s["build"]["how"] == "built"]
    overlay_s = [s["build"]["seconds"] for s in steps if s["build"]["how"] == "overlay"]
    unit = sum(step_probe) / len(step_probe)
    assert problem.build_cost == pytest.approx(sum(built_s) / len(built_s) / unit, abs=0.01)
    assert problem.overlay_cost == pytest.approx(sum(overlay_s) / len(overlay_s) / unit, abs=0.01)
    assert problem.build_cost > problem.overlay_cost
    # The engine holds the images of the keys this session built, and a later session is told so
    # (an earlier session's images cost an overlay, not a full build).
    imaged = {groups[s["index"]] for s in steps if s["build"]["how"] != "failed"}
    assert problem.prebuilt_groups == imaged and len(imaged) < len(set(groups))
    markdown, _ = write_reports(session_dir)
    last_told = [s["told"] for s in steps if s.get("told")][-1]
    assert last_told["prebuilt_groups"] >= 1
    assert (f"({len(set(groups))} build groups, {int(last_told['prebuilt_groups'])} with an image)"
            in markdown.read_text())

    # One container per candidate run, of that candidate's image: each run's log names its
    # container first (the engine's event log rotates, so it is no record to count on).
    ran = [s for s in steps if s["build"]["how"] != "failed"]
    headers = {}
    for step in ran:
        for log in {t["log"] for t in step["trials"]}:
            first = (session_dir / log).read_text().splitlines()[0]
            assert first.startswith("# container ") and f":commit-{step['commit'][:12]}" in first, first
            headers[first.split()[2]] = step["index"]
    assert len(headers) == len(ran)


def ran_steps(steps: list[dict]) -> list[dict]:
    return [s for s in steps if s["build"]["how"] != "failed" and s.get("trials")]


def entries_of(session_dir: Path, index: int) -> list[dict]:
    lines = (session_dir / "journal.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "trial" and e.get("index") == index]


DRIVER = """
import sys
from pathlib import Path
from bisect_npu.cli import main
main(["demo", "--executor", "docker", "--no-verify-fix", "--quiet", "--session-root", sys.argv[1]])
"""


def test_sigint_in_the_middle_of_a_step_leaves_no_container(docker_client, demo_base_image, tmp_path):
    ensure_upstream()
    root = tmp_path / "sessions"
    child = subprocess.Popen([sys.executable, "-c", DRIVER, str(root)], cwd=REPO_ROOT, preexec_fn=interruptible,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ})
    session_id = ""
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not session_id:
            assert child.poll() is None, child.stderr.read().decode()[-2000:] if child.stderr else ""
            for session_dir in root.glob("*") if root.exists() else []:
                labelled = session_label(session_dir)
                if any(c.status == "running" for c in session_containers(docker_client, labelled)):
                    session_id = labelled
            time.sleep(0.3)
        assert session_id, "no candidate container started"
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=120) == 130
        assert session_containers(docker_client, session_id) == []
    finally:
        if child.poll() is None:
            child.kill()
        if session_id:
            for container in session_containers(docker_client, session_id):
                container.remove(force=True)
