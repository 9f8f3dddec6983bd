"""Prefetcher: background builds overlap with the caller's work and are handed over by `get`."""

from __future__ import annotations

import time

import git
import pytest

from bisect_npu.builders.base import BuildFailed
from bisect_npu.builders.local import LocalBuilder
from bisect_npu.builders.prefetch import Prefetcher, speculative_queries
from bisect_npu.search import Evidence, SearchProblem, decide
from tests.helpers.gitrepo import make_linear_repo

BUILD_S = 0.6


@pytest.fixture()
def builder(tmp_path):
    shas = make_linear_repo(tmp_path / "repo", 6)
    # A real build: a subprocess in a real worktree that takes BUILD_S seconds (fails when BROKEN exists).
    command = ["sh", "-c", f"sleep {BUILD_S}; test ! -e BROKEN"]
    return LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work", command), shas


def test_prefetched_build_is_handed_over_and_counts_as_saved(builder, tmp_path):
    local, shas = builder
    prefetcher = Prefetcher(local, tmp_path / "prefetch-logs")
    try:
        prefetcher.prefetch([shas[2], shas[4]])
        time.sleep(BUILD_S * 2 + 1.0)  # "the current candidate runs" meanwhile
        asked = time.monotonic()
        env = prefetcher.get(shas[2], tmp_path / "step")
        assert time.monotonic() - asked < BUILD_S / 2
        assert env.commit == shas[2] and env.path
        record = prefetcher.records[shas[2]]
        assert record.used and record.build_s >= BUILD_S
        assert prefetcher.seconds_saved() >= BUILD_S * 0.9
        assert prefetcher.records[shas[4]].saved_s == 0.0  # built but never asked for: no saving
    finally:
        prefetcher.close()


def test_unprefetched_commit_builds_now_and_saves_nothing(builder, tmp_path):
    local, shas = builder
    prefetcher = Prefetcher(local, tmp_path / "prefetch-logs")
    try:
        env = prefetcher.get(shas[1], tmp_path / "step")
        assert env.commit == shas[1]
        assert prefetcher.seconds_saved() == 0.0
    finally:
        prefetcher.close()


def test_new_wish_list_cancels_queued_builds(builder, tmp_path):
    local, shas = builder
    prefetcher = Prefetcher(local, tmp_path / "prefetch-logs")
    try:
        prefetcher.prefetch([shas[1], shas[2], shas[3]])  # one worker: 2 and 3 wait in the queue
        prefetcher.prefetch([shas[1], shas[5]])
        assert set(prefetcher.records) == {shas[1], shas[5]}
        assert prefetcher.get(shas[5], tmp_path / "step").commit == shas[5]
        assert prefetcher.records[shas[5]].used
    finally:
        prefetcher.close()


def test_failed_prefetched_build_raises_on_get(tmp_path):
    shas = make_linear_repo(tmp_path / "repo", 2, files=lambda i: {"BROKEN": "x\n"} if i == 1 else {})
    local = LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work", ["sh", "-c", "test ! -e BROKEN"])
    prefetcher = Prefetcher(local, tmp_path / "prefetch-logs")
    try:
        prefetcher.prefetch([shas[1]])
        with pytest.raises(BuildFailed):
            prefetcher.get(shas[1], tmp_path / "step")
    finally:
        prefetcher.close()


def test_speculative_queries_are_the_next_midpoints_for_either_verdict():
    problem = SearchProblem(n=16, check_ends=False)
    assert decide(problem, {}).queries[0].index == 8
    assert sorted(speculative_queries(problem, {}, [8])) == [4, 12]
    after_bad = {8: Evidence(bad=1)}
    assert sorted(speculative_queries(problem, after_bad, [4])) == [2, 6]


def test_speculative_queries_end_when_the_search_would():
    problem = SearchProblem(n=2, check_ends=False)
    evidence = {1: Evidence(good=1)}
    assert speculative_queries(problem, evidence, [2]) == []  # either verdict ends the search
