"""DockerBuilder on a real engine: full build, overlay on the same key, reuse, failures."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import git
import pytest

from bisect_npu import __version__
from bisect_npu.builders.base import BuildFailed
from bisect_npu.builders.cache import ImageCache
from bisect_npu.builders.docker import DockerBuilder
from bisect_npu.execute.docker import DockerExecutor
from tests.helpers.gitrepo import add_commit, make_linear_repo

pytestmark = pytest.mark.container

DOCKERFILE = """FROM localhost/bisect-npu-demo-base:py311
ARG VLLM_TAG=v1
WORKDIR /workspace/app
COPY . /workspace/app
RUN python3 /workspace/app/tools/build.py
"""
# The "compile": an artifact made from csrc/ that git does not track, as kernels are.
BUILD = """import pathlib
src = pathlib.Path('/workspace/app/csrc/kernel.c').read_text()
pathlib.Path('/workspace/app/app/_kernel.txt').write_text(src)
"""
SHOW = ("import importlib.util, os, app\n"
        "print('version', app.VERSION)\n"
        "print('kernel', open('/workspace/app/app/_kernel.txt').read().strip())\n"
        "print('old', os.path.exists('/workspace/app/app/old.py'))\n"
        "print('new', importlib.util.find_spec('app.new') is not None)\n")


@pytest.fixture()
def upstream(tmp_path, docker_client, demo_base_image):
    """A tiny upstream: c0 (kernel k1), c1 (python only: edits, a deleted and a new module), c2 (kernel k2)."""
    nonce = uuid.uuid4().hex[:8]  # unique keys: nothing from an earlier run is reused
    path = tmp_path / f"upstream-{nonce}"
    make_linear_repo(path, 1, files=lambda i: {
        "Dockerfile": DOCKERFILE, "tools/build.py": BUILD, "csrc/kernel.c": f"k1 {nonce}\n",
        "app/__init__.py": "VERSION = 0\n", "app/old.py": "OLD = 1\n"})
    c0 = git.Repo(path).head.commit.hexsha
    c1 = add_commit(path, "python only (#2)", {"app/__init__.py": "VERSION = 1\n", "app/old.py": None,
                                               "app/new.py": "NEW = 1\n"})
    c2 = add_commit(path, "kernel (#3)", {"csrc/kernel.c": f"k2 {nonce}\n"})
    yield path, c0, c1, c2
    for image in docker_client.images.list(filters={"label": "org.bisect-npu.kind"}):
        if image.labels.get("org.bisect-npu.commit") in (c0, c1, c2):
            docker_client.images.remove(image.id, force=True)


def show(docker_client, env, tmp_path) -> dict[str, str]:
    with DockerExecutor(docker_client) as ex:
        result = ex.run_command(env, ["python3", "-c", SHOW], tmp_path / f"show-{env.commit[:6]}.log", 120)
    assert result.returncode == 0, result.log_tail
    lines = Path(result.log_path).read_text().splitlines()
    return dict(line.split(" ", 1) for line in lines if " " in line)


def test_full_then_overlay_then_full_then_reused(upstream, docker_client, tmp_path):
    path, c0, c1, c2 = upstream
    builder = DockerBuilder(git.Repo(path), docker_client)
    assert builder.built_keys() == frozenset()
    first = builder.acquire(c0, tmp_path / "logs")
    assert (first.kind, first.how) == ("image", "built")
    assert builder.built_keys() == {first.build_key}
    image = docker_client.images.get(first.image)
    assert image.labels["org.bisect-npu.commit"] == c0
    assert image.labels["org.bisect-npu.key"] == first.build_key
    assert image.labels["org.bisect-npu.kind"] == "full"
    assert image.labels["org.bisect-npu.tool-version"] == __version__
    repository = builder.repository
    assert any(t.endswith(f"{repository}:key-{first.build_key}") for t in image.tags)
    assert "STEP" in Path(first.log_path).read_text()

    overlay = builder.acquire(c1, tmp_path / "logs")
    assert overlay.how == "overlay" and overlay.build_key == first.build_key
    assert docker_client.images.get(overlay.image).labels["org.bisect-npu.kind"] == "overlay"
    seen = show(docker_client, overlay, tmp_path)
    assert seen["version"] == "1"
    assert seen["kernel"].startswith("k1 ")  # the compiled artifact of c0's image is kept
    assert (seen["old"], seen["new"]) == ("False", "True")

    kernel = builder.acquire(c2, tmp_path / "logs")
    assert kernel.how == "built" and kernel.build_key != first.build_key
    assert show(docker_client, kernel, tmp_path)["kernel"].startswith("k2 ")

    later_session = DockerBuilder(git.Repo(path), docker_client)
    assert later_session.built_keys() == {first.build_key, kernel.build_key}  # the search is told so
    assert DockerBuilder(git.Repo(path), docker_client, overlays=False).built_keys() == frozenset()
    again = later_session.acquire(c1, tmp_path / "logs2")
    assert again.how == "reused"
    assert docker_client.images.get(again.image).id == docker_client.images.get(overlay.image).id


def test_an_image_of_another_repositorys_commit_is_not_a_built_key(upstream, docker_client, tmp_path):
    # Another clone's commit with the same compiled inputs has the same key, but acquire never lays
    # a commit over an image of a commit it cannot see, so built_keys must not offer that key.
    path, c0, _, _ = upstream
    built = DockerBuilder(git.Repo(path), docker_client).acquire(c0, tmp_path / "logs")
    nonce = path.name.split("-")[-1]
    other = tmp_path / "other"
    make_linear_repo(other, 1, files=lambda i: {
        "Dockerfile": DOCKERFILE, "tools/build.py": BUILD, "csrc/kernel.c": f"k1 {nonce}\n",
        "app/__init__.py": "VERSION = 7\n"})
    stranger = DockerBuilder(git.Repo(other), docker_client)
    own = git.Repo(other).head.commit.hexsha
    assert stranger.build_key(own) == built.build_key
    assert built.build_key not in stranger.built_keys()
    env = stranger.acquire(own, tmp_path / "logs-other")
    assert env.how == "built"
    docker_client.images.remove(env.image, force=True)


def test_overlays_off_builds_every_commit(upstream, docker_client, tmp_path):
    path, c0, c1, _ = upstream
    builder = DockerBuilder(git.Repo(path), docker_client, overlays=False)
    assert builder.acquire(c0, tmp_path).how == "built"
    assert builder.acquire(c1, tmp_path).how == "built"


def test_a_full_build_names_its_own_image_when_its_key_tag_moves_meanwhile(upstream, docker_client, tmp_path):
    """Two full builds of one build key (two sessions on one engine, or two Ray nodes) each tag
    `key-<digest>`: the other's may land between this build's end and the look-up of its image.
    Right then (the real engine, the other build's tag replayed at that moment) the commit's
    name still goes to the commit's own image, never to the other commit's."""
    import docker

    path, c0, c1, _ = upstream  # c1 changes only Python: the same build key as c0
    client = docker.from_env(timeout=600)  # its own client: the replay below is this test's alone
    builder = DockerBuilder(git.Repo(path), client, overlays=False)
    first = client.images.get(builder.acquire(c0, tmp_path).image).id
    key_tag = f"{builder.repository}:key-{builder.build_key(c0)}"
    build = client.api.build

    def build_then_the_other_lands(*args, **kwargs):
        yield from build(*args, **kwargs)
        client.api.tag(first, builder.repository, f"key-{builder.build_key(c0)}")

    client.api.build = build_then_the_other_lands
    try:
        env = builder.acquire(c1, tmp_path)
    finally:
        client.api.build = build
        client.close()
    assert env.how == "built" and docker_client.images.get(key_tag).id == first  # the other build's tag won
    assert docker_client.images.get(env.image).labels["org.bisect-npu.commit"] == c1
    assert show(docker_client, env, tmp_path)["version"] == "1"


def test_failed_build_raises_with_the_log_tail(tmp_path, docker_client, demo_base_image):
    path = tmp_path / f"broken-{uuid.uuid4().hex[:8]}"
    make_linear_repo(path, 1, files=lambda i: {
        "Dockerfile": "FROM localhost/bisect-npu-demo-base:py311\nCOPY . /app\nRUN echo compiling && false\n"})
    builder = DockerBuilder(git.Repo(path), docker_client)
    with pytest.raises(BuildFailed) as failure:
        builder.acquire("HEAD", tmp_path / "logs")
    assert "image build failed" in str(failure.value)
    assert "compiling" in failure.value.log_tail
    assert failure.value.log_path is not None and failure.value.log_path.exists()
    sha = git.Repo(path).head.commit.hexsha
    half_built = docker_client.api.images(filters={"label": f"org.bisect-npu.commit={sha}"}, all=True)
    assert half_built == []  # no intermediate layer may look like a finished image of the commit


def test_cache_prunes_least_recently_used_and_keeps_pinned(upstream, docker_client, demo_base_image, tmp_path):
    path, c0, c1, c2 = upstream
    cache = ImageCache(docker_client, max_bytes=1 << 40, state_path=tmp_path / "cache.json")
    builder = DockerBuilder(git.Repo(path), docker_client, cache=cache)
    envs = [builder.acquire(c, tmp_path) for c in (c0, c1, c2)]
    ids = [docker_client.images.get(e.image).id for e in envs]
    assert set(ids) <= cache.pinned()  # the overlay too, though its commit answers a bare id
    builder.release(envs[1])  # the overlay is done; the full images stay pinned as bases
    for image_id, _, _ in cache.images():  # older images of other tests or sessions sharing this engine
        if image_id not in ids:
            cache.use(image_id, pin=True)
    sizes = {image_id: size for image_id, size, _ in cache.images()}
    base_size = docker_client.images.get(demo_base_image).attrs["Size"]
    assert all(sizes[i] < base_size / 10 for i in ids)  # each counts what it adds, not the base below
    cache.max_bytes = cache.total_bytes() - 1

    # Another session's container from the unpinned overlay: prune leaves the image and the container.
    docker_client.api.tag(ids[1], "bisect-npu/prune-test", f"second-{ids[1][7:19]}")  # untagging must wait
    tags = sorted(docker_client.images.get(ids[1]).tags)
    other_run = docker_client.containers.run(ids[1], ["sleep", "300"], detach=True,
                                             labels={"org.bisect-npu.test": "prune-keeps-in-use"})
    try:
        log = tmp_path / "prune.log"
        with log.open("w", encoding="utf-8") as fh:
            assert cache.prune(fh) == []
        assert sorted(docker_client.images.get(ids[1]).tags) == tags and len(tags) == 2
        other_run.reload()
        assert other_run.status == "running"
        assert f"kept {ids[1]} over the budget: container {other_run.id[:12]}" in log.read_text()
    finally:
        other_run.remove(force=True)
    with log.open("w", encoding="utf-8") as fh:
        removed = cache.prune(fh)
    assert removed == [ids[1]], log.read_text()  # no container now; the full images are pinned
    assert docker_client.images.get(demo_base_image)  # never touches images without our labels

    # Another session sees this session's fresh full image as within its grace period.
    cache.unpin(ids[0])
    other_session = ImageCache(docker_client, max_bytes=0, state_path=tmp_path / "cache.json")
    other_session.use(ids[0])  # both sessions used it; this one last
    cache.use(ids[0])
    for image_id, _, _ in cache.images():
        if image_id not in ids:
            other_session.use(image_id, pin=True)
    with log.open("w", encoding="utf-8") as fh:
        assert other_session.prune(fh) == []
    kept = log.read_text()
    assert f"kept {ids[0]} over the budget: another session built or used it" in kept  # its last use
    assert f"kept {ids[2]} over the budget: another session built or used it" in kept  # its build
    cache.max_bytes = 0
    assert cache.prune() == [ids[0]]  # this session used it last and unpinned it: its own to remove
    assert {image_id for image_id, _, _ in cache.images()} >= {ids[2]}


def test_two_threads_acquire_at_once(upstream, docker_client, tmp_path):
    """Prefetch builds in a background thread while the session builds another candidate."""
    path, c0, c1, c2 = upstream
    builder = DockerBuilder(git.Repo(path), docker_client)
    builder.acquire(c0, tmp_path)
    with ThreadPoolExecutor(max_workers=2) as pool:
        overlay, kernel = pool.map(lambda c: builder.acquire(c, tmp_path / c[:6]), [c1, c2], timeout=300)
    assert (overlay.how, kernel.how) == ("overlay", "built")


def test_a_dockerfile_the_commit_lacks_is_a_clear_build_failure(upstream, docker_client, tmp_path):
    path, c0, _, _ = upstream
    builder = DockerBuilder(git.Repo(path), docker_client, dockerfile="Dockerfile.a3")
    with pytest.raises(BuildFailed, match=rf"{c0[:12]} has no Dockerfile\.a3: it cannot be built for this target"):
        builder.acquire(c0, tmp_path / "logs")
    a3 = add_commit(path, "A3 image (#4)", {"Dockerfile.a3": DOCKERFILE})
    built = builder.acquire(a3, tmp_path / "logs")
    assert built.how == "built"
    assert builder.key(a3).inputs["dockerfile"] == git.Repo(path).commit(a3).tree["Dockerfile.a3"].hexsha


# vllm-ascend's shape: its setup.py takes the version from setuptools_scm, which reads
# SETUPTOOLS_SCM_PRETEND_VERSION when there is no .git (a `git archive` context has none). The
# demo base has no setuptools_scm, so this setup.py reads the variable the same way.
VERSIONED_DOCKERFILE = """FROM localhost/bisect-npu-demo-base:py311
COPY . /vllm-workspace/vllm-ascend/
RUN python3 -c "print('an earlier step')"
RUN pip install -q --no-build-isolation --no-index --no-deps -e /vllm-workspace/vllm-ascend/
"""
VERSIONED_SETUP = """import os
from setuptools import setup
setup(name="vllm_ascend", version=os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION", "0.0.0"),
      packages=["vllm_ascend"])
"""
REPORT_VERSION = "import importlib.metadata as m; print('version', m.version('vllm_ascend'))"


def test_full_builds_and_overlays_report_the_candidates_git_describe(tmp_path, docker_client, demo_base_image):
    nonce = uuid.uuid4().hex[:8]
    path = tmp_path / f"versioned-{nonce}"
    make_linear_repo(path, 1, files=lambda i: {
        "Dockerfile": VERSIONED_DOCKERFILE, "setup.py": VERSIONED_SETUP, "csrc/k.c": f"{nonce}\n",
        "pyproject.toml": '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n',
        "vllm_ascend/__init__.py": "A = 0\n", "vllm_ascend/old.py": "B = 0\n"}, tags={0: "v0.11.0rc0"})
    c0 = git.Repo(path).head.commit.hexsha
    c1 = add_commit(path, "python only (#2)", {"vllm_ascend/__init__.py": "A = 1\n"})
    c2 = add_commit(path, "python only, a deletion (#3)", {"vllm_ascend/old.py": None})
    repo = git.Repo(path)
    builder = DockerBuilder(repo, docker_client)
    try:
        reported = {}
        for sha in (c0, c1, c2):
            env = builder.acquire(sha, tmp_path / "logs")
            with DockerExecutor(docker_client) as ex:
                result = ex.run_command(env, ["python3", "-c", REPORT_VERSION], tmp_path / f"v-{sha[:6]}.log", 120)
            assert result.returncode == 0, result.log_tail
            reported[sha] = (env.how, Path(result.log_path).read_text().split("version ", 1)[1].strip())
        described = {sha: repo.git.describe("--tags", "--long", "--abbrev=12", sha) for sha in (c1, c2)}
        assert reported[c0] == ("built", "0.11.0rc0")
        assert described[c1] == f"v0.11.0rc0-1-g{c1[:12]}"
        assert reported[c1] == ("overlay", f"0.11.0rc0+1.g{c1[:12]}")
        assert reported[c2] == ("overlay", f"0.11.0rc0+2.g{c2[:12]}")
        assert docker_client.images.get(builder.tag(c1)).labels["org.bisect-npu.candidate-version"] == reported[c1][1]
    finally:
        for image in docker_client.images.list(filters={"label": "org.bisect-npu.kind"}):
            if image.labels.get("org.bisect-npu.commit") in (c0, c1, c2):
                docker_client.images.remove(image.id, force=True)
