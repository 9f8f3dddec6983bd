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

from bisect_npu.builders.cache import ImageCache
from bisect_npu.builders.dependency import DependencyBuilder
from bisect_npu.builders.docker import DockerBuilder
from bisect_npu.execute.docker import DockerExecutor
from bisect_npu.orchestration.opening.session_spec import parse_dependency_option
from tests.helpers.gitrepo import add_commit, make_linear_repo
from tests.helpers.gitrepo import git as run_git
from tests.orchestration.test_dependency_level import CHECK, DEP_CULPRIT, DEP_FIX, make_dependency

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
    cache = ImageCache(docker_client, max_bytes=1 << 40, state_path=tmp_path / "cache.json")
    inner = DockerBuilder(git.Repo(path), docker_client, cache=cache)
    spec = parse_dependency_option(SPEC)
    builder = DependencyBuilder(inner, spec, git.Repo(tmp_path / "minidep"), lambda _: ups[6], lambda c: c,
                                tmp_path / "trees", inner)
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
    layers = {docker_client.api.inspect_image(env.image)["Id"] for env in (bad, good)}
    assert layers <= cache.pinned()  # held while their candidates run: a prune must not take them
    for env in (bad, good, again):
        builder.release(env)
    assert not layers & cache.pinned()
    builder.close()


@pytest.mark.heavy
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


# A vllm-ascend image as far as the overlay is concerned: vLLM's repository at /vllm-workspace/vllm
# (the build's generated `_version.py` and a compiled `.so` in its package), the plugin at
# /vllm-workspace/vllm-ascend. Made from git here: a real one needs the NPU toolchain to build.
ASCEND_DOCKERFILE = """FROM localhost/bisect-npu-demo-base:py311
ARG VLLM_TAG=v0.30.0
ARG VLLM_COMMIT=""
COPY vendor/ /vllm-workspace/vllm/
ENV PYTHONPATH=/vllm-workspace/vllm
COPY . /vllm-workspace/vllm-ascend/
"""
VLLM_SHOW = ("import os, vllm\n"
             "root = '/vllm-workspace/vllm/vllm/'\n"
             "print('fixed', vllm.PRESENCE_PENALTY_FIXED)\n"
             "print('from', vllm.__file__)\n"
             "print('kept', sorted(n for n in ('_version.py', '_C.abi3.so') if os.path.exists(root + n)))\n"
             "print('old', os.path.exists(root + 'old.py'))\n")


def test_vllm_laid_into_a_vllm_ascend_image_and_its_ascend_container(tmp_path, docker_client, demo_base_image):
    """The bundled recipe's vLLM declaration on an image laid out as vllm-ascend's: the layer
    replaces /vllm-workspace/vllm/vllm (keeping what the install generated or compiled), and the
    candidate's container on an Ascend host is checked field by field up to its creation."""
    from bisect_npu.execute.ascend import DETERMINISM_ENV, MANAGEMENT_DEVICES
    from bisect_npu.execute.docker import container_create_kwargs
    from bisect_npu.orchestration.opening.environments import container_spec_factory
    from bisect_npu.recipe.loader import load_recipe
    from tests.helpers.asked import spec_of

    nonce = uuid.uuid4().hex[:8]
    vllm = tmp_path / "vllm"
    vllm_shas = make_linear_repo(vllm, 3, files=lambda i: {
        "vllm/__init__.py": f"PRESENCE_PENALTY_FIXED = {i == 2}\n", "setup.py": "# compiled part\n",
        **({"vllm/old.py": "OLD = 1\n"} if i == 0 else {"vllm/old.py": None} if i == 1 else {})},
        tags={0: "v0.30.0", 2: "v0.31.0"})
    ascend = tmp_path / f"dep-level-vllm-ascend-{nonce}"
    make_linear_repo(ascend, 1, files=lambda i: {
        "Dockerfile": ASCEND_DOCKERFILE, "vllm_ascend/__init__.py": f"NONCE = {nonce!r}\n",
        "vendor/vllm/__init__.py": "PRESENCE_PENALTY_FIXED = False\n", "vendor/vllm/old.py": "OLD = 1\n",
        "vendor/vllm/_version.py": "__version__ = '0.30.0'\n", "vendor/vllm/_C.abi3.so": "compiled\n"})
    recipe = load_recipe("qwen3-moe-presence-penalty-loop")
    spec = recipe.dependency("vllm")
    assert spec is not None
    inner = DockerBuilder(git.Repo(ascend), docker_client)
    held = git.Repo(ascend).head.commit.hexsha
    builder = DependencyBuilder(inner, spec, git.Repo(vllm), lambda _: held, lambda c: c, tmp_path / "trees",
                                inner)
    try:
        env = builder.acquire(vllm_shas[2], tmp_path / "logs")
        with DockerExecutor(docker_client) as ex:
            result = ex.run_command(env, ["python3", "-c", VLLM_SHOW], tmp_path / "show.log", 120)
        assert result.returncode == 0, result.log_tail
        shown = dict(line.split(" ", 1) for line in Path(result.log_path).read_text().splitlines()
                     if " " in line and not line.startswith("#"))
        assert shown == {"fixed": "True", "from": "/vllm-workspace/vllm/vllm/__init__.py",
                         "kept": "['_C.abi3.so', '_version.py']", "old": "False"}

        options = spec_of(good="a", bad="b", recipe="qwen3-moe-presence-penalty-loop", executor="docker",
                             devices=[0, 1, 2, 3], host="A2")
        executor = DockerExecutor(docker_client, container_spec_factory(options, recipe), session_id="dep-level")
        kwargs = container_create_kwargs(executor.spec_for(env, ["python3", "-m", "probe"], tmp_path / "out"))
        assert kwargs["image"] == env.image and env.image.startswith(f"bisect-npu/{ascend.name}:dep-")
        assert kwargs["devices"] == [*(f"/dev/davinci{i}:/dev/davinci{i}:rwm" for i in range(4)),
                                     *(f"{d}:{d}:rwm" for d in MANAGEMENT_DEVICES)]
        volumes = kwargs["volumes"]
        assert volumes["/data/models/Qwen3-30B-A3B"] == {"bind": "/models/Qwen3-30B-A3B", "mode": "ro"}
        assert volumes[str(tmp_path / "out")] == {"bind": "/out", "mode": "rw"}
        assert volumes["/usr/local/Ascend/driver/lib64/"] == {"bind": "/usr/local/Ascend/driver/lib64/", "mode": "ro"}
        assert not [v for v in volumes.values() if v["bind"].startswith("/vllm-workspace")]  # in the image, not mounted
        assert {k: kwargs["environment"][k] for k in DETERMINISM_ENV} == DETERMINISM_ENV
        assert kwargs["privileged"] is False and kwargs["network_mode"] == "bridge" and kwargs["shm_size"] == "16g"
        assert kwargs["labels"]["org.bisect-npu.commit"] == vllm_shas[2]  # the container says which vLLM commit
        builder.release(env)
    finally:
        builder.close()
        for image in docker_client.images.list(filters={"label": "org.bisect-npu.kind"}):
            if any(tag.split("/")[-1].startswith(ascend.name) for tag in image.tags):
                docker_client.images.remove(image.id, force=True)


