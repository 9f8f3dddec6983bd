"""Release images as full builds: which tags are releases, which keys they stand for, which
recorded commit makes an image usable."""

from __future__ import annotations

import git
import pytest

from bisect_npu.builders.key import BuildKeyReader
from bisect_npu.builders.registry import BaseImageMap
from bisect_npu.builders.releases import (
    OCI_REVISION,
    ReleaseImages,
    check_template,
    recorded_commit,
    release_tags,
)
from bisect_npu.errors import UsageError
from bisect_npu.forecast.plan import plan_range
from tests.helpers.gitrepo import make_linear_repo


@pytest.fixture
def repo(tmp_path) -> tuple[git.Repo, list[str]]:
    # csrc changes at 3: commits 0-2 share a key, 3-5 another; v0.2.0rc1 is a release, nightly is not.
    shas = make_linear_repo(tmp_path / "r", 6, files=lambda i: {
        "Dockerfile": "FROM quay.io/ascend/cann:8.1\nCOPY . /src/\n", "csrc/k.c": "1" if i < 3 else "2"},
        tags={0: "v0.1.0", 4: "v0.2.0rc1", 5: "nightly"})
    return git.Repo(tmp_path / "r"), shas


def test_release_tags_are_versions(repo):
    repo_, shas = repo
    assert release_tags(repo_) == {"v0.1.0": shas[0], "v0.2.0rc1": shas[4]}


def test_each_key_finds_the_release_images_through_the_map(repo):
    repo_, shas = repo
    image_map = BaseImageMap.parse(["quay.io=mirror.lab/quay.io"]).apply
    reader = BuildKeyReader(repo_, base_images=image_map)
    releases = ReleaseImages(repo_, "quay.io/ascend/vllm-ascend:{tag}", lambda sha: reader.key(sha).digest,
                             image_map)
    [first] = releases.for_key(reader.key(shas[2]).digest)
    assert (first.tag, first.commit, first.image) == ("v0.1.0", shas[0], "mirror.lab/quay.io/ascend/vllm-ascend:v0.1.0")
    assert [r.tag for r in releases.for_key(reader.key(shas[5]).digest)] == ["v0.2.0rc1"]
    assert releases.for_key("0" * 16) == []


def test_plan_counts_the_keys_a_release_stands_for(repo):
    repo_, shas = repo
    result = plan_range(repo_, shas[1], shas[5], release_images="quay.io/ascend/vllm-ascend:{tag}")
    assert {r.tag for r in result.released.values()} == {"v0.1.0", "v0.2.0rc1"}
    assert len(result.groups) == 2
    assert plan_range(repo_, shas[1], shas[5]).released == {}


def test_the_image_must_record_the_tags_commit():
    assert recorded_commit({OCI_REVISION: "abc", "org.bisect-npu.commit": "def"}, "org.bisect-npu.commit") == "abc"
    assert recorded_commit({"org.bisect-npu.commit": "def"}, "org.bisect-npu.commit") == "def"
    assert recorded_commit(None, "org.bisect-npu.commit") == ""


@pytest.mark.parametrize("template", ["quay.io/ascend/vllm-ascend", "x:{tag}-{tag}", "x:{version}", "x :{tag}"])
def test_a_template_names_the_tag_once(template):
    with pytest.raises(UsageError, match=r"with \{tag\} once"):
        check_template(template)
    assert check_template("quay.io/ascend/vllm-ascend:{tag}") == "quay.io/ascend/vllm-ascend:{tag}"
