"""DockerExecutor on a real engine: the spec's translation runs, timeouts and signals leave nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.execute.docker import (
    SESSION_LABEL,
    ContainerSpec,
    DockerExecutor,
    Mount,
    container_create_kwargs,
    plain_container_spec,
)
from tests.helpers.paths import REPO_ROOT
from tests.helpers.signals import interruptible

pytestmark = pytest.mark.container


def session_containers(client, session_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"})


@pytest.fixture()
def executor(docker_client):
    ex = DockerExecutor(docker_client, session_id=f"test-{uuid.uuid4().hex[:8]}")
    yield ex
    ex.close()


@pytest.fixture()
def env(demo_base_image) -> Environment:
    return Environment(kind="image", commit="c0ffee" * 6 + "beef", image=demo_base_image)


def test_command_runs_in_its_own_container(docker_client, demo_base_image, env, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "input.txt").write_text("from the host\n")

    def spec(image: str, out_dir: Path) -> ContainerSpec:
        base = plain_container_spec(image, out_dir)
        return base.model_copy(update={"environment": {"GREETING": "hello"},
                                       "mounts": [*base.mounts, Mount(source=str(shared), target="/shared")]})

    ex = DockerExecutor(docker_client, spec, session_id=f"test-{uuid.uuid4().hex[:8]}")
    script = ("import os, pathlib, socket\n"
              "text = os.environ['GREETING'] + ' ' + open('/shared/input.txt').read()\n"
              "pathlib.Path('/out/result.txt').write_text(text)\n"
              "try:\n    open('/shared/x', 'w')\nexcept OSError as e:\n    print('read-only:', e.errno)\n"
              "print('interfaces:', sorted(n for _, n in socket.if_nameindex()))\n")
    result = ex.run_command(env, ["python3", "-c", script], tmp_path / "run" / "cmd.log", timeout_s=120)
    assert result.returncode == 0, result.log_tail
    assert (tmp_path / "run" / "result.txt").read_text() == "hello from the host\n"
    log = Path(result.log_path).read_text()
    assert "read-only: 30" in log  # EROFS: the mount is read-only
    assert "interfaces: ['lo']" in log  # network none: loopback only
    assert not (shared / "x").exists()
    assert session_containers(docker_client, ex.session_id) == []


ATB_LIKE_ENTRYPOINT = """FROM {base}
RUN printf 'export LCCL_DETERMINISTIC=0\\nexport ATB_MATMUL_SHUFFLE_K_ENABLE=1\\n' > /etc/set_env.sh
RUN printf 'export LD_LIBRARY_PATH=/cann/lib:$LD_LIBRARY_PATH\\n' >> /etc/set_env.sh
ENTRYPOINT ["/bin/bash", "-c", "source /etc/set_env.sh && exec \\"$@\\"", "--"]
"""


def test_the_spec_s_environment_survives_an_entrypoint_that_overwrites_it(docker_client, demo_base_image, tmp_path):
    # CANN's images source ATB's set_env.sh in their entrypoint, which exports the opposite of the
    # determinism switches; the command must still see what the spec set.
    import io

    tag = f"localhost/bisect-npu-test-entrypoint:{uuid.uuid4().hex[:8]}"
    dockerfile = ATB_LIKE_ENTRYPOINT.format(base=demo_base_image).encode()
    docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
    try:
        def spec(image: str, out_dir: Path) -> ContainerSpec:
            return plain_container_spec(image, out_dir).model_copy(
                update={"environment": {"LCCL_DETERMINISTIC": "1", "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
                                        "LD_LIBRARY_PATH": "/opt/extra/lib"}})

        ex = DockerExecutor(docker_client, spec, session_id=f"test-{uuid.uuid4().hex[:8]}")
        show = ("import os; print('seen', os.environ['LCCL_DETERMINISTIC'], os.environ['ATB_MATMUL_SHUFFLE_K_ENABLE'], "
                "os.environ['LD_LIBRARY_PATH'])")
        image_env = Environment(kind="image", commit="c0ffee" * 6 + "beef", image=tag)
        result = ex.run_command(image_env, ["python3", "-c", show], tmp_path / "cmd.log", timeout_s=120)
        assert result.returncode == 0, result.log_tail
        # The spec's values win; a *PATH the entrypoint extended keeps its entries after the spec's.
        assert "seen 1 0 /opt/extra/lib:/cann/lib" in Path(result.log_path).read_text()
        missing = ex.run_command(image_env, ["no-such-program"], tmp_path / "missing.log", timeout_s=120)
        assert missing.returncode == 255 and "cannot start no-such-program" in missing.log_tail
        bare = docker_client.containers.run(tag, ["python3", "-c", show], remove=True,
                                            environment={"LCCL_DETERMINISTIC": "1"})
        assert b"seen 0 1 /cann/lib:" in bare  # what the command would see without the shim
    finally:
        docker_client.images.remove(tag, force=True)


def test_exit_code_comes_back(executor, env, tmp_path):
    result = executor.run_command(env, ["python3", "-c", "import sys; print('bye'); sys.exit(7)"],
                                  tmp_path / "cmd.log", timeout_s=120)
    assert (result.returncode, result.timed_out) == (7, False)
    assert "bye" in result.log_tail


def test_probe_module_runs_from_the_read_only_mount(docker_client, executor, env, tmp_path):
    result = executor.run_probe(env, {"schema_version": 1, "backend": "no-such-backend", "case_id": "c1"},
                                tmp_path / "out", timeout_s=120)
    assert result.returncode == 2
    assert "unknown probe backend 'no-such-backend'" in result.log_tail
    request = json.loads((tmp_path / "out" / "request-c1-t0.json").read_text())
    assert request["output"] == "/out/obs-c1-t0.json"  # the container's view of the output directory
    assert result.observation is None
    assert session_containers(docker_client, executor.session_id) == []


def test_batch_outputs_are_the_container_s_paths(docker_client, executor, env, tmp_path):
    request = {"schema_version": 1, "backend": "no-such-backend", "case_id": "c1", "trial": 4,
               "batch": [{"trial": 4, "seed": 4, "output": ""}, {"trial": 5, "seed": 5, "output": ""}]}
    result = executor.run_probe(env, request, tmp_path / "out", timeout_s=120)
    assert result.returncode == 2  # the probe read the batch request (and refused the backend)
    written = json.loads((tmp_path / "out" / "request-c1-t4.json").read_text())
    assert written["output"] == "/out/obs-c1-t4.json"
    assert [entry["output"] for entry in written["batch"]] == ["/out/obs-c1-t4.json", "/out/obs-c1-t5.json"]
    assert (tmp_path / "out" / "probe-c1-t4.log").exists()


def test_spec_for_adds_probe_mount_labels_and_command(executor, env, tmp_path):
    spec = executor.spec_for(env, ["python3", "/out/r.json"], tmp_path)
    kwargs = container_create_kwargs(spec)
    probe = str(REPO_ROOT / "bisect_npu" / "probe")
    assert kwargs["volumes"][probe] == {"bind": "/opt/bisect-npu/bisect_npu_probe", "mode": "ro"}
    assert kwargs["volumes"][str(tmp_path)] == {"bind": "/out", "mode": "rw"}
    assert kwargs["labels"][SESSION_LABEL] == executor.session_id
    assert "PYTHONPATH" not in kwargs["environment"]  # the image's own PYTHONPATH (CANN sets one) stays
    assert (kwargs["network_mode"], kwargs["privileged"], kwargs["devices"]) == ("none", False, [])


def test_timeout_kills_and_removes_the_container(docker_client, executor, env, tmp_path):
    started = time.monotonic()
    result = executor.run_command(env, ["sleep", "120"], tmp_path / "cmd.log", timeout_s=3)
    assert result.timed_out and result.returncode == 124
    assert time.monotonic() - started < 60
    assert session_containers(docker_client, executor.session_id) == []


DRIVER = """
import sys
from pathlib import Path
import docker
from bisect_npu.builders.base import Environment
from bisect_npu.execute.docker import DockerExecutor
ex = DockerExecutor(docker.from_env(timeout=600), session_id=sys.argv[1])
env = Environment(kind="image", commit="0" * 40, image=sys.argv[2])
try:
    ex.run_command(env, ["sleep", "300"], Path(sys.argv[3]), timeout_s=600)
