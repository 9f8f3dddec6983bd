"""The library surface of bisect-npu: what a Python program may import and rely on. Everything
else in the package is internal and may change between releases.

    from bisect_npu.api import bisect

    def oracle(checkout: Path, commit: str) -> bool:   # True: good, False: bad
        return "NaN" not in subprocess.run([...], cwd=checkout, capture_output=True, text=True).stdout

    result = bisect("path/to/clone", "v0.9.0", "main", oracle=oracle)
    print(result.culprit, result.report)

The oracle is a recipe (its path, a bundled recipe's name, or a loaded Recipe), a command (an
argument list, or one string split as `--cmd` splits it: exit 0 good, 125 skip, 1-127 bad), or
any callable implementing `Oracle`. A session driven by a callable is resumed by calling
`bisect` again with the same `session_dir` and the callable: the journal cannot hold it, so
`bisect-npu resume` refuses such a session.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bisect_npu.contracts import Observation, Verdict, VerdictKind
from bisect_npu.defaults import TRIAL_TIMEOUT_S
from bisect_npu.errors import BisectError, InfrastructureError, UsageError
from bisect_npu.execute.inprocess import Oracle, OracleAnswer, oracle_name
from bisect_npu.fix import FixReport
from bisect_npu.journal import JOURNAL_FILE
from bisect_npu.plan import RangePlan
from bisect_npu.recipe import Recipe, load_recipe

__all__ = [
    "BisectError",
    "FixReport",
    "InfrastructureError",
    "Observation",
    "Oracle",
    "OracleAnswer",
    "RangePlan",
    "Recipe",
    "Result",
    "UsageError",
    "Verdict",
    "VerdictKind",
    "bisect",
    "judge",
    "load_recipe",
    "plan_range",
    "propose_fixes",
]

OracleSpec = Recipe | str | Path | Sequence[str] | Oracle


@dataclass(frozen=True)
class Result:
    """How a bisection ended. `status`: "found" (exit code 0: `culprit` is the first bad commit),
    "narrowed" (3: `range` (lo, hi] holds it, the commits between could not be tested) or
    "ends_wrong" (4: an end was not judged as given; `message` says which)."""

    status: Literal["found", "narrowed", "ends_wrong"]
    exit_code: int
    culprit: str | None
    range: tuple[str, str] | None
    message: str
    steps: int
    session_dir: Path
    report: Path  # report.md
    report_json: Path


def bisect(repo: str | Path, good: str, bad: str, *, oracle: OracleSpec, session_dir: str | Path | None = None,
           executor: Literal["local", "docker"] = "local", mode: Literal["exact", "noisy"] | None = None,
           confidence: float | None = None, check_ends: bool = True, timeout_s: float = TRIAL_TIMEOUT_S,
           devices: Sequence[int] = (), propose_fix: bool = True, verify_fix: bool = False,
           find_fix: bool = False, first_parent_only: bool = False, quiet: bool = False) -> Result:
    """Find the first commit of `repo` between `good` and `bad` that the oracle judges bad (with
    `find_fix`, the first where it no longer does), write the journal and the reports, return how
    it ended. `repo` is a clone or a URL; `session_dir` is where the session goes (default: a new
    one under .bisect-npu/sessions); when it holds a session already, that session is resumed.
    `mode` defaults to the recipe's trials.mode (exact for a command or a callable). A callable
    runs in this process on a local checkout (executor "local"), without a timeout. A culprit that
    is a merge is descended into (the commits it brought in) unless `first_parent_only`. Progress
    lines go to stderr unless `quiet`."""
    from bisect_npu.orchestration.levels import Bisection
    from bisect_npu.orchestration.options import RunOptions
    from bisect_npu.progress import PlainProgress
    from bisect_npu.report import write_reports

    progress = PlainProgress(io.StringIO() if quiet else None)
    recipe, command, function = _oracle_parts(oracle)
    path = Path(session_dir).resolve() if session_dir is not None else None
    if path is not None and (path / JOURNAL_FILE).exists():
        bisection = Bisection.resume(path, progress=progress, oracle=function)
        _check_resumed(bisection.session.options, good, bad, function)
    else:
        options = RunOptions(good=good, bad=bad, repo=str(repo), recipe=recipe, command=command,
                             python_oracle=oracle_name(function) if function else None, executor=executor,
                             devices=list(devices), mode=mode, confidence=confidence, check_ends=check_ends,
                             timeout_s=timeout_s, propose_fix=propose_fix, verify_fix=verify_fix, find_fix=find_fix,
                             first_parent_only=first_parent_only)
        bisection = Bisection.start(options, session_dir=path, progress=progress, oracle=function)
    outcome = bisection.run()
    md_path, json_path = write_reports(outcome.session_dir)
    return Result(outcome.status, outcome.exit_code, outcome.culprit, outcome.range, outcome.message, outcome.steps,
                  outcome.session_dir, md_path, json_path)


def _oracle_parts(oracle: OracleSpec) -> tuple[str | None, list[str] | None, Oracle | None]:
    """(recipe, command, callable): a Recipe, a Path, a `.yaml` file or a bundled recipe's name is
    a recipe; another string is a command split as `--cmd` splits it; a list of strings is a
    command's arguments; a callable is a Python oracle."""
    from bisect_npu.orchestration.preflight import command_words

    if isinstance(oracle, Recipe):
        if not oracle.source or not Path(oracle.source).is_file():
            raise UsageError("a Recipe given as the oracle must come from a file (load_recipe): the journal "
                             "names its file so the session can resume")
        return oracle.source, None, None
    if isinstance(oracle, Path) or (isinstance(oracle, str) and _names_recipe(oracle)):
        return str(oracle), None, None
    if isinstance(oracle, str):
        return None, command_words(oracle), None
    if callable(oracle):
        return None, None, oracle
    if isinstance(oracle, Sequence) and oracle and all(isinstance(word, str) for word in oracle):
        return None, list(oracle), None
    raise UsageError(f"oracle {oracle!r}: give a recipe, a command (a string or a list of strings) or a callable")


