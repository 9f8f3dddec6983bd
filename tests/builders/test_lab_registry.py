"""A lab's mirror for real: Debian's registry (distribution) on a loopback port, the demo base image
pushed under a mirror path, an engine that knows the registry as plain HTTP (registries.conf),
the demo bisected with --base-image-map pointing there, `plan --pull` pulling from it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker.errors
import git
import pytest

from bisect_npu.builders.cache import list_images
from bisect_npu.demo.generate import ensure_upstream
from tests.conftest import DEMO_BASE_IMAGE, _engine_missing
from tests.helpers.paths import REPO_ROOT

pytestmark = [pytest.mark.container, pytest.mark.heavy]  # a registry, pulls and builds: minutes


@dataclass(frozen=True)
class Mirror:
    address: str  # 127.0.0.1:PORT
    docker_host: str  # an engine that pulls from it over plain HTTP
    prefix: str  # where the demo base image lives there: PREFIX/bisect-npu-demo-base:py311
    keys: set[str] = field(default_factory=set)  # build keys of the tests' images (unique to this port)

    @property
    def image_map(self) -> str:
        return f"localhost={self.prefix}"

    @property
    def base_image(self) -> str:
        return DEMO_BASE_IMAGE.replace("localhost", self.prefix, 1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(what: str, ready, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} did not come up in {seconds:.0f}s")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, docker_client, demo_base_image) -> Iterator[Mirror]:
    """The registry (storage in a temporary directory) and a podman service of its own whose
    registries.conf lists it as insecure, sharing the host's image store."""
    for program in ("docker-registry", "podman"):
        if shutil.which(program) is None:
            _engine_missing(f"{program} not installed (containers/setup-podman.sh installs it)")
    root = tmp_path_factory.mktemp("mirror")
    address = f"127.0.0.1:{_free_port()}"
    (root / "registry.yml").write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
                                       f"http:\n  addr: {address}\n")
    (root / "registries.conf").write_text(f'unqualified-search-registries = []\n[[registry]]\nlocation = "{address}"\n'
                                          "insecure = true\n")
    socket_path = root / "podman.sock"
    result = Mirror(address, f"unix://{socket_path}", f"{address}/lab-mirror/localhost")
    registry = subprocess.Popen(["docker-registry", "serve", str(root / "registry.yml")], stdout=subprocess.DEVNULL,
                                stderr=(root / "registry.log").open("w"))
    engine = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket_path}"],
                              stdout=subprocess.DEVNULL, stderr=(root / "podman.log").open("w"),
                              env={**os.environ, "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf")})
    try:
        _wait("the registry", lambda: _answers(f"http://{address}/v2/"))
        _wait("the podman service", socket_path.exists)
        subprocess.run(["podman", "push", "--tls-verify=false", "--compression-format", "zstd", "--quiet",
                        demo_base_image, result.base_image], check=True, capture_output=True, timeout=300)
        forget(result.base_image)
        yield result
    finally:
        _stop(engine)
        _stop(registry)
        forget_keys(docker_client, result.keys)
        for row in list_images(docker_client.api):  # what was pulled from the mirror
            for tag in row.get("RepoTags") or []:
                if tag.startswith(address + "/"):
                    forget(tag)


def forget(image: str) -> None:
    """Untag `image` from the engine's store, so only a pull brings it back."""
    subprocess.run(["podman", "rmi", image], capture_output=True, check=False)


def present(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], check=False).returncode == 0


def bisect_npu(mirror: Mirror, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bisect_npu", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, check=False,
                          env={**os.environ, "DOCKER_HOST": mirror.docker_host, "PYTHONPATH": str(REPO_ROOT)})


# The demo's async-penalty culprit moves the back-fill after the last step (with this comment): a
# look at the installed source in the candidate's container is a quick oracle (the model run is
# the demo's own test).
ORACLE = ("python3 -c 'import sys; text = open(\"/vllm-workspace/tinyvllm/tinyvllm/engine.py\").read(); "
          "sys.exit(1 if \"# The output processor owns the ids\" in text else 0)'")


def forget_keys(client, keys: set[str]) -> None:
    """Remove the images of these build keys (overlays first), so the run starts from none."""
    for row in sorted(list_images(client.api, {"label": "org.bisect-npu.kind"}),
                      key=lambda r: r["Labels"]["org.bisect-npu.kind"] != "overlay"):
        if row["Labels"].get("org.bisect-npu.key") in keys:
            with contextlib.suppress(docker.errors.NotFound):
                client.images.remove(row["Id"], force=True)


def range_keys(repo_path: Path, good: str, bad: str, image_map: list[str]) -> list[str]:
    from bisect_npu.builders.key import BuildKeyReader
    from bisect_npu.builders.registry import BaseImageMap
    from bisect_npu.upstream.history import resolve_range

    repo = git.Repo(repo_path)
    brange = resolve_range(repo, good, bad)
    reader = BuildKeyReader(repo, base_images=BaseImageMap.parse(image_map).apply)
    return [reader.key(sha).digest for sha in (brange.base, *brange.candidates)]


