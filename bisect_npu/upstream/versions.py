"""Published versions of a package as bisection candidates (release-level bisection, docs/guide/releases-first.md).

A release-level step costs a `pip install` instead of a build, so the search first walks the
versions a package index publishes. The listing comes from the index's simple API (PEP 691 JSON,
or PEP 503 HTML for indexes that only speak that), is cached on disk for a day, and can be read
offline from that cache. Versions are ordered by PEP 440 (`packaging.version`); rebuilds of a
release (`0.12.0.post2`, `0.12.0+cpu`) form one group whose newest member stands for it; yanked
releases are left out; pre-releases only when an end is one (or on request).

`--find-fix` does not change anything here: `good` is always the older end, `bad` the newer one;
which of them is broken is the session's business.
"""

from __future__ import annotations

import bisect
import hashlib
import html.parser
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import git
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.paths import cache_root
from bisect_npu.upstream.history import resolve_ref

DEFAULT_INDEX = "https://pypi.org/simple"
CACHE_TTL_S = 24 * 3600
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
_log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return cache_root() / "index"


@dataclass(frozen=True)
class Listing:
    """What an index publishes for one package: installable versions, yanked ones, upload dates."""

    package: str
    versions: tuple[str, ...]
    yanked: tuple[str, ...] = ()
    uploaded: dict[str, str] = field(default_factory=dict)  # version -> first upload time (ISO 8601)


@dataclass(frozen=True)
class VersionRange:
    """The candidates strictly between two published versions, one per group of rebuilds."""

    package: str
    good: str
    bad: str
    candidates: tuple[str, ...]  # group representatives, oldest first
    groups: dict[str, list[str]]  # representative -> every published member, oldest first
    titles: dict[str, str]  # representative -> one line for the plan and the report


# --- the listing -------------------------------------------------------------------------------


def list_versions(package: str, index_url: str | None = None, *, offline: bool = False,
                  cache_dir: Path | None = None, max_age_s: float = CACHE_TTL_S) -> list[str]:
    """Installable (not yanked) versions of `package`, in PEP 440 order."""
    listing = fetch_listing(package, index_url, offline=offline, cache_dir=cache_dir, max_age_s=max_age_s)
    return list(listing.versions)


def fetch_listing(package: str, index_url: str | None = None, *, offline: bool = False,
                  cache_dir: Path | None = None, max_age_s: float = CACHE_TTL_S) -> Listing:
    """The index's listing of `package`, from a cache younger than `max_age_s` when there is one.

    Offline, the cache is used whatever its age. When the index cannot be reached, a stale cache
    is better than nothing (logged); without one it is an InfrastructureError.
    """
    index = (index_url or DEFAULT_INDEX).rstrip("/")
    name = canonicalize_name(package)
    cache = _cache_path(cache_dir or default_cache_dir(), index, name)
    cached = _read_cache(cache)
    if offline:
        if cached is None:
            raise UsageError(f"no cached listing of {name} from {index}; run once with the index reachable")
        return cached[1]
    if cached is not None and time.time() - cached[0] < max_age_s:
        return cached[1]
    try:
        listing = _download_listing(index, name)
    except InfrastructureError:
        if cached is None:
            raise
        _log.warning("index %s unreachable; using the listing of %s cached %.0f h ago", index, name,
                     (time.time() - cached[0]) / 3600)
        return cached[1]
    _write_cache(cache, listing)
    return listing


def _cache_path(cache_dir: Path, index: str, name: str) -> Path:
    index_key = hashlib.sha256(index.encode()).hexdigest()[:12]
    return cache_dir / f"{name}-{index_key}.json"


def _read_cache(path: Path) -> tuple[float, Listing] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        listing = Listing(data["package"], tuple(data["versions"]), tuple(data["yanked"]), dict(data["uploaded"]))
        return float(data["fetched_at"]), listing
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, listing: Listing) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"fetched_at": time.time(), "package": listing.package,
                               "versions": list(listing.versions), "yanked": list(listing.yanked),
                               "uploaded": listing.uploaded}), encoding="utf-8")
    tmp.replace(path)


