"""BuildKey: follows the compiled inputs and the Dockerfile, ignores pure Python changes."""

from __future__ import annotations

import os
from pathlib import Path

import git
import pytest

from bisect_npu.builders.docker import context_source_dir
from bisect_npu.builders.key import build_key, distinct_keys, is_compiled_input
from tests.helpers.gitrepo import add_commit, make_linear_repo

DOCKERFILE = """FROM quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG COMPILE_CUSTOM_KERNELS=1
COPY . /vllm-workspace/vllm-ascend/
ARG VLLM_REPO=https://github.com/vllm-project/vllm.git
ARG VLLM_TAG=v0.9.1
RUN git clone --depth 1 $VLLM_REPO --branch $VLLM_TAG /vllm-workspace/vllm
"""

PYPROJECT = """[build-system]
requires = ["setuptools>=64", "torch-npu==2.5.1.post1"]
build-backend = "setuptools.build_meta"

[tool.ruff]
exclude = ["a"]
"""



@pytest.fixture()
def repo(tmp_path: Path) -> tuple[Path, git.Repo, str]:
    path = tmp_path / "vllm-ascend"
    make_linear_repo(path, 1, files=lambda i: {
        "Dockerfile": DOCKERFILE, "csrc/kernels/add.cpp": "int add();\n", "CMakeLists.txt": "project(x)\n",
        "setup.py": "setup()\n", "requirements.txt": "torch\n", "vllm_ascend/worker.py": "A = 1\n",
        "pyproject.toml": PYPROJECT})
    return path, git.Repo(path), git.Repo(path).head.commit.hexsha


def commit(path: Path, files: dict[str, str | None]) -> str:
    return add_commit(path, "change (#1)", files)


def test_python_only_change_keeps_the_key(repo):
    path, r, first = repo
    second = commit(path, {"vllm_ascend/worker.py": "A = 2\n", "vllm_ascend/new.py": "B = 1\n", "README.md": "x\n",
                           "pyproject.toml": PYPROJECT.replace('exclude = ["a"]', 'exclude = ["a", "b"]')})
    assert build_key(r, first).digest == build_key(r, second).digest


@pytest.mark.parametrize("change", [
    {"csrc/kernels/add.cpp": "int add(int);\n"},
    {"csrc/kernels/mul.cpp": "int mul();\n"},
    {"CMakeLists.txt": "project(y)\n"},
    {"cmake/utils.cmake": "set(A 1)\n"},
    {"setup.py": "setup(name='x')\n"},
    {"requirements.txt": "torch==2.5.1\n"},
    {"requirements-dev.txt": "pytest\n"},
    {"Dockerfile": DOCKERFILE.replace("cann:8.1.rc1-910b-ubuntu22.04-py3.10", "cann:8.2.rc1-910b-ubuntu22.04-py3.11")},
    {"Dockerfile": DOCKERFILE.replace("VLLM_TAG=v0.9.1", "VLLM_TAG=v0.9.2")},
    {".gitmodules": '[submodule "catlass"]\n\tpath = csrc/third_party/catlass\n\turl = https://x/other.git\n'},
    {"pyproject.toml": PYPROJECT.replace("torch-npu==2.5.1.post1", "torch-npu==2.7.1")},
])
def test_compiled_or_dockerfile_change_moves_the_key(repo, change):
    path, r, first = repo
    second = commit(path, change)
    assert build_key(r, first).digest != build_key(r, second).digest


def test_inputs_name_base_image_and_vllm_tag(repo):
    path, r, first = repo
    second = commit(path, {"Dockerfile": DOCKERFILE.replace("VLLM_TAG=v0.9.1", "VLLM_TAG=v0.9.2")})
    before, after = build_key(r, first), build_key(r, second)
    assert before.inputs["base_image"] == "quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10"
    assert (before.inputs["vllm_tag"], after.inputs["vllm_tag"]) == ("v0.9.1", "v0.9.2")
    assert before.inputs["tree:csrc"] == r.commit(first).tree["csrc"].hexsha


