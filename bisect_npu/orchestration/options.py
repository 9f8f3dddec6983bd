"""What `bisect-npu run` was asked, kept apart from the session that runs it: the journal header
stores it (as `records.HeaderOptions`), resume reads it back, and the report turns it into a
reproduce line."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from bisect_npu.contracts import TimeoutIs
from bisect_npu.defaults import CACHE_SIZE_GIB, TRIAL_TIMEOUT_S, VERIFY_TOP
from bisect_npu.errors import UsageError
from bisect_npu.recipe import EarlierRunsSpec, Recipe
from bisect_npu.records import HeaderOptions
from bisect_npu.search import EarlierRuns


@dataclass
class RunOptions:
    """Everything `bisect-npu run` was asked; stored in the journal header so resume needs nothing else."""

    good: str
    bad: str
    repo: str | None = "."
    # Release level: candidates are published versions of this package instead of commits.
    package: str | None = None
    index_url: str | None = None
    prereleases: bool = False
    recipe: str | None = None
    command: list[str] | None = None
    executor: Literal["local", "docker", "ray"] = "local"
    # --executor ray: the cluster to join (None: the RAY_ADDRESS environment, else a local cluster).
    ray_address: str | None = None
    # --executor ray: how each node builds and runs a candidate (a worktree, or its own container engine).
    node_executor: Literal["local", "docker"] = "local"
    devices: list[int] = field(default_factory=list)
    # Candidates tested at once; None until the run starts (preflight.check_run): as many as
    # --devices holds cards for the recipe's parallel size, else 1.
    slots: int | None = None
    mode: Literal["exact", "noisy"] | None = None
    confidence: float | None = None
    check_ends: bool = True
    timeout_s: float = TRIAL_TIMEOUT_S
    # --timeout-is: what a trial past the timeout says (None: the recipe's trials.timeout_is, else skip).
    timeout_is: TimeoutIs | None = None
    propose_fix: bool = True
    verify_fix: bool = False
    fix_top: int = VERIFY_TOP  # --verify-top: proposals tried at most, best first, until one works
    workdir: str | None = None
    cache_size_gb: float = float(CACHE_SIZE_GIB)
    # --find-fix: the old end shows the symptom and the new end does not; find the first fixed one.
    find_fix: bool = False
    # Build what the next step can need while the current candidate runs (default: with --devices,
    # where runs use the NPUs and builds the CPUs; on a CPU-only host they would compete).
    prefetch: bool | None = None
    # --earlier-runs: ends' runs made before the session, "shown/runs" at the bad end and the good
    # end; the noisy search counts them (overrides the recipe's trials.earlier_runs).
    earlier_runs: list[str] | None = None
    # The Atlas host type found at the start (A2, A3, 310P; None without npu-smi): which Dockerfile
    # variant and dtype the run uses (execute/host.py recipe_for_host); resume keeps it.
    host: str | None = None
    # --base-image-map PREFIX=MIRROR entries (over the recipe's build.base_image_map), docker builds.
    base_image_map: list[str] = field(default_factory=list)
    # --release-images: published images of release tags ({tag}), reused as full builds of their keys.
    release_images: str | None = None
    # The oracle is a Python callable (bisect_npu.api), named `module:qualname`; the journal cannot
    # hold the callable itself, so only the API resumes such a session, given it again.
    python_oracle: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_header(self) -> HeaderOptions:
        return HeaderOptions(**self.to_json())

    @classmethod
    def from_header(cls, header: HeaderOptions) -> RunOptions:
        return cls.from_json(header.model_dump())

    def run_argv(self) -> list[str]:
        """The `bisect-npu run` arguments that give these options again (the report's reproduce line)."""
        return self.to_header().run_argv()

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def earlier_runs_spec(options: RunOptions, recipe: Recipe | None) -> EarlierRunsSpec | None:
    """The ends' earlier runs: --earlier-runs, else the recipe's ``trials.earlier_runs``."""
    if not options.earlier_runs:
        return recipe.trials.earlier_runs if recipe else None
    bad_end, good_end = options.earlier_runs
    try:
        return EarlierRunsSpec(bad_end=bad_end, good_end=good_end)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise UsageError(f"--earlier-runs {bad_end} {good_end}: {reason}") from exc


def earlier_runs_for_search(spec: EarlierRunsSpec, *, find_fix: bool) -> EarlierRuns:
    """The recipe's counts in the search's terms: "bad" is the side the search hunts for. With
    --find-fix that is the side without the symptom, so the ends swap and passes count."""
    (bad_failed, bad_runs), (good_failed, good_runs) = spec.counts("bad_end"), spec.counts("good_end")
    if find_fix:
        return EarlierRuns(good_runs - good_failed, good_runs, bad_runs - bad_failed, bad_runs)
    return EarlierRuns(bad_failed, bad_runs, good_failed, good_runs)