def _download_listing(index: str, name: str) -> Listing:
    url = f"{index}/{urllib.parse.quote(name)}/"
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT, "User-Agent": "bisect-npu"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            content_type = response.headers.get("Content-Type", "")
            body = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise UsageError(f"package {name} not found on {index}; check the name or pass --index-url") from exc
        raise InfrastructureError(f"package index {url} answered {exc.code} and no listing of {name} is cached "
                                  "from an earlier run; retry later or pass another --index-url") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise InfrastructureError(f"package index {url} unreachable ({exc}) and no listing of {name} is cached "
                                  "from an earlier run; check the network or --index-url") from exc
    files = _json_files(body) if "json" in content_type else _html_files(body)
    return listing_from_files(name, files)


def _json_files(body: str) -> list[tuple[str, bool, str]]:
    data = json.loads(body)
    return [(f["filename"], bool(f.get("yanked")), f.get("upload-time") or "") for f in data.get("files", [])]


class _AnchorParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[tuple[str, bool, str]] = []
        self._yanked: bool | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._yanked = "data-yanked" in dict(attrs)

    def handle_data(self, data: str) -> None:
        if self._yanked is not None and data.strip():
            self.files.append((data.strip(), self._yanked, ""))
            self._yanked = None

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._yanked = None


def _html_files(body: str) -> list[tuple[str, bool, str]]:
    parser = _AnchorParser()
    parser.feed(body)
    return parser.files


def file_version(filename: str) -> Version | None:
    """The version a wheel or sdist file carries; None for other files."""
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        if filename.endswith((".tar.gz", ".zip")):
            return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return None


def listing_from_files(package: str, files: Iterable[tuple[str, bool, str]]) -> Listing:
    """A version is installable when at least one of its files is not yanked."""
    live: dict[Version, bool] = {}
    uploaded: dict[Version, str] = {}
    for filename, yanked, upload_time in files:
        version = file_version(filename)
        if version is None:
            continue
        live[version] = live.get(version, False) or not yanked
        if upload_time and (version not in uploaded or upload_time < uploaded[version]):
            uploaded[version] = upload_time
    ordered = sorted(live)
    return Listing(package, tuple(str(v) for v in ordered if live[v]),
                   tuple(str(v) for v in ordered if not live[v]),
                   {str(v): t for v, t in uploaded.items()})


# --- ordering and grouping ---------------------------------------------------------------------


def group_key(version: Version) -> Version:
    """The release a version rebuilds: post-releases and local labels belong to their release.

    `1.0.post2`, `1.0.post1.dev0` and `1.0+cpu` are rebuilds of `1.0`; `1.0.dev0` and `1.0rc1`
    are releases of their own (they come before `1.0`).
    """
    text = f"{version.epoch}!" if version.epoch else ""
    text += ".".join(str(part) for part in version.release)
    if version.pre is not None:
        text += f"{version.pre[0]}{version.pre[1]}"
    if version.dev is not None and version.post is None:
        text += f".dev{version.dev}"
    return Version(text)


def group_versions(versions: Iterable[str]) -> dict[str, list[str]]:
    """Representative (newest member) -> members oldest first, groups in PEP 440 order."""
    parsed = sorted({Version(v): v for v in versions}.items())
    groups: dict[Version, list[tuple[Version, str]]] = {}
    for version, text in parsed:
        groups.setdefault(group_key(version), []).append((version, text))
    return {members[-1][1]: [text for _v, text in members] for _key, members in sorted(groups.items())}


