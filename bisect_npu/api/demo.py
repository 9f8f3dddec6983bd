"""The demo: the bundled demo upstream (generated once, then cached) and its cases, each bisected
on the CPU with its recipe and checked against the manifest's ground truth; what `bisect-npu
demo` runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bisect_npu.errors import UsageError

if TYPE_CHECKING:
    from bisect_npu.api.bisection import Result
    from bisect_npu.demo.check import CaseCheck
    from bisect_npu.demo.manifest import CaseTruth, Manifest


@dataclass(frozen=True)
class DemoUpstream:
    """The generated upstream's clone and its manifest (the ground truth of every case)."""

    repo: Path
    manifest: Manifest


@dataclass(frozen=True)
class DemoCase:
    """A demo case: its ground truth and the recipe that bisects it."""

    name: str
    truth: CaseTruth
    recipe: str


@dataclass(frozen=True)
class DemoOutcome:
    """A case bisected: how the bisection ended, its top level's report (which shows the finer
    level's answer) and the answer checked link by link against the manifest."""

    case: DemoCase
    result: Result
    report: Path
    check: CaseCheck

    @property
    def match(self) -> bool:
        return self.check.match

    def summary(self) -> dict[str, Any]:
        """What `bisect-npu demo --json` prints for the case."""
        truth = self.case.truth
        summary: dict[str, Any] = {"case": self.case.name, "status": self.result.status,
                                   "culprit": self.check.links[0][1], "expected": truth.culprit.sha,
                                   "match": self.match, "report": str(self.report)}
        if truth.dependency:
            summary["dependency"] = self.check.summary()
        return summary


def demo_upstream(seed: int = 0) -> DemoUpstream:
    """The demo upstream of `seed`, generated into the cache the first time."""
    from bisect_npu.demo.generate import ensure_upstream

    repo, manifest = ensure_upstream(seed)
    return DemoUpstream(repo, manifest)


def demo_cases(upstream: DemoUpstream, case: str | None = None,
               harness: Literal["lm_eval", "aisbench"] = "lm_eval") -> list[DemoCase]:
    """The case named (default: the manifest's default; `all`: every case); `harness` scores the
    accuracy case."""
    from bisect_npu.demo.accuracy import RECIPES as ACCURACY_RECIPES

    manifest = upstream.manifest
    names = [c.name for c in manifest.cases] if case == "all" else [case or manifest.default_case]
    known = {c.name for c in manifest.cases}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown demo case {unknown[0]!r}; known: {', '.join(sorted(known))}, all")
    cases = []
    for name in names:
        truth = manifest.case(name)
        cases.append(DemoCase(name, truth, ACCURACY_RECIPES[harness] if name == "accuracy" else truth.recipe))
    return cases


def run_demo_case(upstream: DemoUpstream, case: DemoCase, *, executor: Literal["local", "docker"] = "local",
                  verify_fix: bool = True, session_root: str | Path | None = None, quiet: bool = False,
                  live: bool = False, on_session: Callable[[Path], None] | None = None) -> DemoOutcome:
    """Bisect the case in a new session under `session_root` (default: beside `run`'s), then check
    its answer. A case whose culprit moves a dependency's pin crosses into the generated
    dependency's clone."""
    from bisect_npu.api.bisection import bisect
    from bisect_npu.demo.check import check_case
    from bisect_npu.journal import DEFAULT_ROOT, new_session_dir
    from bisect_npu.request import RunRequest

    truth = case.truth
    dep_repos = [f"{truth.dependency.name}={upstream.manifest.dependency(truth.dependency.name).repo}"] if (
        truth.dependency) else []
    request = RunRequest.of(good=truth.good_ref, bad=truth.bad_ref, repo=str(upstream.repo), recipe=case.recipe,
                            executor=executor, verify_fix=verify_fix, dep_repos=dep_repos)
    root = Path(session_root) if session_root is not None else DEFAULT_ROOT
    top = new_session_dir(root).resolve()
    result = bisect(request, session_dir=top, quiet=quiet, live=live, on_session=on_session)
    return DemoOutcome(case, result, top / "report.md", check_case(truth, top))
