"""How a throughput session searches, as its journal keeps it (`orchestration/opening/throughput_search.py`):
the header's search first; a journal from before the header kept it, from what it journaled; a
journal that ran nothing yet, the recipe's. Sessions on a real history: tests/orchestration/test_levels_session.py."""

from __future__ import annotations

from pathlib import Path

from bisect_npu.level import CommitsLevel
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.opening import throughput_search
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.records import CandidateRange, HeaderRecord, JournalRecord, StepRecord, TrialRecord
from bisect_npu.request import RunRequest
from tests.helpers.npu_throughput import perf_recipe


def _header(search: throughput_search.ThroughputSearch | None) -> HeaderRecord:
    ends = CandidateRange(kind="commits", good="a", bad="b", base="a", good_ref="a", bad_ref="b", candidates=["b"])
    return HeaderRecord(request=RunRequest.of(good="a", bad="b"), level=CommitsLevel(), range=ends,
                        throughput_search=search)


def _step(stopped: str | None, kind: VerdictKind = VerdictKind.GOOD) -> StepRecord:
    figures = {"stopped": stopped} if stopped else {}
    return StepRecord(index=0, commit="a", verdict=Verdict(kind=kind, reason="", figures=figures))


def test_the_header_wins_else_the_journal_else_the_recipe(tmp_path: Path) -> None:
    levels = load_recipe(perf_recipe(tmp_path / "levels.yaml"))
    per_step = load_recipe(perf_recipe(tmp_path / "per_step.yaml", "per_step"))
    levels_ran: list[JournalRecord] = [_step("levels search")]
    per_step_ran: list[JournalRecord] = [_step(None, VerdictKind.SKIP), _step("sure good")]
    trial_only: list[JournalRecord] = [TrialRecord(index=0, commit="a", case_id="perf", trial=0)]
    assert throughput_search.pinned(_header("per_step"), levels_ran, levels) == "per_step"
    assert throughput_search.pinned(_header(None), levels_ran, per_step) == "levels"
    assert throughput_search.pinned(_header(None), per_step_ran, levels) == "per_step"
    assert throughput_search.pinned(_header(None), trial_only, levels) == "per_step"
    assert throughput_search.pinned(_header(None), [_step(None, VerdictKind.SKIP)], levels) == "per_step"
    assert throughput_search.pinned(_header(None), [], levels) == "levels"
    assert throughput_search.pinned(_header(None), [], per_step) == "per_step"
    assert throughput_search.pinned(_header("levels"), levels_ran, None) is None  # no throughput oracle
