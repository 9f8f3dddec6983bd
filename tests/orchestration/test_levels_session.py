"""A throughput session in levels mode (search/two_levels.py through the session engine): one run a
step, every run of every commit the search's evidence. A real git history made here, real
worktrees, the real journal and report; the NPU host's benchmark run is stood in for at the
executor (tests/helpers/npu_throughput.py), its throughput dropping at the history's culprit with
a seeded run-to-run spread."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import git
import pytest

from bisect_npu.builders.local import LocalBuilder
from bisect_npu.forecast.simulate import Throughput, simulate
from bisect_npu.orchestration.ending.result import EXIT_ENDS_WRONG, EXIT_FOUND
from bisect_npu.orchestration.session import Session
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.report import write_reports
from tests.helpers.asked import spec_of
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.npu_throughput import ENGINE_NEVER_STARTED, NpuThroughputStandIn, perf_recipe, slow_before_culprit

pytestmark = pytest.mark.e2e  # sessions, end to end

N = 24  # commits: the good end 0, candidates 1..23
CULPRIT = 15
DROP, SPREAD = 0.07, 0.02


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    where = tmp_path_factory.mktemp("levels")
    shas = make_linear_repo(where / "repo", N, culprit=CULPRIT,
                            files=lambda i: {"BROKEN": "x\n"} if i == 6 else {"BROKEN": None} if i == 7 else {})
    return where / "repo", shas


def _start(tmp: Path, repo: Path, shas: list[str], stand_in: NpuThroughputStandIn, search: str = "levels",
           name: str = "s", baseline: float | None = None, earlier_runs: dict[str, Any] | None = None,
           find_fix: bool = False) -> Session:
    recipe = perf_recipe(tmp / f"{name}-recipe.yaml", search, baseline, earlier_runs)
    spec = spec_of(good=shas[0], bad=shas[-1], repo=str(repo), recipe=str(recipe), propose_fix=False,
                   find_fix=find_fix)
    builder = LocalBuilder(git.Repo(repo), tmp / f"{name}-work", ["sh", "-c", "test ! -e BROKEN"])
    return Session.start(spec, session_dir=tmp / name, builder=builder, executor=stand_in)


def _session(tmp: Path, repo: Path, shas: list[str], stand_in: NpuThroughputStandIn, search: str = "levels",
             name: str = "s") -> tuple[Any, Path]:
    result = _start(tmp, repo, shas, stand_in, search, name).run()
    write_reports(tmp / name)
    return result, tmp / name


def _records(session: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]


def test_levels_mode_names_the_culprit_with_fewer_runs_than_per_step_trials(
        history: tuple[Path, list[str]], tmp_path: Path) -> None:
    """Over a few seeded spreads of runs, levels mode names the culprit each time and spends fewer
    runs in all than per-step trials on the same draws; its journal and report say what it did."""
    repo, shas = history
    levels_runs, per_step_runs = [], []
    for seed in range(4):
        levels = NpuThroughputStandIn(DROP, SPREAD, seed=seed)
        result, session = _session(tmp_path, repo, shas, levels, name=f"levels{seed}")
        assert result.exit_code == EXIT_FOUND and result.culprit == shas[CULPRIT]
        levels_runs.append(levels.runs)
        per_step = NpuThroughputStandIn(DROP, SPREAD, seed=seed)
        old, _ = _session(tmp_path, repo, shas, per_step, "per_step", name=f"per_step{seed}")
        assert old.culprit == shas[CULPRIT]
        per_step_runs.append(per_step.runs)
    assert sum(levels_runs) < sum(per_step_runs), (levels_runs, per_step_runs)

    records = _records(session)
    steps = [r for r in records if r["type"] == "step"]
    # one run a step (a build that failed ran none), every run journaled as its own trial
    assert all(len(s["trials"]) == 1 for s in steps if s["build"]["how"] != "failed")
    assert sum(r["type"] == "trial" for r in records) == levels.runs
    assert all("one run (levels search)" in s["verdict"]["reason"]
               for s in steps if s["verdict"]["kind"] != "skip")
    end = next(r for r in records if r["type"] == "end")
    assert end["figures"]["posterior"] >= 0.99 and end["figures"]["confidence_asked"] == 0.99
    assert end["figures"]["runs"] == levels.runs
    report = (session / "report.md").read_text()
    assert "posterior that this is the first bad commit" in report
    assert "the search stopped when it reached the 99.0% asked" in report
    assert f"{levels.runs} runs in all, one a step" in report
    # Every commit its own build (no keys), the search is still told what a build costs in runs: a
    # run may go to a built commit again instead.
    resumed = Session.resume(session)
    try:
        told = resumed.problem()
    finally:
        resumed.evaluator.close()
        resumed.journal.close()
    assert told.build_groups is None and told.build_cost > 0


def test_a_resumed_session_redoes_nothing_and_answers_the_same(history: tuple[Path, list[str]],
                                                                tmp_path: Path) -> None:
    """Killed after some steps and one trial of the next (its step not journaled yet), the session
    resumes: no journaled run is made again, and it takes the uninterrupted session's path. Its
    header without the search (as written before it was kept), the journal's steps say levels."""
    repo, shas = history
    whole = NpuThroughputStandIn(DROP, SPREAD, seed=5)
    result, session = _session(tmp_path, repo, shas, whole)
    cut_dir = tmp_path / "cut"
    # the header as the version before it kept the search wrote it: levels, from its steps
    journaled = _cut(session, cut_dir, keep_pin=False)

    resumed_runs = NpuThroughputStandIn(DROP, SPREAD, seed=5)
    builder = LocalBuilder(git.Repo(repo), tmp_path / "cut-work", ["sh", "-c", "test ! -e BROKEN"])
    again = Session.resume(cut_dir, builder=builder, executor=resumed_runs).run()
    assert again.culprit == result.culprit == shas[CULPRIT]
    assert not journaled & set(resumed_runs.attempts), "a journaled run was made again"
    assert resumed_runs.runs + len(journaled) == whole.runs
    assert [r["index"] for r in _records(cut_dir) if r["type"] == "step"] == \
        [r["index"] for r in _records(session) if r["type"] == "step"]
    write_reports(cut_dir)
    assert "posterior that this is the first bad commit" in (cut_dir / "report.md").read_text()


