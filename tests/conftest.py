"""Shared fixtures.

Container engine (owned by the containers room): tests marked `container` use `docker_client`;
when no engine answers they FAIL under CI=true (CI must have set podman up) and skip elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers.paths import REPO_ROOT
from tests.helpers.venvs import copy_venv, make_seed

DEMO_BASE_IMAGE = "localhost/bisect-npu-demo-base:py311"

# Property tests judge what the code answers, not how fast a shared 2-core machine draws examples:
# no per-example deadline and no "too slow" health check unless a test sets its own.
settings.register_profile("shared-cores", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-cores")


@pytest.fixture(autouse=True)
def child_pytest_without_this_suites_plugins(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest a test starts (the unit-test runner's, on a generated checkout seeing this
    interpreter's packages) loads only the plugins it names: by their entry points it would load this
    suite's own too, and hypothesis's import alone is about 1 s of CPU of each such run's 1.4
    (docs/development.md). Not in the hand-run tier (`slow`): a real vllm-ascend clone's tests use
    the plugins its venv installs. This process's plugins are loaded by now: only children see it."""
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def _engine_missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"container engine required in CI: {reason} (make test runs containers/setup-podman.sh)")
    pytest.skip(f"no container engine: {reason}; run containers/setup-podman.sh and export DOCKER_HOST")


@pytest.fixture(scope="session")
def verdict_stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the tests' own verdict stores, one for the session."""
    return tmp_path_factory.mktemp("stores")


@pytest.fixture(autouse=True)
def own_verdict_store(verdict_stores: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's `run` keeps and reuses verdicts in a store of its own: tests bisect the same
    generated histories (the same shas), and one test's verdicts must not answer another's steps.
    A folder of a random name in one session folder: a numbered `mktemp` per test lists the base
    temporary folder, which holds every test's folders, each time, a cost that grows with the square
    of the tests (docs/development.md)."""
    path = Path(tempfile.mkdtemp(dir=verdict_stores)) / "verdicts.sqlite"
    monkeypatch.setenv("BISECT_NPU_VERDICT_STORE", str(path))
    return path


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client for DOCKER_HOST's engine (podman here)."""
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        _engine_missing(str(exc).splitlines()[0][:200])
    yield client
    client.close()


@pytest.fixture(scope="session")
def demo_base_image(docker_client) -> str:
    """The demo's locally made base image (containers/make-base-image.sh builds it once, cached)."""
    import docker.errors

    try:
        docker_client.images.get(DEMO_BASE_IMAGE)
    except docker.errors.ImageNotFound:
        done = subprocess.run(["bash", str(REPO_ROOT / "containers" / "make-base-image.sh")],
                              cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            _engine_missing(f"make-base-image.sh failed: {done.stderr.strip()[-300:]}")
    return DEMO_BASE_IMAGE


@pytest.fixture()
def one_commit_upstream(tmp_path, docker_client, demo_base_image):
    """(path, sha) of a one-commit repository whose Dockerfile only copies its tree, unique to the
    test (nothing of an earlier run is reused); its images removed from the engine afterwards."""
    import uuid

    import git

    from tests.helpers.gitrepo import make_linear_repo

    path = tmp_path / f"upstream-{uuid.uuid4().hex[:8]}"
    make_linear_repo(path, 1, files=lambda i: {"Dockerfile": f"FROM {demo_base_image}\nCOPY . /workspace/app\n",
                                               "app.py": f"NONCE = {uuid.uuid4().hex!r}\n"})
    commit = git.Repo(path).head.commit.hexsha
    yield path, commit
    for image in docker_client.api.images(filters={"label": f"org.bisect-npu.commit={commit}"}):
        docker_client.api.remove_image(image["Id"], force=True)


@pytest.fixture(scope="session")
def demo_upstream(tmp_path_factory):
    """The demo upstream (seed 0) generated once per test session: (repository path, manifest)."""
    from bisect_npu.demo.generate import generate_upstream

    repo = tmp_path_factory.mktemp("demo") / "upstream"
    return repo, generate_upstream(repo, seed=0)


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Path]:
    """`fresh_venv(dest)` makes a fresh venv with pip at `dest`: a copy of one `python -m venv` made
    once per test session (tests/helpers/venvs.py), not ensurepip again for each."""
    seed = make_seed(tmp_path_factory.mktemp("venv-seed") / "venv")
    return lambda dest: copy_venv(seed, dest)
