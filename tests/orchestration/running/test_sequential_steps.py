"""The candidate runner stops a throughput step when its verdict is sure (oracle/sequential.py):
a resumed step whose journaled trials already settle it is judged from them and builds nothing;
one they leave open goes on to run more. Real git repository, real worktree builds, real files."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import git
import pytest

from bisect_npu.builders.local import LocalBuilder
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.nightly.cases import import_case, read_case_file
from bisect_npu.observations import Observation, VerdictKind
from bisect_npu.oracle.sequential import REFERENCE_MIN_TRIALS
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator, until_sure
from bisect_npu.records import TrialRun
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.npu_throughput import CASE_PATH
from tests.helpers.npu_throughput import PERF_CASE as CASE_FILE


def _journaled(session: Path, commit: str, values: list[float]) -> list[TrialRun]:
    """Trials a session journaled before it was interrupted: their observation files and records."""
    records = []
    for trial, value in enumerate(values):
        path = session / "steps" / commit[:12] / f"obs-perf-t{trial}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Observation(case_id="perf", trial=trial,
                                    extra={"output_token_throughput": value}).model_dump_json())
        records.append(TrialRun(case_id="perf", trial=trial, observation=str(path.relative_to(session))))
    return records


def test_a_settled_step_is_judged_from_its_journal_and_an_open_one_runs_on(tmp_path: Path) -> None:
    perf = import_case(read_case_file(CASE_FILE, CASE_PATH), CASE_PATH, "speed-a2", "perf")
    assert until_sure(perf) and perf.trials.count == 5
    shas = make_linear_repo(tmp_path / "repo", 3, culprit=2)
    failing_build = [sys.executable, "-c", "raise SystemExit(1)"]  # a build here would be a skip
    builder = LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work", failing_build)
    session = tmp_path / "session"
    evaluator = Evaluator(builder, LocalExecutor(), session, recipe=perf)
    try:
        good_end = _journaled(session, shas[0], [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1002.0, 998.0, 1000.0])
        assert len(good_end) >= REFERENCE_MIN_TRIALS
        reference = evaluator.evaluate(EvaluationRequest(shas[0], 20, done=good_end, as_reference=True))
        assert reference.build.how == "journaled" and reference.verdict.figures["stopped"] == "reference known"
        assert reference.verdict.kind == VerdictKind.GOOD
        assert "the good end: 1000.0 tokens/s" in reference.verdict.reason

        settled = evaluator.evaluate(EvaluationRequest(shas[2], 5, done=_journaled(session, shas[2], [880.0])))
        assert settled.build.how == "journaled" and settled.verdict.kind == VerdictKind.BAD
        assert settled.verdict.figures["stopped"] == "sure bad" and settled.verdict.figures["trials_run"] == 1
        assert settled.verdict.reason.endswith("sure bad after 1 trial(s)")

        near_the_line = evaluator.evaluate(EvaluationRequest(shas[1], 5, done=_journaled(session, shas[1], [980.0])))
        assert near_the_line.build.how == "failed"  # it went on to build the commit for another trial
        assert near_the_line.verdict.kind == VerdictKind.SKIP
    finally:
        evaluator.close()


def test_a_resumed_evaluator_pools_the_spread_its_journaled_steps_gave(tmp_path: Path) -> None:
    """Every finished step's runs join the spread later steps pool; a resumed session hands its
    journaled steps' runs to a new evaluator (`remember_runs`, as a reopened session does), which
    then pools the same spread and judges the next step as the interrupted one would have."""
    perf = import_case(read_case_file(CASE_FILE, CASE_PATH), CASE_PATH, "speed-a2", "perf")
    shas = make_linear_repo(tmp_path / "repo", 4, culprit=3)
    failing_build = [sys.executable, "-c", "raise SystemExit(1)"]
    session = tmp_path / "session"
    steps = [(shas[0], [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1002.0, 998.0, 1000.0], True),
             (shas[3], [930.0, 925.0], False), (shas[1], [1004.0, 992.0, 999.0], False)]
    journaled = [(sha, _journaled(session, sha, values), as_reference) for sha, values, as_reference in steps]

    def evaluator() -> Evaluator:
        builder = LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / f"work-{id(object())}", failing_build)
        return Evaluator(builder, LocalExecutor(), session, recipe=perf)

    first, resumed = evaluator(), evaluator()
    try:
        for sha, records, as_reference in journaled:
            first.evaluate(EvaluationRequest(sha, 20 if as_reference else 5, done=records, as_reference=as_reference,
                                             as_bad_end=sha == shas[3]))
        assert first.pooled().df == 7 + 1 + 2
        resumed.set_reference(journaled[0][1])
        resumed.bad_end_runs = first.bad_end_runs
        for sha, records, _ in journaled:
            resumed.remember_runs(sha, records)
        assert resumed.pooled() == first.pooled()
        nxt = _journaled(session, shas[2], [968.0])
        verdicts = [e.evaluate(EvaluationRequest(shas[2], 1, done=nxt)).verdict for e in (first, resumed)]
        assert verdicts[0].figures["log_likelihood_ratio"] == verdicts[1].figures["log_likelihood_ratio"]
        # Pooled over the session, the ratio is not the one the ends' runs alone give.
        alone = evaluator()
        alone.set_reference(journaled[0][1])
        alone.bad_end_runs = first.bad_end_runs
        lone = alone.evaluate(EvaluationRequest(shas[2], 1, done=nxt)).verdict
        alone.close()
        assert lone.figures["log_likelihood_ratio"] != verdicts[0].figures["log_likelihood_ratio"]
    finally:
        first.close()
        resumed.close()


def test_a_finished_step_remembers_the_runs_it_loaded_without_reading_them_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs a finished throughput step judged join the pooled spread as loaded: judging the
    step reads each observation file once more than remembering them from the loaded ones takes
    (the trials-wanted check, then the verdict); `remember_runs` given no loaded ones reads them."""
    perf = import_case(read_case_file(CASE_FILE, CASE_PATH), CASE_PATH, "speed-a2", "perf")
    shas = make_linear_repo(tmp_path / "repo", 3, culprit=2)
    failing_build = [sys.executable, "-c", "raise SystemExit(1)"]
    session = tmp_path / "session"
    evaluator = Evaluator(LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work", failing_build),
                          LocalExecutor(), session, recipe=perf)
    loads: Counter[str] = Counter()
    real_load = Observation.load

    def counted(path: Path) -> Observation:
        loads[Path(path).name] += 1
        return real_load(path)

    try:
        good_end = _journaled(session, shas[0], [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1002.0, 998.0, 1000.0])
        evaluator.evaluate(EvaluationRequest(shas[0], 20, done=good_end, as_reference=True))
        monkeypatch.setattr(Observation, "load", staticmethod(counted))
        bad = _journaled(session, shas[2], [880.0, 884.0])
        settled = evaluator.evaluate(EvaluationRequest(shas[2], 5, done=bad, as_bad_end=True))
        assert settled.verdict.figures["stopped"] == "sure bad"
        assert loads == Counter({"obs-perf-t0.json": 2, "obs-perf-t1.json": 2})
        assert sorted(evaluator.session_runs[shas[2]].values()) == [880.0, 884.0]
        loads.clear()
        fresh = Evaluator(LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work2", failing_build),
                          LocalExecutor(), session, recipe=perf)
        fresh.remember_runs(shas[2], bad)
        fresh.close()
        assert loads == Counter({"obs-perf-t0.json": 1, "obs-perf-t1.json": 1})
        assert fresh.session_runs == {shas[2]: {r.observation: v for r, v in zip(bad, (880.0, 884.0), strict=True)}}
    finally:
        evaluator.close()