except KeyboardInterrupt:
    sys.exit(130)
"""


@contextlib.contextmanager
def driving_a_container(docker_client, image: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """A process running DRIVER (its own session id), once its container runs; cleaned up after."""
    session_id = f"test-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen([sys.executable, "-c", DRIVER, session_id, image, str(tmp_path / "cmd.log")],
                             preexec_fn=interruptible, cwd=REPO_ROOT, env={**os.environ})
    try:
        deadline = time.monotonic() + 90
        while not [c for c in session_containers(docker_client, session_id) if c.status == "running"]:
            assert time.monotonic() < deadline and child.poll() is None, "the container never started"
            time.sleep(0.3)
        yield child, session_id
    finally:
        if child.poll() is None:
            child.kill()
        for container in session_containers(docker_client, session_id):
            container.remove(force=True)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_driving_process_removes_its_container(docker_client, demo_base_image, tmp_path, signum):
    with driving_a_container(docker_client, demo_base_image, tmp_path) as (child, session_id):
        child.send_signal(signum)
        assert child.wait(timeout=60) == 130
        assert session_containers(docker_client, session_id) == []


def test_a_sigkilled_driver_s_container_goes_when_its_session_resumes(docker_client, demo_base_image, tmp_path):
    """SIGKILL leaves no chance to clean up: the container runs on (on an NPU host, holding its
    cards); the executor a resumed session makes sweeps it before running anything."""
    with driving_a_container(docker_client, demo_base_image, tmp_path) as (child, session_id):
        child.kill()
        child.wait(timeout=60)
        assert [c.status for c in session_containers(docker_client, session_id)] == ["running"]
        assert DockerExecutor(docker_client, session_id=session_id).sweep() == 1
        assert session_containers(docker_client, session_id) == []


def test_a_container_removed_under_a_run_is_an_infrastructure_error_not_a_verdict(docker_client, executor, env,
                                                                                 tmp_path):
    """Podman answers a wait on a container someone removed with exit status 0 and an error: that
    must never read as "the command passed"."""
    from concurrent.futures import ThreadPoolExecutor

    from bisect_npu.errors import InfrastructureError

    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(executor.run_command, env, ["sleep", "120"], tmp_path / "cmd.log", 300)
        deadline = time.monotonic() + 90
        while not (running := [c for c in session_containers(docker_client, executor.session_id)
                               if c.status == "running"]):
            assert time.monotonic() < deadline, "the container never started"
            time.sleep(0.3)
        running[0].remove(force=True)
        with pytest.raises(InfrastructureError, match="went away during the run"):
            run.result(timeout=120)


def test_a_name_that_now_holds_another_commit_s_image_runs_nothing(docker_client, executor, demo_base_image,
                                                                   tmp_path):
    """A candidate's image is named by a tag any session on the engine may move (a prune and a
    rebuild, another build of the same key): the image it names now carries another commit's
    label. Running it would judge that commit under the candidate's name; the run stops instead,
    no container made. The image of the candidate's own label runs."""
    import io

    from bisect_npu.errors import InfrastructureError

    other, candidate = "0ther" * 8, "cand1" * 8
    tag = f"bisect-npu/moved-{uuid.uuid4().hex[:8]}:commit-{candidate[:12]}"
    dockerfile = f"FROM {demo_base_image}\nLABEL org.bisect-npu.commit={other}\n".encode()
    list(docker_client.api.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True, pull=False, decode=True))
    try:
        moved = Environment(kind="image", commit=candidate, image=tag)
        with pytest.raises(InfrastructureError, match=f"now holds commit {other[:12]}, not the candidate"):
            executor.run_command(moved, ["true"], tmp_path / "cmd.log", timeout_s=120)
        assert session_containers(docker_client, executor.session_id) == []
        own = Environment(kind="image", commit=other, image=tag)
        result = executor.run_command(own, ["true"], tmp_path / "own.log", timeout_s=120)
        image_id = docker_client.images.get(tag).id.removeprefix("sha256:")[:12]
        assert result.returncode == 0 and f"(image {image_id})" in Path(result.log_path).read_text()
    finally:
        docker_client.images.remove(tag, force=True)


