"""A failed image build is the commit's fault (a skip) or its surroundings' (exit 5): read from the
engine's error and the failed step's output, on logs written as the tools write them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.builders.failures import classify_build_failure, registry_of
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo
from tests.helpers.paths import REPO_ROOT

PODMAN_PULL = ('creating build container: initializing source docker://quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-'
               'py3.10: pinging container registry quay.io: Get "https://quay.io/v2/": dial tcp: lookup quay.io on '
               '10.255.255.53:53: no such host\n')
PODMAN_PULL_LOG = ("STEP 1/9: FROM quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10\n"
                   "Trying to pull quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10...\n")
DOCKER_CLASSIC_PULL = ('Get "https://quay.io/v2/": dial tcp: lookup quay.io on 127.0.0.53:53: server misbehaving')
BUILDKIT_PULL = ('failed to solve: quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11: failed to resolve source '
                 'metadata for quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11: failed to do request: Head '
                 '"https://quay.io/v2/ascend/cann/manifests/8.2.rc1-910b-ubuntu22.04-py3.11": dial tcp 3.227.4.1:443: '
                 'i/o timeout')
MIRROR_LACKS_TAG = ("creating build container: initializing source docker://mirror.lab:5000/quay.io/ascend/cann:8.1.rc1"
                    "-910b-ubuntu22.04-py3.10: reading manifest 8.1.rc1-910b-ubuntu22.04-py3.10 in "
                    "mirror.lab:5000/quay.io/ascend/cann: manifest unknown")
DOCKER_HUB_DENIED = ("pull access denied for ascend/cann, repository does not exist or may require 'docker login': "
                     "denied: requested access to the resource is denied")
HTTP_MIRROR = ('creating build container: initializing source docker://127.0.0.1:5123/quay.io/ascend/cann:x: pinging '
               'container registry 127.0.0.1:5123: Get "https://127.0.0.1:5123/v2/": http: server gave HTTP response '
               'to HTTPS client')

PIP_OFFLINE = """STEP 8/12: RUN pip config set global.index-url ${PIP_INDEX_URL} && python3 -m pip install modelscope
Writing to /root/.config/pip/pip.conf
Looking in indexes: https://mirrors.tuna.tsinghua.edu.cn/pypi/web/simple
WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f1c2>: Failed to establish a new \
connection: [Errno -3] Temporary failure in name resolution')': /pypi/web/simple/modelscope/
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f1c3>: Failed to establish a new \
connection: [Errno -3] Temporary failure in name resolution')': /pypi/web/simple/modelscope/
ERROR: Could not find a version that satisfies the requirement modelscope (from versions: none)
ERROR: No matching distribution found for modelscope
Error: building at STEP "RUN pip config set ...": while running runtime: exit status 1
"""
PIP_POOL = """Step 6/11 : RUN python3 -m pip install -v -e /vllm-workspace/vllm/ --extra-index https://download.pytorch.org/whl/cpu/
ERROR: Could not install packages due to an OSError: HTTPSConnectionPool(host='download.pytorch.org', port=443): \
Max retries exceeded with url: /whl/cpu/torch/ (Caused by NewConnectionError('<pip._vendor.urllib3.connection.\
HTTPSConnection object at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused'))
"""
GIT_CLONE = """STEP 10/14: RUN git clone --depth 1 $VLLM_REPO --branch $VLLM_TAG /vllm-workspace/vllm
Cloning into '/vllm-workspace/vllm'...
fatal: unable to access 'https://github.com/vllm-project/vllm.git/': Could not resolve host: github.com
Error: building at STEP "RUN git clone --depth 1 $VLLM_REPO --branch $VLLM_TAG /vllm-workspace/vllm": while running \
runtime: exit status 128
"""
APT_OFFLINE = """STEP 5/14: RUN apt-get update -y && apt-get install -y python3-pip git
Ign:1 http://ports.ubuntu.com/ubuntu-ports jammy InRelease
Err:1 http://ports.ubuntu.com/ubuntu-ports jammy InRelease
  Temporary failure resolving 'ports.ubuntu.com'
E: Unable to locate package python3-pip
"""
DISK_FULL = """STEP 12/14: RUN source /usr/local/Ascend/ascend-toolkit/set_env.sh && python3 -m pip install -v -e .
  copying build/lib.linux-aarch64-cpython-311/vllm_ascend/vllm_ascend_C.so -> vllm_ascend
  error: [Errno 28] No space left on device: '/vllm-workspace/vllm-ascend/build/temp.linux-aarch64'
"""
GCC_ERROR = """STEP 12/14: RUN python3 -m pip install -v -e /vllm-workspace/vllm-ascend/
  [ 42%] Building CXX object CMakeFiles/vllm_ascend_C.dir/csrc/torch_binding.cpp.o
  /vllm-workspace/vllm-ascend/csrc/torch_binding.cpp:118:5: error: 'rotary_embedding_impl' was not declared in this \