def journal_steps(session: Path) -> list[dict]:
    lines = (session / "journal.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "step"]


def test_the_demo_bisects_with_its_base_image_from_the_mirror(mirror, docker_client, tmp_path):
    repo_path, manifest = ensure_upstream()
    culprit = manifest.case(manifest.default_case).culprit.sha
    good, bad = f"{culprit}~2", culprit
    mirror.keys.update(range_keys(repo_path, good, bad, [mirror.image_map]))
    forget_keys(docker_client, mirror.keys)
    forget(mirror.base_image)
    done = bisect_npu(mirror, "run", "--repo", str(repo_path), "--good", good, "--bad", bad, "--cmd", ORACLE,
                      "--executor", "docker", "--no-fix", "--quiet", "--json",
                      "--base-image-map", mirror.image_map, "--session", str(tmp_path / "s"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["culprit"] == culprit
    assert present(mirror.base_image)  # the build pulled it from the mirror

    built = [s for s in journal_steps(tmp_path / "s") if s["build"]["how"] == "built"]
    assert built
    for step in built:
        log = (tmp_path / "s" / step["build"]["log"]).read_text()
        assert f"# base image map: {mirror.image_map}\n" in log
        assert f'"base_image_pulled": "{mirror.base_image}"' in log
        assert f"FROM {mirror.base_image}\n" in log
    # In git the candidates' Dockerfiles still name the upstream's base image.
    repo = git.Repo(repo_path)
    for step in built:
        dockerfile = (repo.commit(step["commit"]).tree / "Dockerfile").data_stream.read().decode()
        assert dockerfile.startswith(f"FROM {DEMO_BASE_IMAGE}\n")
    report = (tmp_path / "s" / "report.md").read_text()
    assert f"--base-image-map {mirror.image_map}" in report


def publish_release(mirror: Mirror, repo_path: Path, tag: str, tmp_path: Path) -> str:
    """What vllm-ascend's image workflow does for a tag: its own Dockerfile built on its tree,
    the commit in the OCI revision label, pushed; then gone from this engine's store."""
    repo = git.Repo(repo_path)
    sha = repo.commit(tag).hexsha
    tree = tmp_path / "release-tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(repo_path), "archive", "--format=tar", tag], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    image = f"{mirror.address}/lab-mirror/quay.io/ascend/vllm-ascend:{tag}"
    subprocess.run(["podman", "build", "-q", "--pull=never", "--label", f"org.opencontainers.image.revision={sha}",
                    "-t", image, str(tree)], check=True, capture_output=True, timeout=300)
    subprocess.run(["podman", "push", "-q", "--tls-verify=false", "--compression-format", "zstd", image],
                   check=True, capture_output=True, timeout=300)
    forget(image)
    return image


def test_a_published_release_image_spares_its_keys_full_build(mirror, docker_client, tmp_path):
    repo_path, _ = ensure_upstream()
    good, bad = "v0.9.0", "v0.9.1"
    maps = [mirror.image_map, f"quay.io={mirror.address}/lab-mirror/quay.io"]
    keys = range_keys(repo_path, good, bad, maps)
    mirror.keys.update(keys)
    forget_keys(docker_client, set(keys))
    image = publish_release(mirror, repo_path, good, tmp_path)

    plan = bisect_npu(mirror, "plan", "--repo", str(repo_path), "--good", good, "--bad", bad, "--json",
                      *[arg for entry in maps for arg in ("--base-image-map", entry)],
                      "--release-images", "quay.io/ascend/vllm-ascend:{tag}", "--pull", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    figures = json.loads(plan.stdout)
    # Both ends are releases; only the good end's image was published (and verified once pulled).
    tags = {good: git.Repo(repo_path).commit(good).hexsha, bad: git.Repo(repo_path).commit(bad).hexsha}
    assert figures["release_images"][keys[0]] == {"tag": good, "commit": tags[good], "image": image}
    assert figures["release_images"][keys[-1]]["tag"] == bad and len(figures["release_images"]) == 2
    published = figures["published"]
    assert published[image].startswith("sha256:")
    missing = figures["release_images"][keys[-1]]["image"]
    assert "no such image or tag there" in published[missing] and "not used" in published[missing]
    forget(image)  # the run pulls it again

    done = bisect_npu(mirror, "run", "--repo", str(repo_path), "--good", good, "--bad", bad, "--cmd", ORACLE,
                      "--executor", "docker", "--no-fix", "--quiet", "--json",
                      *[arg for entry in maps for arg in ("--base-image-map", entry)],
                      "--release-images", "quay.io/ascend/vllm-ascend:{tag}", "--session", str(tmp_path / "s"),
                      cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = journal_steps(tmp_path / "s")
    tested_keys = {keys[s["index"]] for s in steps}
    built = [s for s in steps if s["build"]["how"] in ("built", "failed")]
    assert len({keys[s["index"]] for s in built}) == len(tested_keys) - 1  # one key fewer built
    good_end = next(s for s in steps if s["index"] == 0)
    assert good_end["build"]["how"] == "reused"
    log = (tmp_path / "s" / good_end["build"]["log"]).read_text()
    assert f"# release image {image} is {good} (" in log and "verified by its label" in log
    assert all(keys[s["index"]] != keys[0] for s in built)


def test_plan_pull_fetches_the_ranges_base_images_from_the_mirror(mirror, tmp_path):
    repo_path, manifest = ensure_upstream()
    truth = manifest.case(manifest.default_case)
    forget(mirror.base_image)
    done = bisect_npu(mirror, "plan", "--repo", str(repo_path), "--good", truth.good_ref, "--bad", truth.bad_ref,
                      "--base-image-map", mirror.image_map, "--pull", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["base_images"] == [mirror.base_image] and list(plan["pulled"]) == [mirror.base_image]
    assert all(group["pull"] == mirror.base_image for group in plan["build_groups"])
    assert present(mirror.base_image)

    elsewhere = f"127.0.0.1:{_free_port()}/lab-mirror/localhost"  # nothing listens there
    done = bisect_npu(mirror, "plan", "--repo", str(repo_path), "--good", truth.good_ref, "--bad", truth.bad_ref,
                      "--base-image-map", f"localhost={elsewhere}", "--pull", cwd=tmp_path)
    assert done.returncode == 5, done.stdout + done.stderr
    assert f"could not be pulled from {elsewhere.split('/')[0]} (connection refused)" in done.stderr
