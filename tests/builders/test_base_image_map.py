"""--base-image-map: a candidate's FROM lines through a lab's mirrors, in the build context only;
recorded in the build key and the reproduce line."""

from __future__ import annotations

import git
import pytest

from bisect_npu.builders.key import BuildKeyReader
from bisect_npu.builders.registry import BaseImageMap, split_reference
from bisect_npu.errors import UsageError
from bisect_npu.request import RunRequest
from tests.helpers.gitrepo import make_linear_repo

MIRROR = BaseImageMap.parse(["quay.io=mirror.lab:5000/quay.io", "quay.io/ascend/cann=cann.lab/cann",
                             "docker.io=hub.lab"])

# vllm-ascend main's Dockerfile names the CANN image through global ARGs; v0.9.1's is a literal.
MAIN_STYLE = """ARG CANN_QUAY_URL="quay.io/ascend/cann"
ARG CANN_VERSION="9.1.0"
ARG BASE_OS="ubuntu22.04"
FROM ${CANN_QUAY_URL}:${CANN_VERSION}-910b-${BASE_OS}-py3.12
ARG PIP_INDEX_URL="https://mirrors.tuna.tsinghua.edu.cn/pypi/web/simple"
RUN pip config set global.index-url ${PIP_INDEX_URL}
"""
MULTI_STAGE = """FROM --platform=linux/arm64 quay.io/ascend/manylinux:8.1-py3.11 AS builder
RUN make
FROM builder AS tested
FROM ubuntu:22.04
COPY --from=builder /out /out
"""


def test_the_longest_prefix_wins_on_whole_name_components():
    assert MIRROR.apply("quay.io/ascend/cann:8.1.rc1-910b-ubuntu22.04-py3.10") == \
        "cann.lab/cann:8.1.rc1-910b-ubuntu22.04-py3.10"
    assert MIRROR.apply("quay.io/ascend/vllm-ascend:v0.9.1") == "mirror.lab:5000/quay.io/ascend/vllm-ascend:v0.9.1"
    assert MIRROR.apply("quay.io.example/x:1") == "quay.io.example/x:1"
    assert MIRROR.apply("ubuntu:22.04") == "hub.lab/library/ubuntu:22.04"
    assert MIRROR.apply("localhost/base:py311") == "localhost/base:py311"
    assert not BaseImageMap.parse([]) and BaseImageMap.parse([]).apply("quay.io/x") == "quay.io/x"


def test_the_command_line_adds_to_and_overrides_the_recipe():
    merged = BaseImageMap.parse(["quay.io=b.lab/quay.io"], {"quay.io": "a.lab/quay.io", "ghcr.io": "g.lab"})
    assert merged.entries() == ["quay.io=b.lab/quay.io", "ghcr.io=g.lab"]
    for bad in ("quay.io", "=mirror", "quay.io=", "a=b=c"):
        with pytest.raises(UsageError, match="expected PREFIX=MIRROR"):
            BaseImageMap.parse([bad])


def test_from_lines_are_rewritten_with_their_args_resolved():
    text = MIRROR.rewrite_dockerfile(MAIN_STYLE)
    assert "FROM cann.lab/cann:9.1.0-910b-ubuntu22.04-py3.12\n" in text
    assert text.replace("FROM cann.lab/cann:9.1.0-910b-ubuntu22.04-py3.12",
                        "FROM ${CANN_QUAY_URL}:${CANN_VERSION}-910b-${BASE_OS}-py3.12") == MAIN_STYLE
    # A build arg changes what the FROM resolves to, as it would in the build.
    assert "FROM cann.lab/cann:8.3.rc1-910b-ubuntu22.04-py3.12\n" in MIRROR.rewrite_dockerfile(
        MAIN_STYLE, {"CANN_VERSION": "8.3.rc1"})
    staged = MIRROR.rewrite_dockerfile(MULTI_STAGE)
    first = "FROM --platform=linux/arm64 mirror.lab:5000/quay.io/ascend/manylinux:8.1-py3.11 AS builder"
    assert staged.splitlines()[0] == first
    assert "FROM builder AS tested\n" in staged and "FROM hub.lab/library/ubuntu:22.04\n" in staged
    assert BaseImageMap().rewrite_dockerfile(MAIN_STYLE) == MAIN_STYLE


def test_the_map_is_part_of_the_build_key_only_where_it_changes_the_base(tmp_path):
    shas = make_linear_repo(tmp_path / "r", 2, files=lambda i: {
        "Dockerfile": "FROM quay.io/ascend/cann:8.1\n" if i == 0 else "FROM localhost/base:1\n"})
    repo = git.Repo(tmp_path / "r")
    plain, mapped = BuildKeyReader(repo), BuildKeyReader(repo, base_images=MIRROR.apply)
    assert mapped.key(shas[0]).inputs["base_image_pulled"] == "cann.lab/cann:8.1"
    assert mapped.key(shas[0]).digest != plain.key(shas[0]).digest
    assert mapped.key(shas[1]) == plain.key(shas[1])  # nothing mapped: the key an unmapped run had


def test_the_reproduce_line_keeps_the_map():
    request = RunRequest.of(good="a", bad="b", executor="docker", base_image_map=MIRROR.entries())
    argv = request.run_argv()
    assert argv[argv.index("--base-image-map") + 1] == "quay.io/ascend/cann=cann.lab/cann"
    assert argv.count("--base-image-map") == 3
    assert RunRequest.model_validate_json(request.model_dump_json()).executor.base_image_map == MIRROR.entries()


def test_split_reference():
    assert split_reference("127.0.0.1:5000/mirror/base:py311") == ("127.0.0.1:5000/mirror/base", "py311")
    assert split_reference("127.0.0.1:5000/mirror/base") == ("127.0.0.1:5000/mirror/base", "latest")
    assert split_reference("quay.io/x@sha256:ab") == ("quay.io/x@sha256:ab", None)
