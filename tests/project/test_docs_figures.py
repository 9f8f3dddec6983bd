"""The figures README.md and docs/guide/planning.md quote from `bisect-npu plan` on vllm-ascend's
real history are what `plan` says today: the pages name the date and the commit they were measured
at, and this test fails when the tool's output drifts from them (a build key that reads more files
gives a range more keys). It needs a real clone: BISECT_NPU_VLLM_ASCEND=CLONE, as the other
real-clone tests (slow tier: `make test-heavy`, or pytest -m slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
CLONE = os.environ.get("BISECT_NPU_VLLM_ASCEND")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not CLONE, reason="BISECT_NPU_VLLM_ASCEND names no vllm-ascend clone: the docs' plan figures are not checked")]


def plan(good: str, bad: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "plan", "--repo", str(CLONE), "--good", good,
                           "--bad", bad, "--json"], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def figures(found: dict) -> str:
    """`plan`'s figures as the planning page words them."""
    expected, midpoint = found["expected"], found["midpoint"]
    return (f"{expected['steps']:.1f} steps (at most {expected['max_steps']}), {expected['full_builds']:.1f} full "
            f"builds, {expected['overlays']:.1f} overlays, {expected['hours']:.2f} h, against "
            f"{midpoint['steps']:.1f} steps (at most {midpoint['max_steps']}), {midpoint['full_builds']:.1f} full "
            f"builds, {midpoint['hours']:.2f} h")


def prose(path: str) -> str:
    """A page with its line breaks as spaces: the figures may wrap anywhere."""
    return " ".join((ROOT / path).read_text(encoding="utf-8").split())


def test_the_release_range_figures_on_the_pages_are_plan_s() -> None:
    found = plan("v0.9.0rc1", "v0.9.1")
    page = prose("docs/guide/planning.md")
    assert f"`v0.9.0rc1..v0.9.1` ({found['candidates']} commits, {found['build_keys']} build keys)" in page
    assert figures(found) in page
    readme = prose("README.md")
    assert f"lists {found['candidates']} candidate commits in {found['build_keys']} build keys" in readme
    expected = found["expected"]
    assert (f"about {round(expected['steps'])} steps, {expected['full_builds']:.1f} full image builds and "
            f"{expected['overlays']:.1f} overlays") in readme
    assert re.search(r"Measured \d{4}-\d\d-\d\d with bisect-npu", readme)


def test_the_main_range_figures_are_plan_s_at_the_commit_the_page_names() -> None:
    page = prose("docs/guide/planning.md")
    measured = re.search(r"Measured (\d{4}-\d\d-\d\d) with bisect-npu \S+, vllm-ascend main at ([0-9a-f]{12})", page)
    assert measured, "the planning page must say when and at which vllm-ascend commit its figures were measured"
    sha = measured[2]
    if subprocess.run(["git", "-C", str(CLONE), "cat-file", "-e", f"{sha}^{{commit}}"], check=False).returncode:
        pytest.skip(f"the clone lacks {sha}, the commit the page's `..main` figures were measured at; fetch it")
    found = plan("v0.9.0rc1", sha)
    words = re.search(r"On `v0\.9\.0rc1\.\.main` \(([\d,]+) commits, (\d+) keys;[^)]*\): (.*? h against .*? h)\.", page)
    assert words, "the planning page's `..main` sentence changed shape; update this test with it"
    assert (int(words[1].replace(",", "")), int(words[2])) == (found["candidates"], found["build_keys"])
    expected, midpoint = found["expected"], found["midpoint"]
    assert words[3] == (f"{expected['steps']:.1f} steps (at most {expected['max_steps']}), "
                        f"{expected['full_builds']:.1f} full builds, {expected['hours']:.2f} h against "
                        f"{midpoint['steps']:.1f} steps (at most {midpoint['max_steps']}), "
                        f"{midpoint['full_builds']:.1f} full builds, {midpoint['hours']:.2f} h")
