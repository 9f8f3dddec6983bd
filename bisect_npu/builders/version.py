"""The version a candidate's image reports: its own `git describe`, in PEP 440 spelling.

A build context made with `git archive` has no `.git`, so vllm-ascend's setuptools_scm finds no
tag and the package says 0.0.0; an overlay keeps its base commit's version. The builder hands
this version to the full build (SETUPTOOLS_SCM_PRETEND_VERSION, which setuptools_scm reads
instead of git) and writes it into an overlay's package metadata.
"""

from __future__ import annotations

import re

import git

SCM_VERSION_ARG = "SETUPTOOLS_SCM_PRETEND_VERSION"
_DESCRIBED = re.compile(r"^v?(?P<tag>.+)-(?P<distance>\d+)-g(?P<sha>[0-9a-f]+)$")


def git_describe(repo: git.Repo, sha: str) -> str | None:
    """`v0.11.0rc0-12-gabc123456789` (always the long form), or None with no version tag below."""
    try:
        return str(repo.git.describe("--tags", "--long", "--abbrev=12", "--match", "v[0-9]*", sha))
    except git.GitCommandError:
        return None


def pep440_of_describe(described: str) -> str:
    """`v0.11.0rc0-0-g...` -> `0.11.0rc0`; `v0.11.0rc0-12-gabc` -> `0.11.0rc0+12.gabc` (the
    distance and commit as a local label, so the version names the commit exactly)."""
    match = _DESCRIBED.match(described)
    if match is None:
        return described.removeprefix("v")
    if match["distance"] == "0":
        return match["tag"]
    return f"{match['tag']}+{match['distance']}.g{match['sha']}"


def candidate_version(repo: git.Repo, sha: str) -> str:
    """The version the candidate's image reports; `0.0.0+g<sha>` where no version tag is below it."""
    described = git_describe(repo, sha)
    if described is None:
        return f"0.0.0+g{repo.commit(sha).hexsha[:12]}"
    return pep440_of_describe(described)