scope
    118 |     rotary_embedding_impl(positions, query, key, head_size);
        |     ^~~~~~~~~~~~~~~~~~~~~
  make[2]: *** [CMakeFiles/vllm_ascend_C.dir/build.make:76: CMakeFiles/vllm_ascend_C.dir/csrc/binding.cpp.o] Error 1
  error: subprocess-exited-with-error
"""
GCC_AFTER_RETRIED_INDEX = """STEP 12/14: RUN python3 -m pip install -v -e /vllm-workspace/vllm-ascend/
WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f1c2>: Failed to establish a new \
connection: [Errno 101] Network is unreachable')': /simple/setuptools/
Collecting setuptools>=64
  Downloading setuptools-80.9.0-py3-none-any.whl (1.2 MB)
csrc/kernels/pos_encoding_kernels.cpp:57:12: fatal error: acl/acl_rt.h: No such file or directory
compilation terminated.
"""
MISSING_COPY = ('COPY failed: file not found in build context or excluded by .dockerignore: stat '
                'requirements-npu.txt: file does not exist')
UNPINNABLE = """STEP 9/12: RUN python3 -m pip install -r requirements.txt
Looking in indexes: https://pypi.org/simple
ERROR: Could not find a version that satisfies the requirement torch-npu==2.5.1.post9 (from versions: 2.1.0, \
2.4.0, 2.5.1)
ERROR: No matching distribution found for torch-npu==2.5.1.post9
"""


@pytest.mark.parametrize(("error", "log", "registry", "image", "reason"), [
    (PODMAN_PULL, PODMAN_PULL_LOG, "quay.io", "quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10",
     "the name does not resolve"),
    (DOCKER_CLASSIC_PULL, "Step 1/9 : FROM quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10\n", "quay.io",
     "quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10", "the name does not resolve"),
    (BUILDKIT_PULL, "", "quay.io", "quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11", "timed out"),
    (MIRROR_LACKS_TAG, "", "mirror.lab:5000", "mirror.lab:5000/quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10",
     "no such image or tag there"),
    (DOCKER_HUB_DENIED, "", "docker.io", "ascend/cann", "access denied"),
    (HTTP_MIRROR, "", "127.0.0.1:5123", "127.0.0.1:5123/quay.io/ascend/cann:x", "plain HTTP"),
])
def test_a_base_image_that_cannot_be_pulled_is_infrastructure(error, log, registry, image, reason):
    failure = classify_build_failure(error, log)
    assert failure is not None
    assert failure.cause.startswith(f"the base image {image} could not be pulled from {registry} (")
    assert reason in failure.cause
    assert registry in failure.next_step
    assert failure.message("b.log").endswith("then `bisect-npu resume` continues the session")


@pytest.mark.parametrize(("log", "host", "tool"), [
    (PIP_OFFLINE, "mirrors.tuna.tsinghua.edu.cn", "pip"),
    (PIP_POOL, "download.pytorch.org", "pip"),
    (GIT_CLONE, "github.com", "git"),
    (APT_OFFLINE, "ports.ubuntu.com", "apt"),
])
def test_an_unreachable_index_or_git_host_during_the_build_is_infrastructure(log, host, tool):
    failure = classify_build_failure("while running runtime: exit status 1", log)
    assert failure is not None
    assert failure.cause.startswith(f"the build could not reach {host} ({tool}: ")
    assert "PIP_INDEX_URL" in failure.next_step and "VLLM_REPO" in failure.next_step


def test_a_full_disk_is_infrastructure():
    failure = classify_build_failure("exit status 1", DISK_FULL)
    assert failure is not None and "disk is full" in failure.cause and "--cache-size" in failure.next_step
    assert classify_build_failure("write /var/lib/containers/storage/overlay/x: no space left on device") is not None


@pytest.mark.parametrize(("error", "log"), [
    ("exit status 1", GCC_ERROR),
    ("exit status 1", GCC_AFTER_RETRIED_INDEX),
    (MISSING_COPY, "STEP 7/12: COPY requirements-npu.txt /tmp/\n"),
    ("exit status 1", UNPINNABLE),
])
def test_the_commits_own_breakage_stays_a_skip(error, log):
    assert classify_build_failure(error, log) is None


def test_a_pull_error_earlier_in_the_log_does_not_blame_a_later_step():
    log = PODMAN_PULL_LOG + "Getting image source signatures\n" + GCC_ERROR
    assert classify_build_failure("exit status 1", log) is None


def test_registry_of():
    assert registry_of("quay.io/ascend/cann:8.1") == "quay.io"
    assert registry_of("127.0.0.1:5000/quay.io/ascend/cann:8.1") == "127.0.0.1:5000"
    assert registry_of("localhost/bisect-npu-demo-base:py311") == "localhost"
    assert registry_of("ubuntu:22.04") == "docker.io" and registry_of("ascend/cann:x") == "docker.io"


UNPULLABLE = "quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10"  # no network here: never pulls


def candidate_repo(path: Path, base_image: str, broken: int | None = None, run: str = "") -> list[str]:
    """Three commits whose Dockerfile compiles csrc/prog.c on `base_image` (after the RUN step
    `run`, when given); commit `broken` has a compile error; `state` turns bad at commit 2."""
    def files(i: int) -> dict[str, str]:
        source = "int main(void) { return 0; }\n" if i != broken else "int main(void) { return undeclared; }\n"
        first = f"RUN {run}\n" if run else ""
        return {"Dockerfile": f"FROM {base_image}\n{first}WORKDIR /src\nCOPY . /src\nRUN cc -o /tmp/prog csrc/prog.c\n",
                "csrc/prog.c": source}
    return make_linear_repo(path, 3, culprit=2, files=files)


def run_docker(repo: Path, shas: list[str], session: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", shas[0],
                           "--bad", shas[-1], "--cmd", " ".join(GOOD_CMD), "--executor", "docker", "--no-fix",
                           "--session", str(session), "--quiet", *extra],
                          cwd=repo, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


@pytest.mark.container
def test_a_from_that_cannot_be_pulled_ends_the_run_with_exit_5_naming_the_registry(docker_client, tmp_path):
    shas = candidate_repo(tmp_path / "repo", UNPULLABLE)
    done = run_docker(tmp_path / "repo", shas, tmp_path / "s", "--retries", "0")  # no backoff to wait through
    assert done.returncode == 5, done.stdout + done.stderr
    assert "could not be built, 1 attempt failed on the network" in done.stderr
    assert f"the base image {UNPULLABLE} could not be pulled from quay.io (the name does not resolve)" in done.stderr
    assert "--base-image-map quay.io=MIRROR/quay.io" in done.stderr and "bisect-npu resume" in done.stderr
    journal = [json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    assert [e["type"] for e in journal] == ["header", "retry"]  # no step was recorded as a skip
    assert (journal[1]["stage"], journal[1]["kind"]) == ("build", "network")


@pytest.mark.container
# Ten of its 16 s are --cmd's default 10-s backoff. In make test: the same stop through the local builder
# (test_build_retries.py's test_a_session_whose_index_never_answers_stops_with_exit_5_naming_the_network: the
# same messages, attempts and no step) and the docker builder's network stop (the unpullable FROM above).
@pytest.mark.heavy
def test_a_run_step_whose_index_is_out_of_reach_is_built_again_then_stops_with_exit_5(docker_client,
                                                                                       demo_base_image, tmp_path):
    """pip inside the image build meets a closed port (the container's own loopback): the build
    is tried again (--retries 1), then the run stops naming the index, at the first step built."""
    fetch = "python -m pip download --isolated --no-deps --retries 1 --timeout 5 -i http://127.0.0.1:9/simple/ tinydep"
    shas = candidate_repo(tmp_path / "repo", demo_base_image, run=fetch)
    done = run_docker(tmp_path / "repo", shas, tmp_path / "s", "--retries", "1")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "could not be built, 2 attempts failed on the network" in done.stderr
    assert "could not reach 127.0.0.1:9 (pip: NewConnectionError)" in done.stderr
    journal = [json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    retries = [e for e in journal if e["type"] == "retry"]
    assert [(e["attempt"], e["stage"]) for e in retries] == [(1, "build"), (2, "build")]
    assert all("Connection refused" in (tmp_path / "s" / e["log"]).read_text() for e in retries)
    assert not any(e["type"] == "step" for e in journal)


@pytest.mark.container
def test_a_compile_error_is_still_a_skip(docker_client, demo_base_image, tmp_path):
    shas = candidate_repo(tmp_path / "repo", demo_base_image, broken=1)
    done = run_docker(tmp_path / "repo", shas, tmp_path / "s")
    assert done.returncode == 3, done.stdout + done.stderr  # the culprit is 1 or 2: 1 could not be built
    steps = [json.loads(line) for line in (tmp_path / "s" / "journal.jsonl").read_text().splitlines()]
    skipped = [s for s in steps if s["type"] == "step" and s["verdict"]["kind"] == "skip"]
    assert [s["commit"] for s in skipped] == [shas[1]]
    assert skipped[0]["verdict"]["reason"].startswith("build failed: image build failed")
    assert "undeclared" in skipped[0]["verdict"]["figures"]["log_tail"]
