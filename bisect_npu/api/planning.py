"""`plan` and `simulate`: what a bisection of a range would cost, running nothing of it; what
`bisect-npu plan` and `bisect-npu simulate` print."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bisect_npu.errors import UsageError

if TYPE_CHECKING:
    from bisect_npu.forecast.plan import RangePlan
    from bisect_npu.forecast.simulate import SimulationSummary


@dataclass(frozen=True)
class Plan:
    """A range priced as a run would test it. `range_plan` holds the figures; `pulled` ({image:
    id}) and `published` ({release image: its id, or why it cannot stand for its key}) are what
    `pull` fetched; `run_minutes` is None for checkouts without a declared run time."""

    range_plan: RangePlan
    executor: Literal["local", "docker"]
    build_minutes: float
    overlay_minutes: float
    run_minutes: float | None
    release_images: str | None = None
    pulled: dict[str, str] | None = None  # None: nothing was asked to be pulled
    published: dict[str, str] = field(default_factory=dict)
    find_fix: bool = False
    warning: str | None = None  # what may make the run's answer wrong (a find-fix search from a merge-base)

    def to_json(self) -> dict[str, Any]:
        """What `bisect-npu plan --json` prints."""
        pulls = {"pulled": self.pulled, "published": self.published} if self.pulled is not None else {}
        return {**self.range_plan.to_json(), **pulls, "find_fix": self.find_fix, "warning": self.warning}


def plan(repo: str | Path, good: str, bad: str, *, build_minutes: float = 30.0, overlay_minutes: float = 2.0,
         run_minutes: float | None = None, command: str | None = None,
         executor: Literal["local", "docker"] | None = None, dockerfile: str | None = None,
         recipe: str | Path | None = None, base_image_map: tuple[str, ...] | list[str] = (),
         release_images: str | None = None, pull: bool = False, find_fix: bool = False) -> Plan:
    """Resolve `good`..`bad` and price bisecting it as `bisect-npu plan` does (`find_fix`: a search
    for the fix, warned about when it would start from a merge-base): the recipe (its
    supported versions and engine args checked at both ends, its build settings) or the command
    (as `run --cmd` would take it) says how a run would test candidates; `executor` defaults to
    local with a command (checkouts: steps, and hours only from `run_minutes`), else docker (build
    keys, builds and hours; `run_minutes` 5). `pull` pulls every base image and release image the
    builds need into the container engine now (an unreachable registry is an
    InfrastructureError)."""
    from bisect_npu.forecast.plan import plan_range
    from bisect_npu.upstream import history

    if command is not None and recipe is not None:
        raise UsageError("give either --recipe or --cmd (the oracle the run would use)")
    if command is not None:
        from bisect_npu.orchestration.opening.preflight import command_words

        command_words(command)  # refused here as `run` would refuse it
    executor = executor or ("local" if command is not None else "docker")
    if executor == "local":
        result = plan_range(history.open_repo(str(repo)), good, bad, run_minutes=run_minutes, executor="local")
        answer = Plan(result, "local", build_minutes, overlay_minutes, run_minutes)
    else:
        answer = _image_plan(str(repo), good, bad, build_minutes=build_minutes, overlay_minutes=overlay_minutes,
                             run_minutes=5.0 if run_minutes is None else run_minutes, dockerfile=dockerfile,
                             recipe=recipe, base_image_map=tuple(base_image_map), release_images=release_images,
                             pull=pull)
    if not find_fix:
        return answer
    return replace(answer, find_fix=True, warning=find_fix_warning(answer.range_plan, good, bad))


def find_fix_warning(range_plan: RangePlan, old: str, new: str) -> str | None:
    """With --find-fix the old end must show the symptom; where it is not an ancestor of the new
    end, the search starts from their merge-base instead, which may predate the regression."""
    brange = range_plan.range
    if not brange.merge_base_note:
        return None
    return (f"--find-fix: the old end {old} is not on the new end's history, so the search starts from "
            f"their merge-base {brange.base[:12]}, taken to show the symptom; it may predate the regression (then the "
            f"answer is wrong): check it shows the symptom, or give an old end on {new}'s history")


def _image_plan(repo: str, good: str, bad: str, *, build_minutes: float, overlay_minutes: float, run_minutes: float,
                dockerfile: str | None, recipe: str | Path | None, base_image_map: tuple[str, ...],
                release_images: str | None, pull: bool) -> Plan:
    from bisect_npu.builders.registry import BaseImageMap
    from bisect_npu.builders.releases import check_template
    from bisect_npu.forecast.plan import plan_range
    from bisect_npu.recipe.check import check_recipe_at_ends, check_support, range_ends
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.upstream import history

    loaded = load_recipe(recipe) if recipe else None
    dockerfile = dockerfile or (loaded.build.dockerfile if loaded else "Dockerfile")
    base_images = BaseImageMap.parse(base_image_map, loaded.build.base_image_map if loaded else None)
    release_images = release_images or (loaded.build.release_images if loaded else None)
    clone = history.open_repo(repo)
    result = plan_range(clone, good, bad, dockerfile=dockerfile, build_minutes=build_minutes,
                        overlay_minutes=overlay_minutes, run_minutes=run_minutes,
                        base_images=base_images.apply if base_images else None,
                        release_images=check_template(release_images) if release_images else None)
    if loaded is not None:
        ends = range_ends(good, bad, result.range.good, result.range.base, result.range.bad)
        check_support(loaded, clone, ends)
        check_recipe_at_ends(loaded, clone, ends)
    pulled = pull_base_images(result.base_images()) if pull else None
    published = pull_release_images(result) if pull else {}
    return Plan(result, "docker", build_minutes, overlay_minutes, run_minutes, release_images, pulled, published)


def pull_base_images(images: list[str]) -> dict[str, str]:
    """Pull each image into the engine DOCKER_HOST names: {image: id}; the first that fails is an
    InfrastructureError naming its registry."""
    from bisect_npu.builders.docker import connect_engine
    from bisect_npu.builders.registry import pull_image

    client = connect_engine()
    return {image: pull_image(client, image) for image in images}


def pull_release_images(result: RangePlan) -> dict[str, str]:
    """Pull the release images the plan counts: {image: its id, or why it cannot stand for its key}."""
    from bisect_npu.builders.base import LABEL_COMMIT
    from bisect_npu.builders.docker import connect_engine
    from bisect_npu.builders.releases import fetch_release

    client = connect_engine() if result.released else None
    notes: dict[str, str] = {}
    for release in result.released.values():
        image_id, note = fetch_release(client, release, LABEL_COMMIT)
        notes[release.image] = image_id or note
    return notes


@dataclass(frozen=True)
class Simulation:
    """Simulated bisections of a real range: where the culprit sits among its candidates, the
    build keys a session would see, and the figures (`rows`: labelled, formatted)."""

    candidates: int
    position: int  # the culprit's, 1-based
    build_keys: int
    unbuildable: int  # candidates without the Dockerfile (skipped)
    mode: Literal["exact", "noisy", "likelihood", "levels"]
    merge_base_note: str
    summary: SimulationSummary
    rows: Mapping[str, str]


def simulate(repo: str | Path, good: str, bad: str, culprit: str, *, bad_rate: float = 1.0, good_rate: float = 0.0,
             build_fail: float = 0.0, slots: int = 1, runs: int = 200, build_cost_min: float = 30.0,
             overlay_cost_min: float = 2.0, run_cost_min: float = 5.0, load_cost_min: float = 0.0,
             earlier_runs: int = 0, dockerfile: str = "Dockerfile", seed: int = 0,
             mode: Literal["exact", "noisy"] | None = None,
             on_run: Callable[[int, int], None] | None = None,
             throughput_drop: float | None = None, throughput_spread: float = 0.02, threshold: float = 0.97,
             trials: int = 5, throughput_search: Literal["levels", "per_step"] = "levels",
             published_baseline: bool = False, nightly_result: bool = False) -> Simulation:
    """Replay the real search `runs` times over `good`..`bad` with a synthetic oracle that fails
    a trial at or after `culprit` with `bad_rate`, before it with `good_rate`; `mode` defaults to
    exact for a perfect test (rates 1/0), else noisy. `throughput_drop`: a throughput regression
    instead of the rates (`throughput_spread` a run's spread, the recipe's `threshold` and
    `trials`), searched as a session searches it (`throughput_search`, the recipe's
    `oracle.throughput.search`: levels, one run a step; per_step, each step's trials stopped when
    sure, the likelihood search); `published_baseline`: the recipe publishes a throughput baseline,
    which levels mode takes as a prior (the forecast as if it holds); `nightly_result`: the recipe
    gives the failing nightly's throughput (`oracle.throughput.earlier_runs.bad`), a run at the bad
    end on the baseline's host (as if that host is this one). `on_run(done, total)` after
    each bisection."""
    from bisect_npu.forecast.plan import range_keys, unbuildable_positions
    from bisect_npu.forecast.simulate import Minutes, Throughput, describe
    from bisect_npu.forecast.simulate import simulate as run_simulation
    from bisect_npu.upstream import history

    throughput = None if throughput_drop is None else Throughput(throughput_drop, throughput_spread, threshold,
                                                                 trials, search=throughput_search,
                                                                 baseline=1.0 if published_baseline else None,
                                                                 nightly_result=nightly_result)
    if throughput is None and bad_rate <= good_rate:
        raise UsageError(f"--bad-rate ({bad_rate}) must exceed --good-rate ({good_rate}): "
                         "the bad side is the one that fails more often")
    git_repo = history.open_repo(str(repo))
    brange = history.resolve_range(git_repo, good, bad)
    culprit_sha = history.resolve_ref(git_repo, culprit)
    if culprit_sha not in brange.candidates:
        raise UsageError(f"culprit {culprit} is not one of the {len(brange.candidates)} candidates in "
                         f"{good}..{bad}; pick a commit inside the range")
    position = brange.candidates.index(culprit_sha) + 1
    build_keys = range_keys(git_repo, brange, dockerfile)
    keys = [key.digest for key in build_keys]
    unbuildable = unbuildable_positions(build_keys)
    chosen: Literal["exact", "noisy"] = mode or ("exact" if (bad_rate, good_rate) == (1.0, 0.0) else "noisy")
    summary = run_simulation(
        len(brange.candidates), position, bad_rate=bad_rate, good_rate=good_rate, build_fail=build_fail,
        slots=slots, mode=chosen, runs=runs, seed=seed, build_key_of=keys.__getitem__,
        costs=Minutes(build=build_cost_min, overlay=overlay_cost_min, run=run_cost_min, load=load_cost_min),
        earlier_runs=earlier_runs, on_run=on_run, unbuildable=unbuildable, throughput=throughput,
    )
    return Simulation(len(brange.candidates), position, len(set(keys)), len(unbuildable),
                      ("levels" if throughput_search == "levels" else "likelihood") if throughput is not None
                      else chosen,
                      brange.merge_base_note or "", summary, describe(summary))