def _names_recipe(text: str) -> bool:
    if text.endswith((".yaml", ".yml")):
        return True
    if any(c.isspace() for c in text) or "/" in text or Path(text).exists():
        return False
    try:
        load_recipe(text)
    except UsageError:
        return False
    return True


def _check_resumed(options: object, good: str, bad: str, function: Oracle | None) -> None:
    """A resumed session must be the one asked for: the same ends, and a callable where it had one."""
    from bisect_npu.orchestration.options import RunOptions

    assert isinstance(options, RunOptions)
    if (options.good, options.bad) != (good, bad):
        raise UsageError(f"the session given bisects {options.good}..{options.bad}, not {good}..{bad}; give "
                         "another session_dir for a new bisection")
    if function is not None and options.python_oracle != oracle_name(function):
        raise UsageError(f"the session given was judged by {options.python_oracle or 'a recipe or command'}, "
                         f"not by {oracle_name(function)}")


def judge(recipe: Recipe | str | Path, observations: Sequence[Observation | str | Path],
          reference: Sequence[Observation] | None = None) -> Verdict:
    """Judge one commit's observations (objects or observation JSON files) with a recipe's
    oracle, as a session judges a step; `reference` is the good end's observations where the
    recipe's oracle compares against one."""
    from bisect_npu import oracle

    loaded = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    observed = [o if isinstance(o, Observation) else Observation.load(Path(o)) for o in observations]
    return oracle.judge(loaded.oracle, observed, list(reference) if reference is not None else None,
                        trials_per_case=loaded.trials.count, accuracy=loaded.accuracy)


def propose_fixes(repo: str | Path, culprit: str, *, bad: str | None = None, symptom: Sequence[str] = (),
                  top: int = 5) -> FixReport:
    """Rank the upstream commits that fix `culprit` (on the branches holding it, or `bad`'s),
    each with the reasons a reviewer can check."""
    from bisect_npu import fix, history

    return fix.propose_fixes(history.open_repo(str(repo)), culprit, bad=bad, symptom=symptom, top=top)


def plan_range(repo: str | Path, good: str, bad: str, *, dockerfile: str = "Dockerfile") -> RangePlan:
    """What bisecting `good`..`bad` would cost, running nothing: candidates, build groups,
    expected steps, full builds and hours."""
    from bisect_npu import history, plan

    return plan.plan_range(history.open_repo(str(repo)), good, bad, dockerfile=dockerfile)
