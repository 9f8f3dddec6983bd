"""The dependency's tree as an image layer on a real engine (podman): the upstream's image with
the dependency it installed replaced at another commit, and a whole `run --executor docker` that
crosses from the upstream's culprit into the dependency's commits. The Ascend container of such a
candidate (vLLM laid into a vllm-ascend image) is checked field by field; no NPU here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import git
import pytest
from gitrepo import git as run_git
from gitrepo import make_linear_repo
from test_dependency_level import CHECK, DEP_CULPRIT, DEP_FIX, make_dependency

from bisect_npu.builders.dependency import DependencyBuilder
from bisect_npu.builders.docker import DockerBuilder
from bisect_npu.execute.docker import DockerExecutor
from bisect_npu.recipe import parse_dependency_option

pytestmark = pytest.mark.container

CLI = [sys.executable, "-m", "bisect_npu"]
SPEC = ("name=minidep,url=https://github.com/example/minidep.git,pin=Dockerfile:DEP_TAG,package_dir=minidep,"
        "image_path=/vllm-workspace/minidep")
# As vllm-ascend's: the pinned dependency installed from its own directory (here: vendored into
# the upstream at the pin, since the build cannot clone), then the upstream itself.
DOCKERFILE = """FROM localhost/bisect-npu-demo-base:py311
ARG DEP_TAG={tag}
COPY vendor/ /vllm-workspace/minidep/
ENV PYTHONPATH=/vllm-workspace/minidep
WORKDIR /workspace/app
COPY . /workspace/app
"""
SHOW = ("import os, minidep.core\n"
        "print('bad', minidep.core.BAD)\n"
        "print('version_kept', os.path.exists('/vllm-workspace/minidep/minidep/_version.py'))\n"
        "print('v1', os.path.exists('/vllm-workspace/minidep/minidep/v1.py'))\n"
        "print('v2', os.path.exists('/vllm-workspace/minidep/minidep/v2.py'))\n")


def _tree(dep: Path, tag: str) -> dict[str, str | None]:
    """The dependency's `minidep/` at `tag`, vendored as the image's install, with the generated
    `_version.py` an install writes (git has none)."""
    names = run_git(dep, "ls-tree", "-r", "--name-only", tag, "--", "minidep").split()
    files: dict[str, str | None] = {f"vendor/{n}": run_git(dep, "show", f"{tag}:{n}") + "\n" for n in names}
    files["vendor/minidep/_version.py"] = f"__version__ = {tag[1:]!r}\n"
    return files


@pytest.fixture()
def repos(tmp_path, docker_client, demo_base_image):
    nonce = uuid.uuid4().hex[:8]
    deps = make_dependency(tmp_path / "minidep")
    old, new = _tree(tmp_path / "minidep", "v0.1"), _tree(tmp_path / "minidep", "v0.2")

    def files(i: int) -> dict[str, str | None]:
        if i == 0:
            return {"Dockerfile": DOCKERFILE.format(tag="v0.1"), "check.py": CHECK, "nonce": nonce, **old}
        if i == 6:  # the pin move: the image installs v0.2 (v1.py, which v0.2 dropped, goes)
            return {"Dockerfile": DOCKERFILE.format(tag="v0.2"), **new,
                    **{name: None for name in old if name not in new}}
        return {}

    path = tmp_path / f"dep-level-upstream-{nonce}"  # images: bisect-npu/dep-level-upstream-<nonce>
    ups = make_linear_repo(path, 10, files=files, titles=lambda i: f"Upstream change {i} (#{100 + i})")
    yield path, ups, deps
    for image in docker_client.images.list(filters={"label": "org.bisect-npu.kind"}):
        if any(tag.split("/")[-1].startswith(path.name) for tag in image.tags):
            docker_client.images.remove(image.id, force=True)


def _show(docker_client, env, tmp_path) -> dict[str, str]:
    with DockerExecutor(docker_client) as ex:
        result = ex.run_command(env, ["python3", "-c", SHOW], tmp_path / f"show-{env.commit[:6]}.log", 120)
    assert result.returncode == 0, result.log_tail
    lines = Path(result.log_path).read_text().splitlines()
    return dict(line.split(" ", 1) for line in lines if " " in line and not line.startswith("#"))


def test_the_dependency_tree_is_a_layer_over_the_upstream_image(repos, docker_client, tmp_path):
    path, ups, deps = repos
    inner = DockerBuilder(git.Repo(path), docker_client)
    spec = parse_dependency_option(SPEC)
    builder = DependencyBuilder(inner, spec, git.Repo(tmp_path / "minidep"), lambda _: ups[6], lambda c: c,
                                tmp_path / "trees", inner.lay_over)
    bad = builder.acquire(deps[12], tmp_path / "logs")  # v0.2 itself, over the image that installed v0.2
    assert (bad.kind, bad.commit) == ("image", deps[12])
    assert bad.build_key.endswith(f"+minidep@{deps[12][:12]}") and bad.image.split(":")[-1].startswith("dep-")
    assert _show(docker_client, bad, tmp_path) == {"bad": "True", "version_kept": "True", "v1": "False",
                                                   "v2": "True"}
    good = builder.acquire(deps[3], tmp_path / "logs")  # v0.1's tree over the same image
    assert good.how == "overlay"
    assert _show(docker_client, good, tmp_path) == {"bad": "False", "version_kept": "True", "v1": "True",
                                                    "v2": "False"}
    image = docker_client.images.get(good.image)
    assert image.labels["org.bisect-npu.kind"] == "dependency"
    assert image.labels["org.bisect-npu.commit"] == ups[6]  # the upstream commit it was laid over
    again = builder.acquire(deps[3], tmp_path / "logs")
    assert again.how == "reused" and docker_client.images.get(again.image).id == image.id
    for env in (bad, good, again):
        builder.release(env)
    builder.close()


def test_run_with_the_docker_executor_crosses_into_the_dependency(repos, tmp_path):
    path, ups, deps = repos
    env = {**os.environ, "BISECT_NPU_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([*CLI, "run", "--repo", str(path), "--good", ups[0], "--bad", ups[-1], "--executor",
                           "docker", "--cmd", "python3 check.py", "--session", str(tmp_path / "s"), "--json",
                           "--quiet", "--dependency", SPEC, "--dep-repo", f"minidep={tmp_path / 'minidep'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == deps[DEP_CULPRIT]
    assert f"{ups[6][:12]} moved minidep v0.1 -> v0.2" in done.stdout
    assert f"move the pin to >= v0.3, or cherry-pick {deps[DEP_FIX][:12]}" in done.stdout
    level = next(json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()
                 if '"next_level"' in line)
    steps = [json.loads(line) for line in (Path(level["session"]) / "journal.jsonl").read_text().splitlines()
             if '"type": "step"' in line or '"type":"step"' in line]
    assert steps and all(s["build"]["how"] in ("overlay", "reused") for s in steps)  # no build at this level
