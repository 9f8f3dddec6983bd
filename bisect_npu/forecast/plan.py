"""What bisecting a range would cost, running nothing: `bisect-npu plan` as a library.

The range is resolved as `run` resolves it, each candidate keyed as the docker builder keys it
(bisect_npu/builders/key.py), and the real exact-mode search is replayed with a perfect oracle over
culprit positions spread across the range, once told the build groups and their costs (what a
session with container builds does) and once as plain midpoint bisection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import git

from bisect_npu.builders.key import BuildKey, BuildKeyReader
from bisect_npu.builders.releases import ReleaseImage, ReleaseImages
from bisect_npu.forecast.simulate import Minutes, simulate
from bisect_npu.upstream import history

PLAN_CULPRITS = 64  # culprit positions the estimate averages over (all of them in a smaller range)


@dataclass(frozen=True)
class BuildGroup:
    """The candidates sharing one build key: one full build, the rest overlays."""

    key: str
    commits: int
    first: str
    base_image: str
    vllm_tag: str
    pull: str = ""  # where the base image is pulled from when a mirror map changes it


@dataclass(frozen=True)
class PlanFigures:
    """Means over the culprit positions (steps include the two end checks)."""

    steps: float
    max_steps: int
    full_builds: float
    overlays: float
    hours: float | None  # None: no run time was declared (a command's time is not known beforehand)
    culprits: int


@dataclass(frozen=True)
class RangePlan:
    range: history.BisectRange
    oldest: history.CommitFacts
    newest: history.CommitFacts
    groups: list[BuildGroup]
    dockerfile: str
    lacking_dockerfile: list[str]  # candidates without it: skipped by a docker run
    ends_lacking_dockerfile: list[str]  # "good"/"bad": a docker run of the range is refused
    expected: PlanFigures  # the search told the groups and the costs
    midpoint: PlanFigures  # plain midpoint bisection of the same range
    minutes: dict[str, float]
    good_base: str = ""  # the good end's base image as pulled (the end check builds it too)
    # {build key: release image}: keys of the range a published release image can stand for
    # (--release-images), when that image exists: no full build for them.
    released: dict[str, ReleaseImage] = field(default_factory=dict)
    executor: str = "docker"  # "local": each candidate a checkout, nothing built (a --cmd run by default)

    def base_images(self) -> list[str]:
        """Each base image the range's builds start from, as pulled (through the mirror map)."""
        return sorted({group.pull or group.base_image for group in self.groups if group.base_image} |
                      ({self.good_base} if self.good_base else set()))

    def to_json(self) -> dict[str, Any]:
        brange = self.range
        return {
            "good": brange.good, "bad": brange.bad, "base": brange.base,
            "merge_base_note": brange.merge_base_note, "candidates": len(brange.candidates),
            "first": {"sha": self.oldest.sha, "title": self.oldest.title},
            "last": {"sha": self.newest.sha, "title": self.newest.title},
            "build_keys": len(self.groups), "build_groups": [asdict(group) for group in self.groups],
            "dockerfile": self.dockerfile, "lacking_dockerfile": len(self.lacking_dockerfile),
            "ends_lacking_dockerfile": list(self.ends_lacking_dockerfile),
            "base_images": self.base_images(),
            "release_images": {key: asdict(release) for key, release in self.released.items()},
            "expected": asdict(self.expected), "midpoint": asdict(self.midpoint), "minutes": dict(self.minutes),
            "executor": self.executor,
        }


def range_keys(repo: git.Repo, brange: history.BisectRange, dockerfile: str = "Dockerfile",
               base_images: Callable[[str], str] | None = None) -> list[BuildKey]:
    """The build key of each position 0..n (the base, then the candidates), as DockerBuilder keys them."""
    reader = BuildKeyReader(repo, dockerfile=dockerfile, base_images=base_images)
    return [reader.key(sha) for sha in (brange.base, *brange.candidates)]


def unbuildable_positions(keys: list[BuildKey]) -> list[int]:
    """Candidates a docker run skips for lacking the Dockerfile, when the ends have it; when an
    end lacks it no docker run of the range starts at all (and a local one builds everything)."""
    if not (keys[0].has_dockerfile and keys[-1].has_dockerfile):
        return []
    return [i for i in range(1, len(keys) - 1) if not keys[i].has_dockerfile]


