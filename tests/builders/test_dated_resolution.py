"""A pin venv without a lock resolves as of its commit's date (builders/dated.py): pip's exact
words for a commit date, the environment that leaves out the local files pip cannot date, and a
real pip against a real index over HTTP that publishes upload times (PEP 700), which installs the
release that was out on the commit's day, not the newer one."""

from __future__ import annotations

import datetime
import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.builders.dated import (
    MADE_AFRESH,
    MADE_BY_LOCK,
    MADE_DATED,
    cutoff_args,
    cutoff_text,
    dated_indexes,
    made_text,
)
from bisect_npu.builders.pin_venv import PinVenvs

PACKAGE = "tinydated"
# (version, upload time): 2.0 came out after the commit below.
RELEASES = (("1.0", "2026-05-01T08:00:00Z"), ("2.0", "2026-06-10T08:00:00Z"))
# A commit made on 2026-06-03 14:39:53 +0800, as vllm-ascend's 86797d44a7 was.
COMMITTED = datetime.datetime(2026, 6, 3, 14, 39, 53, tzinfo=datetime.timezone(datetime.timedelta(hours=8)))


def test_the_cutoff_is_the_commit_date_in_utc() -> None:
    assert cutoff_text(COMMITTED) == "2026-06-03T06:39:53Z"
    assert cutoff_args(cutoff_text(COMMITTED)) == ["--uploaded-prior-to", "2026-06-03T06:39:53Z"]
    with pytest.raises(ValueError):
        cutoff_text(COMMITTED.replace(tzinfo=None))


def test_a_dated_build_asks_only_the_remote_indexes(tmp_path: Path) -> None:
    no_links = tmp_path / "no-links"
    assert dated_indexes({}, no_links) == {"PIP_INDEX_URL": "https://pypi.org/simple",
                                           "PIP_EXTRA_INDEX_URL": "https://pypi.org/simple",
                                           "PIP_FIND_LINKS": str(no_links)}
    mixed = {"index-url": "https://mirror.example/simple",
             "extra-index-url": "file:///opt/pypi/simple https://extra.example/simple /opt/more",
             "find-links": "/opt/wheels"}
    assert dated_indexes(mixed, no_links) == {"PIP_INDEX_URL": "https://mirror.example/simple",
                                              "PIP_EXTRA_INDEX_URL": "https://extra.example/simple",
                                              "PIP_FIND_LINKS": str(no_links)}
    assert dated_indexes({"index-url": "file:///opt/pypi/simple"}, no_links) is None  # nothing to date by
    assert dated_indexes({"no-index": "true"}, no_links) is None


def test_how_a_venv_was_made_is_said() -> None:
    assert made_text(MADE_DATED, "2026-06-03T06:39:53Z").startswith("dated: resolved with nothing uploaded after "
                                                                     "2026-06-03T06:39:53Z")
    assert made_text(MADE_BY_LOCK, None).startswith("lock")
    assert made_text(MADE_AFRESH, None).startswith("afresh")
    assert made_text("", None) == "not recorded"


def test_pin_venvs_date_a_build_by_the_pip_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `PinVenvs` reads of pip's configuration (the environment over its files) decides."""
    venvs = PinVenvs(tmp_path / "cache", python=sys.executable)
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///opt/pypi/simple")
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    made, cutoff, env = venvs._dating(COMMITTED)
    assert (made, cutoff) == (MADE_DATED, "2026-06-03T06:39:53Z")
    assert env is not None and env["PIP_INDEX_URL"] == env["PIP_EXTRA_INDEX_URL"] == "https://mirror.example/simple"
    assert (tmp_path / "cache" / "no-links").is_dir() and env["PIP_FIND_LINKS"] == str(tmp_path / "cache" / "no-links")
    assert venvs._dating(None) == (MADE_AFRESH, None, None)
    monkeypatch.setenv("PIP_INDEX_URL", "file:///opt/pypi/simple")
    assert venvs._dating(COMMITTED) == (MADE_AFRESH, None, None)


def wheel(root: Path, version: str) -> Path:
    path = root / f"{PACKAGE}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{PACKAGE}/__init__.py", f"VERSION = {version!r}\n")
        archive.writestr(f"{PACKAGE}-{version}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n")
        archive.writestr(f"{PACKAGE}-{version}.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{PACKAGE}-{version}.dist-info/RECORD", "")
    return path


class JsonIndex(http.server.SimpleHTTPRequestHandler):
    """PEP 691's JSON project page with PEP 700's upload times; the wheels as files."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") == f"/simple/{PACKAGE}":
            body = json.dumps({
                "meta": {"api-version": "1.1"}, "name": PACKAGE, "versions": [v for v, _ in RELEASES],
                "files": [{"filename": f"{PACKAGE}-{v}-py3-none-any.whl",
                           "url": f"/files/{PACKAGE}-{v}-py3-none-any.whl", "hashes": {}, "upload-time": at}
                          for v, at in RELEASES]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        """No line per request on the test's stderr."""


@pytest.fixture
def json_index(tmp_path: Path) -> Iterator[str]:
    files = tmp_path / "index" / "files"
    files.mkdir(parents=True)
    for version, _ in RELEASES:
        wheel(files, version)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(JsonIndex,
                                                                                  directory=str(tmp_path / "index")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def download(index: str, into: Path, extra: list[str]) -> list[str]:
    subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--disable-pip-version-check",
                    "--quiet", "-d", str(into), "-i", index, *extra, PACKAGE], check=True, capture_output=True,
                   timeout=120)
    return sorted(path.name for path in into.iterdir())


def test_pip_given_the_commit_date_installs_what_was_out_that_day(json_index: str, tmp_path: Path) -> None:
    assert download(json_index, tmp_path / "today", []) == [f"{PACKAGE}-2.0-py3-none-any.whl"]
    assert download(json_index, tmp_path / "dated", cutoff_args(cutoff_text(COMMITTED))) == \
        [f"{PACKAGE}-1.0-py3-none-any.whl"]


class HtmlIndex(JsonIndex):
    """The same files behind a PEP 503 HTML page: no upload times."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") == f"/simple/{PACKAGE}":
            body = "".join(f'<a href="/files/{PACKAGE}-{v}-py3-none-any.whl">{PACKAGE}-{v}</a>\n'
                           for v, _ in RELEASES).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        http.server.SimpleHTTPRequestHandler.do_GET(self)


def test_a_build_dates_only_where_the_index_gives_upload_times(json_index: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A mirror without upload times offers nothing under a cut-off: the build goes on afresh
    instead of failing on every package."""
    import bisect_npu.builders.pin_venv as pin_venv

    monkeypatch.setattr(pin_venv, "DATING_PROBE", PACKAGE)
    venvs = PinVenvs(tmp_path / "cache", python=sys.executable)
    (tmp_path / "cache").mkdir()
    cutoff = cutoff_text(COMMITTED)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        HtmlIndex, directory=str(tmp_path / "index")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    html_index = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        with (tmp_path / "log").open("w") as log:
            for index, dates in ((json_index, True), (html_index, False)):
                env = {**os.environ, "PIP_INDEX_URL": index, "PIP_EXTRA_INDEX_URL": index,
                       "PIP_FIND_LINKS": str(tmp_path), "PIP_NO_INDEX": "", "PIP_CONFIG_FILE": os.devnull}
                assert venvs._dates(sys.executable, cutoff, env, log) is dates
    finally:
        server.shutdown()
        server.server_close()
    assert "the indexes give no upload times to date by: resolving afresh" in (tmp_path / "log").read_text()
