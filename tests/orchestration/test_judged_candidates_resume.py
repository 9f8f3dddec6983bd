"""An accuracy session whose candidates' side rates are conditioned on the candidates already judged
(oracle/accuracy/judged.py): killed after some steps, or in the middle of a candidate's step, and
resumed from its journal, it judges every later step as the uninterrupted session did. A real git
history and worktrees, the real Evaluator and journal; the NPU host's harness run is stood in for
at the executor, each sample's runs drawn from its rate at the commit's side with a seed of the
commit, the trial and the sample (a round's trial is its seed)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.observations import SampleOutcome
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.npu_accuracy import HarnessStandIn, accuracy_session, journal_records

pytestmark = pytest.mark.e2e  # sessions, end to end

N, CULPRIT, RUNS = 10, 6, 4  # commits: the good end 0, candidates 1..9
IDS = [f"q{i:02d}" for i in range(30)]
_RATES = np.random.default_rng(7).beta(1.6, 0.4, len(IDS))  # good-side rates, mean 0.8, correlation 0.5
BROKEN = set(range(0, len(IDS), 4))  # a twentieth of their rate from the culprit on


def sampled_stand_in(shas: list[str]) -> HarnessStandIn:
    """Each sample's `RUNS` runs at the commit's side, seeded by (commit, trial, sample)."""
    trial_of: dict[str, int] = {}

    def outcome(env: Environment, sample_id: str) -> SampleOutcome:
        index, n = shas.index(env.commit), IDS.index(sample_id)
        rate = _RATES[n] * (0.05 if index >= CULPRIT and n in BROKEN else 1.0)
        seed = (index * 1_000 + trial_of[env.commit]) * 100 + n
        return SampleOutcome(id=sample_id, correct=np.random.default_rng(seed).binomial(RUNS, rate) / RUNS, runs=RUNS)

    class Seeded(HarnessStandIn):
        def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> Any:
            trial_of[env.commit] = int(request["trial"])
            return super().run_probe(env, request, out_dir, timeout_s)

    return Seeded(outcome, IDS)


def _session(tmp: Path, name: str, shas: list[str], stand_in: HarnessStandIn, resume: bool = False) -> Any:
    return accuracy_session(tmp, name, shas, stand_in, {"repeats": RUNS, "focus": {"batch": 2}}, resume)


def _steps(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each step's position, verdict, ratio, judged runs and trials."""
    return [(r["index"], r["verdict"]["kind"], r["verdict"]["figures"].get("log_likelihood_ratio"),
             r["verdict"]["figures"].get("judged_runs"), [t["trial"] for t in r["trials"]])
            for r in records if r["type"] == "step"]


@dataclass(frozen=True)
class Whole:
    tmp: Path
    shas: list[str]
    culprit: str | None
    records: list[dict[str, Any]]


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Whole:
    tmp = tmp_path_factory.mktemp("judged")
    shas = make_linear_repo(tmp / "repo", N, culprit=CULPRIT)
    (tmp / "d.jsonl").write_text("".join(json.dumps({"id": i, "question": "q", "answer": "a"}) + "\n" for i in IDS))
    result = _session(tmp, "s", shas, sampled_stand_in(shas))
    return Whole(tmp, shas, result.culprit, journal_records(tmp / "s"))


def test_later_candidates_are_judged_with_the_earlier_ones_runs(whole: Whole) -> None:
    candidates = [s for s in _steps(whole.records) if s[0] not in (0, N - 1)]
    assert len(candidates) >= 3
    assert candidates[0][3] is None  # the first has none judged before it
    assert any(judged is not None and judged["good"] + judged["bad"] > 0 for *_, judged, _ in candidates)


@pytest.mark.parametrize("mid_step", [False, True])
def test_a_session_resumed_from_its_journal_judges_as_the_uninterrupted_one(whole: Whole, mid_step: bool) -> None:
    """Cut after the third candidate's step (`mid_step`: after its first round, before its
    step): resumed, every step is judged as before, at the same trials, to the same answer."""
    lines = (whole.tmp / "s" / "journal.jsonl").read_text().splitlines()
    steps = [at for at, r in enumerate(whole.records)
             if r["type"] == "step" and r["index"] not in (0, N - 1)]
    cut = steps[2] + 1
    if mid_step:
        cut = next(at for at in range(steps[1] + 1, steps[2]) if whole.records[at]["type"] == "trial") + 1
    name = f"cut-{mid_step}"
    shutil.copytree(whole.tmp / "s", whole.tmp / name)
    (whole.tmp / name / "journal.jsonl").write_text("\n".join(lines[:cut]) + "\n")
    for report in ("report.md", "report.json"):
        (whole.tmp / name / report).unlink(missing_ok=True)
    again = _session(whole.tmp, name, whole.shas, sampled_stand_in(whole.shas), resume=True)
    assert again.culprit == whole.culprit
    assert _steps(journal_records(whole.tmp / name)) == _steps(whole.records)