def plan_range(repo: git.Repo, good: str, bad: str, *, dockerfile: str = "Dockerfile", build_minutes: float = 30.0,
               overlay_minutes: float = 2.0, run_minutes: float | None = 5.0,
               base_images: Callable[[str], str] | None = None, release_images: str | None = None,
               executor: str = "docker") -> RangePlan:
    """Resolve GOOD..BAD and price bisecting it: build groups, expected steps, builds and hours.

    With `executor="local"` each candidate is a checkout (no image, no build key): the figures
    are steps and runs alone, in hours only when `run_minutes` is given (else None)."""
    brange = history.resolve_range(repo, good, bad)
    if executor == "local":
        return _checkout_plan(repo, brange, dockerfile, run_minutes)
    assert run_minutes is not None, "an image plan prices its runs"
    keys = range_keys(repo, brange, dockerfile, base_images)
    released: dict[str, ReleaseImage] = {}
    if release_images:
        reader = BuildKeyReader(repo, dockerfile=dockerfile, base_images=base_images)
        releases = ReleaseImages(repo, release_images, lambda sha: reader.key(sha).digest, base_images)
        released = {key.digest: found[-1] for key in keys if (found := releases.for_key(key.digest))}
    members: dict[str, list[str]] = {}
    for sha, key in zip(brange.candidates, keys[1:], strict=True):
        members.setdefault(key.digest, []).append(sha)
    by_digest = {key.digest: key for key in keys[1:]}  # one digest, one set of inputs
    groups = [BuildGroup(digest, len(shas), shas[0], *(by_digest[digest].inputs.get(name, "") for name in
                                                       ("base_image", "vllm_tag", "base_image_pulled")))
              for digest, shas in members.items()]
    lacking = [sha for sha, key in zip(brange.candidates, keys[1:], strict=True) if not key.has_dockerfile]
    ends = [end for end, key in (("good", keys[0]), ("bad", keys[-1])) if not key.has_dockerfile]
    unbuildable = unbuildable_positions(keys)
    minutes = {"build": build_minutes, "overlay": overlay_minutes, "run": run_minutes}
    digests = [key.digest for key in keys]
    oldest, newest = history.commits_facts(repo, [brange.candidates[0], brange.candidates[-1]])
    good_inputs = keys[0].inputs
    return RangePlan(brange, oldest, newest, groups, dockerfile, lacking, ends,
                     _replay(digests, unbuildable, told=True, minutes=minutes),
                     _replay(digests, unbuildable, told=False, minutes=minutes), minutes,
                     good_inputs.get("base_image_pulled") or good_inputs.get("base_image", ""), released)


def _checkout_plan(repo: git.Repo, brange: history.BisectRange, dockerfile: str,
                   run_minutes: float | None) -> RangePlan:
    """A plan for candidates checked out, not built: one key per commit, at no cost."""
    positions = [brange.base, *brange.candidates]
    minutes = {"build": 0.0, "overlay": 0.0, "run": run_minutes or 0.0}
    replayed = _replay(positions, [], told=False, minutes=minutes)  # its "builds" are checkouts: none counted
    figures = replace(replayed, full_builds=0.0, overlays=0.0, hours=replayed.hours if run_minutes else None)
    oldest, newest = history.commits_facts(repo, [brange.candidates[0], brange.candidates[-1]])
    return RangePlan(brange, oldest, newest, [], dockerfile, [], [], figures, figures,
                     {"run": run_minutes} if run_minutes is not None else {}, executor="local")


def _replay(keys: list[str], unbuildable: list[int], *, told: bool, minutes: dict[str, float]) -> PlanFigures:
    """The exact search's figures over culprits spread evenly across 1..n (a perfect oracle);
    candidates without the Dockerfile are skips, as in a docker run."""
    n = len(keys) - 1
    count = min(n, PLAN_CULPRITS)
    culprits = sorted({1 + (i * (n - 1)) // max(count - 1, 1) for i in range(count)})
    summary = simulate(n, culprits, bad_rate=1.0, good_rate=0.0, mode="exact", runs=1,
                       build_key_of=keys.__getitem__, tell_build_groups=told,
                       costs=Minutes(build=minutes["build"], overlay=minutes["overlay"], run=minutes["run"]),
                       unbuildable=unbuildable)
    return PlanFigures(round(summary.mean_trials, 2), int(summary.max_trials), round(summary.mean_builds, 2),
                       round(summary.mean_overlays, 2), round(summary.mean_machine_hours, 2), len(culprits))