def test_build_args_are_part_of_the_key(repo):
    _, r, first = repo
    assert build_key(r, first, {"COMPILE_CUSTOM_KERNELS": "0"}).digest != build_key(r, first).digest
    assert build_key(r, first, {"COMPILE_CUSTOM_KERNELS": "0"}).inputs["arg:COMPILE_CUSTOM_KERNELS"] == "0"


def test_distinct_keys_groups_a_range(repo):
    path, r, first = repo
    python_a = commit(path, {"vllm_ascend/worker.py": "A = 3\n"})
    kernel = commit(path, {"csrc/kernels/add.cpp": "int add(long);\n"})
    python_b = commit(path, {"vllm_ascend/worker.py": "A = 4\n"})
    removed = commit(path, {"csrc/kernels/add.cpp": "int add();\n"})  # back to the first kernel source
    groups = distinct_keys(r, [first, python_a, kernel, python_b, removed])
    assert sorted(groups.values(), key=len) == [[kernel, python_b], [first, python_a, removed]]


def test_commit_without_dockerfile_has_a_key(tmp_path):
    path = tmp_path / "plain"
    shas = make_linear_repo(path, 2)
    r = git.Repo(path)
    assert build_key(r, shas[0]).inputs["dockerfile"] == "(none)"
    assert build_key(r, shas[0]).digest == build_key(r, shas[1]).digest


@pytest.mark.parametrize(("path", "compiled"), [
    ("csrc/a.cpp", True), ("cmake/x.cmake", True), ("CMakeLists.txt", True), ("setup.py", True),
    ("requirements-lint.txt", True), ("Dockerfile", True), ("docs/requirements-docs.txt", False),
    ("vllm_ascend/setup.py", False), ("vllm_ascend/ops/csrc.py", False), ("Dockerfile.a3", False),
    (".gitmodules", True), ("pyproject.toml", False),
])
def test_is_compiled_input(path, compiled):
    assert is_compiled_input(path) is compiled


def test_context_source_dir_reads_the_copy_of_the_context():
    assert context_source_dir(DOCKERFILE) == "/vllm-workspace/vllm-ascend"
    assert context_source_dir("FROM x\ncopy --chown=1:1 ./ /app\n") == "/app"
    assert context_source_dir("FROM x\nCOPY setup.py /app/\n") is None


def test_the_paired_vllm_is_what_the_build_args_make_it(repo):
    path, r, _ = repo
    # vllm-ascend main's Dockerfile: VLLM_COMMIT, when set, is fetched instead of the tag.
    sha = commit(path, {"Dockerfile": DOCKERFILE.replace("ARG VLLM_TAG=v0.9.1\n",
                                                         'ARG VLLM_TAG=v0.9.1\nARG VLLM_COMMIT=""\n')})
    assert build_key(r, sha).inputs["vllm_tag"] == "v0.9.1"
    assert build_key(r, sha, {"VLLM_TAG": "v0.9.2"}).inputs["vllm_tag"] == "v0.9.2"
    pinned = build_key(r, sha, {"VLLM_COMMIT": "0123abcd"})
    assert pinned.inputs["vllm_tag"] == "0123abcd"
    assert pinned.digest != build_key(r, sha).digest
    # An arg the Dockerfile does not declare is ignored by docker, and so here.
    assert build_key(r, first_of(r), {"VLLM_COMMIT": "0123abcd"}).inputs["vllm_tag"] == "v0.9.1"


def first_of(r: git.Repo) -> str:
    return next(r.iter_commits(rev="HEAD", reverse=True)).hexsha


def test_a_submodule_at_the_top_of_the_tree_is_read_not_a_crash(tmp_path: Path) -> None:
    """GitPython cannot give a top-level gitlink's `name`; the key reads paths."""
    import subprocess

    lib = tmp_path / "lib"
    make_linear_repo(lib, 1, files=lambda i: {"lib.h": "v1\n"})
    top = tmp_path / "top"
    make_linear_repo(top, 1, files=lambda i: {"Dockerfile": DOCKERFILE})
    subprocess.run(["git", "-C", str(top), "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib),
                    "sub"], check=True)
    sha = commit(top, {"CMakeLists.txt": "project(x)\n"})
    key = build_key(git.Repo(top), sha)
    assert "blob:CMakeLists.txt" in key.inputs and "blob:.gitmodules" in key.inputs