def test_a_dependency_layer_runs_by_its_key_and_is_refused_under_another_layer_s_name(docker_client, executor,
                                                                                    demo_base_image, tmp_path):
    """A dependency's layer carries its upstream commit's label, not the candidate's (a dependency
    commit): it runs under the name of its own key, and a name that another key's layer took
    runs nothing."""
    import io

    from bisect_npu.builders.base import layer_tag
    from bisect_npu.errors import InfrastructureError

    upstream, candidate, repository = "up5tr" * 8, "dep01" * 8, f"bisect-npu/layer-{uuid.uuid4().hex[:8]}"
    key, other_key = f"{upstream[:16]}-vllm-{candidate[:16]}", f"{upstream[:16]}-vllm-{'0ther' * 3}"
    dockerfile = (f"FROM {demo_base_image}\nLABEL org.bisect-npu.commit={upstream} org.bisect-npu.kind=dependency "
                  f"org.bisect-npu.key={key}\n").encode()
    own, taken = f"{repository}:{layer_tag(key)}", f"{repository}:{layer_tag(other_key)}"
    list(docker_client.api.build(fileobj=io.BytesIO(dockerfile), tag=own, rm=True, pull=False, decode=True))
    docker_client.api.tag(own, repository, layer_tag(other_key))
    try:
        result = executor.run_command(Environment(kind="image", commit=candidate, image=own), ["true"],
                                      tmp_path / "own.log", timeout_s=120)
        assert result.returncode == 0
        with pytest.raises(InfrastructureError, match=f"now holds the layer {key}, not the candidate"):
            executor.run_command(Environment(kind="image", commit=candidate, image=taken), ["true"],
                                 tmp_path / "taken.log", timeout_s=120)
    finally:
        docker_client.images.remove(taken)
        docker_client.images.remove(own, force=True)


def test_a_spec_the_engine_refuses_is_an_infrastructure_error_naming_why(docker_client, demo_base_image, tmp_path):
    """An Ascend spec on a host without the cards: the engine's refusal comes back in one line (exit 5
    through the CLI), not as a traceback."""
    from bisect_npu.errors import InfrastructureError

    def spec(image: str, out_dir: Path) -> ContainerSpec:
        return plain_container_spec(image, out_dir).model_copy(update={"devices": ["/dev/davinci-not-here"]})

    ex = DockerExecutor(docker_client, spec, session_id=f"test-{uuid.uuid4().hex[:8]}")
    env = Environment(kind="image", commit="c0ffee" * 6 + "beef", image=demo_base_image)
    with pytest.raises(InfrastructureError, match=r"refused a container of .* with devices /dev/davinci-not-here"):
        ex.run_command(env, ["true"], tmp_path / "cmd.log", 60)
    assert session_containers(docker_client, ex.session_id) == []