def _cut(session: Path, where: Path, keep_pin: bool = True) -> set[tuple[str, int]]:
    """A copy of `session` at `where` as a run killed after half its steps and one trial of the
    next left it (`keep_pin` False: its header as the versions before `throughput_search` wrote
    it); the trials it journaled."""
    lines = (session / "journal.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["type"] for line in lines]
    steps_at = [i for i, kind in enumerate(kinds) if kind == "step"]
    cut = steps_at[len(steps_at) // 2] + 2  # the next step's trial is journaled, not its step
    assert kinds[cut - 1] == "trial"
    shutil.copytree(session, where)
    header = json.loads(lines[0])
    if not keep_pin:
        header.pop("throughput_search", None)
    (where / "journal.jsonl").write_text("\n".join([json.dumps(header), *lines[1:cut]]) + "\n")
    for name in ("report.md", "report.json"):
        (where / name).unlink(missing_ok=True)
    return {(r["commit"], r["trial"]) for r in map(json.loads, lines[1:cut]) if r["type"] == "trial"}


def test_a_per_step_session_an_older_version_started_resumes_per_step(
        history: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A per-step session killed mid-way whose journal an older version wrote (no search in its
    header; its recipe without the line, per_step being that version's only search) resumes per
    step now that levels is the default: it says so, redoes no run, and takes the uninterrupted
    session's path, as does a finer level's session below it; its recipe edited to say per_step is
    refused (the line is an edit), naming the line to put back."""
    repo, shas = history
    whole = NpuThroughputStandIn(DROP, SPREAD, seed=3)
    result, session = _session(tmp_path, repo, shas, whole, "per_step", name="old")
    assert result.culprit == shas[CULPRIT]
    cut_dir = tmp_path / "old-cut"
    journaled = _cut(session, cut_dir, keep_pin=False)
    recipe = perf_recipe(tmp_path / "old-recipe.yaml")  # the recipe as the older version read it: no line
    lines = (cut_dir / "journal.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    assert header["request"]["judge"]["recipe"] == str(recipe.resolve())
    header["recipe_digest"] = load_recipe(recipe).digest()
    (cut_dir / "journal.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")

    perf_recipe(recipe, "per_step")  # edited to say what the session searches: still an edit, refused
    edited = cli_in_process(["resume", "--session", str(cut_dir)])
    assert edited.returncode == 2, edited.stderr
    assert "`oracle.throughput.search: levels` (or no line: the default) back" in edited.stderr
    assert "Traceback" not in edited.stderr
    perf_recipe(recipe)
    assert (cut_dir / "journal.jsonl").read_text().splitlines() == [json.dumps(header), *lines[1:]]

    resumed_runs = NpuThroughputStandIn(DROP, SPREAD, seed=3)
    builder = LocalBuilder(git.Repo(repo), tmp_path / "old-cut-work", ["sh", "-c", "test ! -e BROKEN"])
    resumed = Session.resume(cut_dir, builder=builder, executor=resumed_runs)
    again = resumed.run()
    assert "searching per_step, as this session started" in capsys.readouterr().err
    assert again.culprit == shas[CULPRIT]
    assert not journaled & set(resumed_runs.attempts), "a journaled run was made again"
    assert set(resumed_runs.attempts) <= set(whole.attempts)

    def steps(where: Path) -> list[tuple[int, int, str]]:
        return [(r["index"], len(r["trials"]), r["verdict"]["figures"]["stopped"])
                for r in _records(where) if r["type"] == "step"]
    assert steps(cut_dir) == steps(session)  # the same steps, each its per-step trials, stopped as sure
    assert "levels search" not in {stopped for _index, _trials, stopped in steps(cut_dir)}

    # a finer level's session below it searches as it does
    spec = spec_of(good=shas[0], bad=shas[-1], repo=str(repo), recipe=str(recipe), propose_fix=False)
    child = Session.start(spec, session_dir=tmp_path / "finer", executor=resumed_runs, parent=cut_dir,
                          searching=resumed.throughput_search)  # as Bisection starts a finer level
    try:
        assert not child.levels and child.journal.header.throughput_search == "per_step"
    finally:
        child.close()


def test_a_levels_session_whose_recipe_turned_per_step_is_refused_on_resume(
        history: tuple[Path, list[str]], tmp_path: Path) -> None:
    """A levels session's header keeps its search: a recipe edited to `search: per_step` since
    is refused in one line naming the line to put back (exit 2, the journal as it was); put back,
    the session resumes in levels mode."""
    repo, shas = history
    session = _start(tmp_path, repo, shas, NpuThroughputStandIn(DROP, SPREAD, seed=4))
    session.close()
    header = json.loads((tmp_path / "s" / "journal.jsonl").read_text().splitlines()[0])
    assert header["throughput_search"] == "levels"
    recipe = perf_recipe(tmp_path / "s-recipe.yaml", "per_step")
    before = (tmp_path / "s" / "journal.jsonl").read_text()
    refused = cli_in_process(["resume", "--session", str(tmp_path / "s")])
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "its oracle.throughput.search is now per_step, not levels" \
        in refused.stderr and "`oracle.throughput.search: levels` (or no line: the default) back" in refused.stderr
    assert (tmp_path / "s" / "journal.jsonl").read_text() == before
    perf_recipe(recipe)
    resumed = Session.resume(tmp_path / "s", executor=NpuThroughputStandIn(DROP, SPREAD, seed=4))
    try:
        assert resumed.levels and resumed.problem().mode == "levels"
    finally:
        resumed.close()


def test_a_crashed_run_is_retried_and_a_failed_build_stepped_around(history: tuple[Path, list[str]],
                                                                     tmp_path: Path) -> None:
    """The bad end's first run crashes (the engine never starts): it is journaled as a failed
    attempt and run again; commit 6 does not build: a skip the search steps around."""
    repo, shas = history
    crashing = NpuThroughputStandIn(DROP, SPREAD, seed=11,
                                    crashes=lambda commit, trial, attempt: (commit, trial, attempt) == (shas[-1], 0, 1))
    result, session = _session(tmp_path, repo, shas, crashing)
    assert result.culprit == shas[CULPRIT]
    records = _records(session)
    retries = [r for r in records if r["type"] == "retry"]
    assert [(r["index"], r["kind"]) for r in retries] == [(N - 1, "engine_start")]
    assert ENGINE_NEVER_STARTED in retries[0]["cause"] or "engine did not start" in retries[0]["cause"]
    bad_end = [r for r in records if r["type"] == "step" and r["index"] == N - 1]
    assert bad_end[0]["verdict"]["figures"]["throughput_samples"]  # the attempt after the crash measured
    broken = [r for r in records if r["type"] == "step" and r["index"] == 6]
    assert all(r["verdict"]["kind"] == "skip" for r in broken)
    assert crashing.runs == sum(r["type"] in ("trial", "retry") for r in records)


def test_simulate_forecasts_the_runs_the_sessions_spend(history: tuple[Path, list[str]], tmp_path: Path) -> None:
    """`simulate`'s forecast for this range (levels mode, the history's drop and spread) against
    real sessions over it: the sessions' mean runs within a fifth of the forecast's mean, each
    session's within half as much again as the forecast's 95th percentile (the longest of 40
    forecasts is one draw of the tail: six sessions pass it about one time in eight)."""
    repo, shas = history
    spent = []
    for seed in range(6):
        stand_in = NpuThroughputStandIn(DROP, SPREAD, seed=100 + seed)
        result, _ = _session(tmp_path, repo, shas, stand_in, name=f"s{seed}")
        assert result.culprit == shas[CULPRIT]
        spent.append(stand_in.runs)
    forecast = simulate(N - 1, CULPRIT, bad_rate=1.0, good_rate=0.0, runs=40, seed=0, unbuildable=[6],
                        throughput=Throughput(DROP, SPREAD, baseline=1.0))
    assert forecast.accuracy >= 0.97
    mean = sum(spent) / len(spent)
    assert abs(mean - forecast.mean_trials) <= 0.2 * forecast.mean_trials, (spent, forecast)
    assert all(s <= 1.5 * forecast.p95_trials for s in spent), (spent, forecast)


def test_the_published_baseline_is_the_searchs_prior_and_a_wrong_one_costs_runs_not_the_answer(
        history: tuple[Path, list[str]], tmp_path: Path) -> None:
    """The recipe's `oracle.throughput.baseline` reaches the levels search (tokens/s, the runs'
    unit); a baseline from another host, 20% over what the good side runs at, still ends on the
    culprit, with at least the runs a right one needs."""
    repo, shas = history
    spent = {}
    for baseline in (1000.0, 1200.0):
        stand_in = NpuThroughputStandIn(DROP, SPREAD, seed=7)
        session = _start(tmp_path, repo, shas, stand_in, name=f"b{baseline:.0f}", baseline=baseline)
        assert session.problem().baseline == baseline
        assert session.run().culprit == shas[CULPRIT]
        spent[baseline] = stand_in.runs
    assert spent[1200.0] >= spent[1000.0], spent


def test_a_bad_end_that_is_not_slower_is_an_end_judged_wrong(history: tuple[Path, list[str]],
                                                             tmp_path: Path) -> None:
    """Where the bad end runs 5% faster than the good end, the runs make it sure its mean is not
    under the good end's line: exit 4, the message saying both ends' runs; each end ran twice; the
    report's evidence gives each end's runs, the line and the failing nightly's run (not weighed),
    and report.json's evidence the same nightly run beside P(under the line)."""
    repo, shas = history
    faster = NpuThroughputStandIn(-0.05, SPREAD, seed=2)
    result = _start(tmp_path, repo, shas, faster, earlier_runs={"bad": [930.0]}).run()
    session = tmp_path / "s"
    write_reports(session)
    assert result.exit_code == EXIT_ENDS_WRONG and result.status == "ends_wrong"
    assert "precondition failed: the bad end" in result.message and "P(under the good end's line)" in result.message
    steps = [r["index"] for r in _records(session) if r["type"] == "step"]
    assert steps.count(0) >= 2 and steps.count(N - 1) >= 2
    assert "\n- the bad end: " in (report := (session / "report.md").read_text()) and "- the line: 0.97 x" in report
    assert "\n- the failing nightly's 930 tokens/s at the bad end, not weighed in judging the ends" in report
    evidence = json.loads((session / "report.json").read_text())["evidence"]
    assert evidence["earlier_bad_runs"] == 1 and evidence["earlier_bad_mean"] == 930.0 and "under_line" in evidence
    assert "confidence_asked" not in evidence  # the search never stopped on a posterior


def test_the_failing_nightlys_throughput_counts_as_a_run_at_the_bad_end(history: tuple[Path, list[str]],
                                                                         tmp_path: Path) -> None:
    """The recipe's `oracle.throughput.earlier_runs` (the failing nightly's 930 tokens/s) reaches
    the levels search: the session's first runs are the good end's, not the bad end's, it names the
    culprit, its journal's end record and its report say the value was counted and where it was
    measured (the file and its model, as `--nightly-result` writes them), and a resumed session
    weighs it again."""
    repo, shas = history
    stand_in = NpuThroughputStandIn(DROP, SPREAD, seed=7)
    source = "--nightly-result bad=/nightly/benchmark_results/speed-a2.json (model_name tiny)"
    session = _start(tmp_path, repo, shas, stand_in, name="nightly", earlier_runs={"bad": [930.0], "source": source})
    assert session.problem().earlier_levels == ((), (930.0,))
    result = session.run()
    write_reports(tmp_path / "nightly")
    assert result.exit_code == EXIT_FOUND and result.culprit == shas[CULPRIT]
    steps = [r["index"] for r in _records(tmp_path / "nightly") if r["type"] == "step"]
    assert steps[:2] == [0, 0], steps
    end = next(r for r in _records(tmp_path / "nightly") if r["type"] == "end")
    assert end["figures"]["earlier_bad_runs"] == 1 and end["figures"]["earlier_bad_mean"] == 930.0
    report = (tmp_path / "nightly" / "report.md").read_text()
    assert "the failing nightly's 930 tokens/s counted as a run at the bad end" in report
    assert f"\n- where they were measured: {source}\n" in report
    _cut(tmp_path / "nightly", tmp_path / "nightly-cut")  # a resume has them from the recipe it ran
    builder = LocalBuilder(git.Repo(repo), tmp_path / "nightly-cut-work", ["sh", "-c", "test ! -e BROKEN"])
    resumed = Session.resume(tmp_path / "nightly-cut", builder=builder, executor=NpuThroughputStandIn(DROP, SPREAD, 7))
    assert resumed.problem().earlier_levels == ((), (930.0,))


def test_a_fix_is_searched_in_levels_mode_against_the_new_ends_line(history: tuple[Path, list[str]],
                                                                    tmp_path: Path) -> None:
    """--find-fix on a history 7% slow up to the fix (the culprit's place) and restored from it on:
    levels mode, one run a step, the new end first (its runs draw the line the old end lies under),
    the fix named; the failing nightly's run counts at the old end; a resumed session redoes no run
    and answers the same; the report says it in the fix's words."""
    repo, shas = history
    stand_in = NpuThroughputStandIn(DROP, SPREAD, seed=7, level_of=slow_before_culprit)
    session = _start(tmp_path, repo, shas, stand_in, name="fix", earlier_runs={"bad": [930.0]}, find_fix=True)
    assert session.levels and session.problem().rising and session.problem().earlier_levels == ((), (930.0,))
    result = session.run()
    write_reports(tmp_path / "fix")
    assert result.exit_code == EXIT_FOUND and result.culprit == shas[CULPRIT]
    assert result.message.startswith(f"first fixed commit: {shas[CULPRIT][:12]}")
    records = _records(tmp_path / "fix")
    steps = [r for r in records if r["type"] == "step"]
    assert steps[0]["index"] == N - 1 and all(len(s["trials"]) == 1 for s in steps)
    old = [s["verdict"]["kind"] for s in steps if s["index"] < CULPRIT]
    assert old and set(old) == {"bad"}, old  # the symptom: under the new end's line
    assert sum(r["type"] == "trial" for r in records) == stand_in.runs
    report = (tmp_path / "fix" / "report.md").read_text()
    assert "posterior that this is the first fixed commit" in report and "the fixed side's mean" in report
    assert "the failing nightly's 930 tokens/s counted as a run at the old end" in report

    journaled = _cut(tmp_path / "fix", tmp_path / "fix-cut")
    again = NpuThroughputStandIn(DROP, SPREAD, seed=7, level_of=slow_before_culprit)
    builder = LocalBuilder(git.Repo(repo), tmp_path / "fix-cut-work", ["sh", "-c", "test ! -e BROKEN"])
    assert Session.resume(tmp_path / "fix-cut", builder=builder, executor=again).run().culprit == shas[CULPRIT]
    assert not journaled & set(again.attempts) and again.runs + len(journaled) == stand_in.runs


def test_a_fix_search_whose_old_end_is_not_slower_is_the_old_end_judged_wrong(history: tuple[Path, list[str]],
                                                                              tmp_path: Path) -> None:
    """--find-fix where the old end runs 5% faster than the new end: the runs make it sure the old
    end is not under the new end's line, so it does not show the symptom (exit 4), the message
    saying both ends' runs."""
    repo, shas = history
    slower = NpuThroughputStandIn(-0.05, SPREAD, seed=2, level_of=slow_before_culprit)
    result = _start(tmp_path, repo, shas, slower, name="nofix", find_fix=True).run()
    assert result.exit_code == EXIT_ENDS_WRONG
    assert f"the old end {shas[0]}" in result.message and "P(under the new end's line)" in result.message


def test_a_fix_searched_per_step_draws_its_line_from_the_new_end(history: tuple[Path, list[str]],
                                                                 tmp_path: Path) -> None:
    """`search: per_step` under --find-fix: the new end runs first, its runs the reference (the old
    end's own runs never lie under their own line, so a line drawn there ended every fix search at
    the old end), the old end judged under it, and the fix named."""
    repo, shas = history
    stand_in = NpuThroughputStandIn(DROP, SPREAD, seed=8, level_of=slow_before_culprit)
    session = _start(tmp_path, repo, shas, stand_in, "per_step", name="fix-per-step", find_fix=True)
    assert not session.levels and session.reference_end == N - 1
    result = session.run()
    assert result.exit_code == EXIT_FOUND and result.culprit == shas[CULPRIT]
    steps = [r for r in _records(tmp_path / "fix-per-step") if r["type"] == "step"]
    assert steps[0]["index"] == N - 1 and len(steps[0]["trials"]) > 1
    assert {s["verdict"]["kind"] for s in steps if s["index"] == 0} == {"bad"}


def test_a_fix_search_an_older_version_started_resumes_in_levels_mode(history: tuple[Path, list[str]],
                                                                      tmp_path: Path) -> None:
    """A --find-fix throughput session an older version started: that version searched a fix per
    step, its line drawn from the old end, whose reference runs came first, while its header kept
    the recipe's search (levels). Killed among those runs, or after their step, it resumes in
    levels mode against the new end's line: no journaled run made again, the old end's runs
    weighed as runs, the fix named and reported."""
    repo, shas = history
    # The older version's journal begins as a per-step regression session's does on the same
    # history (the old end's reference step); its header differs in find_fix and the search alone.
    recipe = perf_recipe(tmp_path / "old-fix-recipe.yaml")
    spec = spec_of(good=shas[0], bad=shas[-1], repo=str(repo), recipe=str(recipe), propose_fix=False)
    builder = LocalBuilder(git.Repo(repo), tmp_path / "old-fix-work", ["sh", "-c", "test ! -e BROKEN"])
    Session.start(spec, session_dir=tmp_path / "old-fix", builder=builder, executor=NpuThroughputStandIn(
        DROP, SPREAD, seed=9, level_of=slow_before_culprit), searching="per_step").run()
    lines = (tmp_path / "old-fix" / "journal.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["request"]["search"]["find_fix"], header["throughput_search"] = True, "levels"
    records = [json.loads(line) for line in lines]
    first_step = next(i for i, r in enumerate(records) if r["type"] == "step")
    assert records[first_step]["index"] == 0 and len(records[first_step]["trials"]) > 3
    for name, cut in (("among", 4), ("after", first_step + 1)):  # 3 of the old end's runs; its whole step
        where = tmp_path / f"old-fix-{name}"
        shutil.copytree(tmp_path / "old-fix", where)
        (where / "journal.jsonl").write_text("\n".join([json.dumps(header), *lines[1:cut]]) + "\n")
        journaled = {(r["commit"], r["trial"]) for r in records[1:cut] if r["type"] == "trial"}
        again = NpuThroughputStandIn(DROP, SPREAD, seed=9, level_of=slow_before_culprit)
        builder = LocalBuilder(git.Repo(repo), tmp_path / f"{name}-work", ["sh", "-c", "test ! -e BROKEN"])
        resumed = Session.resume(where, builder=builder, executor=again)
        assert resumed.levels and resumed.rising and resumed.reference_end == N - 1
        result = resumed.run()
        assert result.exit_code == EXIT_FOUND and result.culprit == shas[CULPRIT], (name, result.message)
        assert not journaled & set(again.attempts), f"{name}: a journaled run was made again"
        steps = [r for r in _records(where) if r["type"] == "step"]
        old_end_runs = sum(len(s["trials"]) for s in steps if s["index"] == 0)
        assert old_end_runs >= len(journaled) and steps[-1]["verdict"]["figures"]["stopped"] == "levels search"
        write_reports(where)
        assert "posterior that this is the first fixed commit" in (where / "report.md").read_text()