SETUP_LOADING_ENVS = '''import os
ROOT_DIR = str(TESTS)
envs = load_module_from_path("envs",
                             os.path.join(ROOT_DIR, "vllm_ascend", "envs.py"))
hardware = load_module_from_path(
    "vllm_ascend_hardware",
    os.path.join(ROOT_DIR, "vllm_ascend", "device", "hardware.py"),
)
build_info = os.path.join(ROOT_DIR, "vllm_ascend", "_build_info.py")
install_path = os.path.join(ROOT_DIR, "vllm_ascend")
'''


def test_files_setup_py_loads_are_in_the_key(tmp_path: Path) -> None:
    """vllm-ascend's setup.py loads vllm_ascend/envs.py (the build defaults) and, on main,
    vllm_ascend/device/hardware.py: a commit changing only one of them needs a full build."""
    path = tmp_path / "vllm-ascend"
    make_linear_repo(path, 1, files=lambda i: {
        "Dockerfile": DOCKERFILE, "setup.py": SETUP_LOADING_ENVS, "csrc/a.cpp": "int a();\n",
        "vllm_ascend/envs.py": 'COMPILE_CUSTOM_KERNELS = "1"\n', "vllm_ascend/device/hardware.py": "A2 = 1\n",
        "vllm_ascend/worker.py": "A = 1\n"})
    r = git.Repo(path)
    first = r.head.commit.hexsha
    envs_only = commit(path, {"vllm_ascend/envs.py": 'COMPILE_CUSTOM_KERNELS = "0"\n'})
    hardware_only = commit(path, {"vllm_ascend/device/hardware.py": "A2 = 2\n"})
    python_only = commit(path, {"vllm_ascend/worker.py": "A = 2\n"})
    keys = [build_key(r, sha) for sha in (first, envs_only, hardware_only, python_only)]
    assert keys[0].digest != keys[1].digest != keys[2].digest
    assert keys[2].digest == keys[3].digest
    assert sorted(k for k in keys[0].inputs if k.startswith("setup:")) == [
        "setup:vllm_ascend/device/hardware.py", "setup:vllm_ascend/envs.py"]  # not _build_info.py, not the package
    assert not is_compiled_input("vllm_ascend/envs.py")  # the overlay still lays it in: the candidate imports it


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("BISECT_NPU_VLLM_ASCEND"), reason="BISECT_NPU_VLLM_ASCEND names no clone")
def test_the_key_changes_where_only_envs_py_changed_on_the_real_history() -> None:
    """On vllm-ascend's own history (BISECT_NPU_VLLM_ASCEND=CLONE, run by hand): every first-parent
    commit of v0.9.1..v0.11.0 that changed vllm_ascend/envs.py and nothing else has its own key,
    and envs.py is the only key input that differs from its parent's."""
    from bisect_npu.builders.key import BuildKeyReader
    from bisect_npu.upstream import history

    repo = history.open_repo(os.environ["BISECT_NPU_VLLM_ASCEND"])
    reader = BuildKeyReader(repo)
    envs_only = [sha for sha in repo.git.log("--first-parent", "--format=%H", "v0.9.1rc1..v0.11.0", "--",
                                             "vllm_ascend/envs.py").split()
                 if repo.git.show("--name-only", "--format=", sha).split() == ["vllm_ascend/envs.py"]]
    assert envs_only
    for sha in envs_only:
        before, after = reader.key(f"{sha}^"), reader.key(sha)
        assert before.digest != after.digest, sha
        assert {k for k in after.inputs if after.inputs[k] != before.inputs.get(k)} == {"setup:vllm_ascend/envs.py"}
