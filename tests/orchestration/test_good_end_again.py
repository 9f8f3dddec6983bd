"""An accuracy session whose bad end asks for the good end's next round (the drop unclear, the
good end's mean the looser): the session runs a step at the good end, pooled onto its rounds,
then judges the bad end again; killed after that extra step and resumed, it redoes no run and
answers the same. A real git history and worktrees, the real Evaluator, journal and report; the
NPU host's harness run is stood in for at the executor."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.observations import SampleOutcome
from bisect_npu.orchestration.ending.result import EXIT_FOUND
from bisect_npu.report import write_reports
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.npu_accuracy import HarnessStandIn, accuracy_session, journal_records

pytestmark = pytest.mark.e2e  # sessions, end to end

N, CULPRIT = 6, 4  # commits: the good end 0, candidates 1..5
IDS = [f"q{i:03d}" for i in range(100)]


def rates_stand_in(shas: list[str]) -> HarnessStandIn:
    """The NPU host's harness over a round's samples: before the culprit every sample right half
    the time (two of four runs: the good side's mean known to 2.5 points a round), from it on 45
    of 100 samples always right (the bad side's known exactly), so after the bad end's rounds the
    drop is unclear and the good end's error dominates."""
    def outcome(env: Environment, sample_id: str) -> SampleOutcome:
        bad = shas.index(env.commit) >= CULPRIT
        return SampleOutcome(id=sample_id, correct=float(IDS.index(sample_id) < 45) if bad else 0.5, runs=4)
    return HarnessStandIn(outcome, IDS)


def _session(tmp: Path, name: str, shas: list[str], stand_in: HarnessStandIn, resume: bool = False) -> Any:
    return accuracy_session(tmp, name, shas, stand_in, {"repeats": 4}, resume)


@dataclass(frozen=True)
class Whole:
    """The uninterrupted session: where it ran, its history, its answer and its runs."""

    tmp: Path
    shas: list[str]
    culprit: str | None
    runs: list[tuple[str, int]]


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Whole:
    tmp = tmp_path_factory.mktemp("again")
    shas = make_linear_repo(tmp / "repo", N, culprit=CULPRIT)
    (tmp / "d.jsonl").write_text("".join(json.dumps({"id": i, "question": "q", "answer": "a"}) + "\n" for i in IDS))
    stand_in = rates_stand_in(shas)
    result = _session(tmp, "s", shas, stand_in)
    assert result.exit_code == EXIT_FOUND
    return Whole(tmp, shas, result.culprit, stand_in.runs)


def test_the_bad_end_has_the_good_end_run_again_and_the_report_says_why(whole: Whole) -> None:
    assert whole.culprit == whole.shas[CULPRIT]
    steps = [r for r in journal_records(whole.tmp / "s") if r["type"] == "step"]
    good_steps = [s for s in steps if s["index"] == 0]
    bad_steps = [s for s in steps if s["index"] == N - 1]
    # the good end: its first step, then two more of one round each, asked by the bad end's step
    # (journaled before the bad end's step, whose rounds were judged again against them)
    assert [len(s["trials"]) for s in good_steps] == [1, 1, 1]
    assert [s["verdict"]["figures"]["rounds"] for s in good_steps] == [1, 2, 3]
    assert all(s["verdict"]["reason"].startswith("run again, round") for s in good_steps[1:])
    assert len(bad_steps) == 1 and steps.index(bad_steps[0]) > steps.index(good_steps[-1])
    good_trials = [t["trial"] for s in good_steps for t in s["trials"]]
    assert good_trials == sorted(set(good_trials))  # a seed each
    write_reports(whole.tmp / "s")
    assert "run again, round 2 of at most 3" in (whole.tmp / "s" / "report.md").read_text()


@pytest.mark.parametrize("step_journaled", [True, False])
def test_a_session_resumed_after_the_good_ends_extra_round_redoes_nothing(whole: Whole, step_journaled: bool) -> None:
    """Killed after the good end's first extra step (`step_journaled`), or after its round but
    before its step: resumed, the bad end's journaled round is judged against the good end's
    rounds as they stand and asks for what the uninterrupted session asked next."""
    lines = (whole.tmp / "s" / "journal.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    cut = [at for at, r in enumerate(records) if r["type"] == "step" and r["index"] == 0][1]
    cut += 1 if step_journaled else 0
    assert records[cut - 1]["type"] == ("step" if step_journaled else "trial")
    name = f"cut-{step_journaled}"
    shutil.copytree(whole.tmp / "s", whole.tmp / name)
    (whole.tmp / name / "journal.jsonl").write_text("\n".join(lines[:cut]) + "\n")
    for report in ("report.md", "report.json"):
        (whole.tmp / name / report).unlink(missing_ok=True)
    journaled = {(r["commit"], r["trial"]) for r in records[:cut] if r["type"] == "trial"}
    assert any(commit == whole.shas[-1] for commit, _ in journaled)  # the bad end's first round

    resumed = rates_stand_in(whole.shas)
    again = _session(whole.tmp, name, whole.shas, resumed, resume=True)
    assert again.culprit == whole.culprit
    assert not journaled & set(resumed.runs), "a journaled run was made again"
    assert len(resumed.runs) + len(journaled) == len(whole.runs)
    assert [(r["index"], len(r["trials"])) for r in journal_records(whole.tmp / name) if r["type"] == "step"] == \
        [(r["index"], len(r["trials"])) for r in records if r["type"] == "step"]