def _try_version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _parse(package: str, text: str, which: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise UsageError(f"{which} {text!r} is not a PEP 440 version of {package}; give one such as 0.27.1") from exc


def nearest_versions(version: Version, published: list[Version]) -> list[str]:
    """The published versions just below and just above `version` (two from one side at an end)."""
    ordered = sorted(published)
    at = bisect.bisect_left(ordered, version)
    below, above = ordered[max(0, at - 1):at], ordered[at:at + 1]
    if not below:
        above = ordered[at:at + 2]
    elif not above:
        below = ordered[max(0, at - 2):at]
    return [str(v) for v in below + above]


def _published(package: str, text: str, which: str, by_version: dict[Version, str]) -> Version:
    version = _parse(package, text, which)
    if version not in by_version:
        near = nearest_versions(version, list(by_version))
        hint = f"nearest published: {', '.join(near)}" if near else "the index lists none"
        raise UsageError(f"unknown version {text} of {package}; {hint}")
    return version


def resolve_version_range(package: str, good: str, bad: str, versions: Iterable[str] | None = None, *,
                          include_prereleases: bool = False, index_url: str | None = None,
                          offline: bool = False, uploaded: dict[str, str] | None = None) -> VersionRange:
    """Candidates strictly between `good` (older) and `bad` (newer), one per group of rebuilds.

    `versions` defaults to the index's listing (yanked ones left out). The ends are used as given
    (their published spelling); other members of the ends' groups are not candidates.
    """
    if versions is None:
        listing = fetch_listing(package, index_url, offline=offline)
        versions, uploaded = listing.versions, {**listing.uploaded, **(uploaded or {})}
    by_version = {version: text for text in versions if (version := _try_version(text)) is not None}
    good_v = _published(package, good, "good", by_version)
    bad_v = _published(package, bad, "bad", by_version)
    if good_v == bad_v:
        raise UsageError(f"good and bad are the same version {good}; give two different versions")
    if good_v > bad_v:
        raise UsageError(f"good {good} is newer than bad {bad}; give the older version as --good "
                         "(with --find-fix the older end is the broken one)")
    prereleases = include_prereleases or good_v.is_prerelease or bad_v.is_prerelease
    ends = {group_key(good_v), group_key(bad_v)}
    inside = [text for version, text in by_version.items()
              if good_v < version < bad_v and group_key(version) not in ends
              and (prereleases or not version.is_prerelease)]
    groups = group_versions(inside)
    titles = {rep: _title(package, rep, members, uploaded or {}) for rep, members in groups.items()}
    return VersionRange(package, by_version[good_v], by_version[bad_v], tuple(groups), groups, titles)


def _title(package: str, representative: str, members: list[str], uploaded: dict[str, str]) -> str:
    title = f"{package} {representative}"
    if len(members) > 1:
        title += f" (rebuilds: {', '.join(members)})"
    if uploaded.get(representative):
        title += f", uploaded {uploaded[representative][:10]}"
    return title


# --- the switch to commits ---------------------------------------------------------------------

TAG_PATTERNS = ("v{version}", "{version}")


def tag_for_version(repo: git.Repo, version: str, patterns: Iterable[str] = TAG_PATTERNS) -> str:
    """The tag a release was cut from: `v0.9.1` or `0.9.1`; a rebuild (`0.9.1.post2`) maps to its release."""
    names = [version]
    base = str(group_key(Version(version)))
    if base != version:
        names.append(base)
    tried = []
    for name in names:
        for pattern in patterns:
            tag = pattern.format(version=name)
            tried.append(tag)
            try:
                resolve_ref(repo, f"refs/tags/{tag}")
            except UsageError:
                continue
            return tag
    raise UsageError(f"no tag for version {version} in {repo.working_dir or repo.git_dir} "
                     f"(tried {', '.join(tried)}); fetch the tags, or bisect commits with --good/--bad refs")


def tags_to_versions(repo: git.Repo, versions: Iterable[str], patterns: Iterable[str] = TAG_PATTERNS) -> dict[str, str]:
    """Version -> tag name, for the versions that have a tag (the two-level switch needs both ends)."""
    found = {}
    patterns = tuple(patterns)
    for version in versions:
        try:
            found[version] = tag_for_version(repo, version, patterns)
        except UsageError:
            continue
    return found
