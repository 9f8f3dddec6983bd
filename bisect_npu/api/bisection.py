"""`bisect`, `resume`, `judge`, `propose_fixes` and `plan_range`: a bisection and its parts, as
`bisect_npu.api` exports them."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bisect_npu.errors import UsageError
from bisect_npu.execute.inprocess import Oracle, oracle_name
from bisect_npu.journal import JOURNAL_FILE, session_named
from bisect_npu.observations import Observation, Verdict
from bisect_npu.progress import Progress
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import Recipe
from bisect_npu.request import RunRequest

if TYPE_CHECKING:
    from bisect_npu.fix import FixReport
    from bisect_npu.forecast.plan import RangePlan
    from bisect_npu.orchestration.bisection import Bisection

OracleSpec = Recipe | str | Path | Sequence[str] | Oracle


@dataclass(frozen=True)
class Result:
    """How a bisection ended. `status`: "found" (exit code 0: `culprit` is the first bad commit, as
    sure as the confidence asked), "narrowed" (3: `range` (lo, hi] holds it, the commits between
    could not be tested, or their steps disagree with each other, or no commit reached the
    confidence asked: `best_guess` is then the one the search leaned to, `range` the run of
    commits around it that holds the confidence) or
    "ends_wrong" (4: an end was not judged as given; `message` says which, `output_tail` shows the
    last lines of that end's run)."""

    status: Literal["found", "narrowed", "ends_wrong"]
    exit_code: int
    culprit: str | None
    range: tuple[str, str] | None
    message: str
    steps: int
    session_dir: Path
    report: Path  # report.md
    report_json: Path
    output_tail: str = ""
    best_guess: str | None = None


def bisect(request: RunRequest | str | Path, good: str | None = None, bad: str | None = None, *,
           oracle: OracleSpec | None = None, session_dir: str | Path | None = None, quiet: bool = False,
           live: bool = False, on_session: Callable[[Path], None] | None = None, **fields: Any) -> Result:
    """Run a bisection and write its journal and reports; return how it ended. The one entry
    point: `bisect-npu run` calls it too.

    `request` is a `RunRequest`, or a repository (a clone or a URL) with `good`, `bad`, the
    `oracle` and any request field by name (`RunRequest.of`: `executor`, `mode`, `devices`,
    `find_fix`, `first_parent_only`, ...), which find the first commit between `good` and `bad`
    the oracle judges bad (with `find_fix`, the first where it no longer does). `oracle`: with a
    `RunRequest`, only a callable (a request names its recipe or command itself). `session_dir`
    is where the session goes (default: a new one under .bisect-npu/sessions); when it holds a
    session already, that session is resumed where it is the run asked (else refused, naming the
    difference). `mode` defaults to the recipe's trials.mode (exact
    for a command or a callable). A callable runs in this process on a local checkout (executor
    "local"), without a timeout. A culprit that is a merge is descended into (the commits it
    brought in) unless `first_parent_only`. Progress lines go to stderr unless `quiet`; `live`: a
    live display where stderr is a terminal. `on_session` is called with the session directory
    once it exists, before anything runs."""
    from bisect_npu.orchestration.bisection import Bisection
    from bisect_npu.orchestration.opening.open_session import check_same_request
    from bisect_npu.orchestration.opening.session_spec import SessionSpec

    if isinstance(request, RunRequest):
        if oracle is not None and not callable(oracle):
            raise UsageError("a RunRequest names its recipe or command itself: give `oracle` only as a callable")
        function = oracle if callable(oracle) else None
    else:
        if good is None or bad is None or oracle is None:
            raise UsageError("bisect(repo, good, bad, oracle=...): give both ends and the oracle, or a RunRequest")
        recipe, command, function = _oracle_parts(oracle)
        request = RunRequest.of(repo=str(request), good=good, bad=bad, recipe=recipe, command=command, **fields)
    if request.judge.unit_tests and request.judge.command:
        raise UsageError("--unit-test runs vllm-ascend's unit tests as the oracle, --cmd a command: give one of them")
    progress = progress_for(quiet, live)
    path = session_named(Path(session_dir)).resolve() if session_dir is not None else None
    name = oracle_name(function) if function else None
    if path is not None and (path / JOURNAL_FILE).exists():
        check_same_request(path, request, name)
        bisection = Bisection.resume(path, progress=progress, oracle=function)
    else:
        bisection = Bisection.start(SessionSpec.of(request, python_oracle=name), session_dir=path, progress=progress,
                                    oracle=function)
    return _run(bisection, on_session)


def resume(session_dir: str | Path | None = None, *, oracle: Oracle | None = None, quiet: bool = False,
           live: bool = False, on_session: Callable[[Path], None] | None = None,
           accept_changed_command: bool = False) -> Result:
    """Continue an interrupted session (default: the latest under .bisect-npu/sessions) without
    redoing a finished step; `oracle`: the callable a session started through `bisect` judged by.
    `accept_changed_command`: continue though what the command sees changed since the session
    started (a fix of the command that aborted it, which judges every commit as before)."""
    from bisect_npu.orchestration.bisection import Bisection

    path = session_named(Path(session_dir)).resolve() if session_dir is not None else None
    return _run(Bisection.resume(path, progress=progress_for(quiet, live), oracle=oracle,
                                 accept_changed_command=accept_changed_command), on_session)


def progress_for(quiet: bool, live: bool) -> Progress:
    """Where a session's progress lines go: a terminal display (`live`), else plain lines on stderr
    (none where `quiet`)."""
    from bisect_npu.progress import PlainProgress, make_progress

    return make_progress(quiet) if live else PlainProgress(io.StringIO() if quiet else None)


def _run(bisection: Bisection, on_session: Callable[[Path], None] | None) -> Result:
    from bisect_npu.report import report_paths

    if on_session is not None:
        on_session(bisection.session_dir)
    outcome = bisection.run()
    md_path, json_path = report_paths(outcome.session_dir)
    return Result(outcome.status, outcome.exit_code, outcome.culprit, outcome.range, outcome.message, outcome.steps,
                  outcome.session_dir, md_path, json_path, outcome.output_tail, outcome.best_guess)


def _oracle_parts(oracle: OracleSpec) -> tuple[str | None, list[str] | None, Oracle | None]:
    """(recipe, command, callable): a Recipe, a Path, a `.yaml` file or a bundled recipe's name is
    a recipe; another string is a command split as `--cmd` splits it; a list of strings is a
    command's arguments; a callable is a Python oracle."""
    from bisect_npu.orchestration.opening.preflight import command_words

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


def judge(recipe: Recipe | str | Path, observations: Sequence[Observation | str | Path],
          reference: Sequence[Observation | str | Path] | None = None) -> Verdict:
    """Judge one commit's observations (objects or observation JSON files) with a recipe's
    oracle, as a session judges a step; `reference` is the good end's observations (objects or
    files) where the recipe's oracle compares against one."""
    from bisect_npu import oracle

    loaded = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    judged = _observations(observations)
    references = _observations(reference) if reference is not None else None
    digest = loaded.run_digest()
    for obs in judged:
        _same_recipe(obs, loaded.name, digest)
        if references is not None:
            _has_reference(obs, references)
    return oracle.judge(loaded.oracle, judged, references, trials_per_case=loaded.trials.count,
                        accuracy=loaded.accuracy)


def _same_recipe(obs: Observation, name: str, digest: str) -> None:
    """Refuse an observation another recipe wrote, or (the observation carries a run digest) output
    of another version of this recipe's case: its verdict would mean nothing. A changed oracle or
    reference is no such change: judging old output again under a new rule is what `judge` is
    for. References are not checked: a golden record may come from another backend's recipe of the
    same cases (the oracle pairs by case, and refuses a pair of another prompt or vocabulary: `oracle.same_case`)."""
    where = f"an observation of commit {obs.commit[:12] or '?'} (case {obs.case_id})"
    if obs.recipe and obs.recipe != name:  # another case's output
        raise UsageError(f"{where} was written for recipe {obs.recipe!r}, not {name!r}: judge it with the recipe "
                         "that ran it")
    if obs.run_digest and obs.run_digest != digest:
        raise UsageError(f"{where} was written for recipe {name!r} at run digest {obs.run_digest}, not this one's "
                         f"{digest}: what the recipe runs changed since; judge it with the version that ran it, or "
                         "run that commit again with this one")


def _has_reference(obs: Observation, references: list[Observation]) -> None:
    """Refuse references none of which is of the observation's case: nothing would be compared."""
    if references and not any(ref.case_id == obs.case_id for ref in references):
        held = sorted({ref.case_id for ref in references})
        raise UsageError(f"no reference of case {obs.case_id}: the references are of case(s) {', '.join(held)} "
                         f"(recipe {references[0].recipe or '?'}); give the reference of the same case")


def _observations(given: Sequence[Observation | str | Path]) -> list[Observation]:
    """Objects, or files read with their relative dump paths resolved against their directory (a record's)."""
    from bisect_npu.alignment.record import load_observation

    return [o if isinstance(o, Observation) else load_observation(Path(o)) for o in given]


def propose_fixes(repo: str | Path, culprit: str, *, bad: str | None = None, symptom: Sequence[str] = (),
                  top: int = 5) -> FixReport:
    """Rank the upstream commits that fix `culprit` (on the branches holding it, or `bad`'s),
    each with the reasons a reviewer can check."""
    from bisect_npu import fix
    from bisect_npu.upstream import history

    return fix.propose_fixes(history.open_repo(str(repo)), culprit, bad=bad, symptom=symptom, top=top)


def plan_range(repo: str | Path, good: str, bad: str, *, dockerfile: str = "Dockerfile") -> RangePlan:
    """What bisecting `good`..`bad` would cost, running nothing: candidates, build groups,
    expected steps, full builds and hours."""
    from bisect_npu.forecast import plan
    from bisect_npu.upstream import history

    return plan.plan_range(history.open_repo(str(repo)), good, bad, dockerfile=dockerfile)