def test_a_dependency_the_image_does_not_install_is_laid_in_at_the_pin(tmp_path, docker_client, demo_base_image):
    """installed_by_image: false (the demo's minivllm): the upstream's image has no trace of the
    dependency; each candidate gets its pinned tree as a layer, importable."""
    from bisect_npu.builders.dependency import PinnedCommit

    nonce = uuid.uuid4().hex[:8]
    deps = make_dependency(tmp_path / "minidep")
    path = tmp_path / f"dep-level-bare-{nonce}"
    ups = make_linear_repo(path, 2, files=lambda i: {
        "Dockerfile": f"FROM localhost/bisect-npu-demo-base:py311\nARG DEP_TAG={'v0.1' if i == 0 else 'v0.2'}\n"
                      f"WORKDIR /workspace/app\nCOPY . /workspace/app\n", "check.py": CHECK, "nonce": nonce})
    spec = parse_dependency_option(SPEC + ",installed_by_image=false")
    inner = DockerBuilder(git.Repo(path), docker_client)
    clone = git.Repo(tmp_path / "minidep")
    builder = DependencyBuilder(inner, spec, clone, lambda c: c,
                                PinnedCommit(git.Repo(path), clone, spec, "Dockerfile", {}), tmp_path / "trees",
                                inner)
    try:
        codes = {}
        for sha in ups:
            env = builder.acquire(sha, tmp_path / "logs")
            assert env.build_key.endswith(f"+minidep@{(deps[3] if sha == ups[0] else deps[12])[:12]}")
            with DockerExecutor(docker_client) as ex:
                codes[sha] = ex.run_command(env, ["python3", "check.py"], tmp_path / f"check-{sha[:6]}.log",
                                            120).returncode
            builder.release(env)
        assert codes == {ups[0]: 0, ups[1]: 1}  # v0.1 good, v0.2 bad: the pinned tree is what runs
        # Two upstream commits of one build key, the same pin: each its own layer (their Python differs).
        third = add_commit(path, "python only (#3)", {"check.py": CHECK.replace("sys.exit(1 if", "sys.exit(3 if")})
        env = builder.acquire(third, tmp_path / "logs")
        assert env.how == "overlay" and env.image != builder.acquire(ups[1], tmp_path / "logs").image
        with DockerExecutor(docker_client) as ex:
            assert ex.run_command(env, ["python3", "check.py"], tmp_path / "check-3.log", 120).returncode == 3
    finally:
        builder.close()
        for image in docker_client.images.list(filters={"label": "org.bisect-npu.kind"}):
            if any(tag.split("/")[-1].startswith(path.name) for tag in image.tags):
                docker_client.images.remove(image.id, force=True)
