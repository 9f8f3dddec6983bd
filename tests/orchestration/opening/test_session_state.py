"""A session's state kept record by record (`orchestration/opening/state.py`) and the sentences of its end
(`orchestration/ending/end_messages.py`): the state applied one record at a time is the state of the whole
journal, for the records a real session journals; the sentences say what the user must know."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bisect_npu import api, search
from bisect_npu.journal import Journal
from bisect_npu.level import HeldUpstream, MergeScope
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.ending import end_messages
from bisect_npu.orchestration.opening.state import SessionState, accuracy_weight
from bisect_npu.records import StepRecord, StoredFrom, TrialRecord
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo


def trial(index: int, number: int, outcome: VerdictKind | None = None) -> TrialRecord:
    return TrialRecord(index=index, commit=f"c{index}", case_id="c", trial=number, outcome=outcome)


def step(index: int, kind: VerdictKind, *, trials: int = 1, stored: StoredFrom | None = None) -> StepRecord:
    return StepRecord(index=index, commit=f"c{index}", verdict=Verdict(kind=kind, reason=""),
                      trials=[trial(index, n) for n in range(trials)], stored=stored)


@pytest.mark.parametrize("noisy", [False, True])
def test_a_real_journal_applied_record_by_record_is_the_whole_journal(tmp_path: Path, noisy: bool) -> None:
    shas = make_linear_repo(tmp_path / "repo", 30, culprit=17)
    result = api.bisect(tmp_path / "repo", shas[0], shas[29], oracle=list(GOOD_CMD), session_dir=tmp_path / "s",
                        quiet=True, mode="noisy" if noisy else "exact", propose_fix=False)
    assert result.culprit == shas[17]
    with Journal.open(tmp_path / "s", read_only=True) as journal:
        entries = journal.entries
    whole = SessionState(noisy, False, entries)
    kept = SessionState(noisy, False)
    for entry in entries:
        kept.apply(entry)
    assert kept.evidence() == whole.evidence() and kept.steps() == whole.steps()
    assert [e.index for e in kept.steps()] == [e.index for e in entries if isinstance(e, StepRecord)]
    assert search.decide(search.SearchProblem(n=29, mode="noisy" if noisy else "exact"), kept.evidence()) \
        == search.decide(search.SearchProblem(n=29, mode="noisy" if noisy else "exact"), whole.evidence())
    assert kept.candidates_left(29) == 1


def test_exact_mode_counts_steps_and_noisy_mode_counts_trials_and_stored_tallies() -> None:
    records = [trial(3, 0, VerdictKind.BAD), trial(3, 1, VerdictKind.GOOD), step(3, VerdictKind.BAD, trials=2),
               step(5, VerdictKind.GOOD, trials=0, stored=StoredFrom(sessions=["s"], good=2, bad=0)),
               step(7, VerdictKind.SKIP, trials=0)]
    exact, noisy = SessionState(False, False, records), SessionState(True, False, records)
    assert (exact.evidence()[3].bad, exact.evidence()[3].good, exact.evidence()[5].good) == (1, 0, 1)
    assert (noisy.evidence()[3].bad, noisy.evidence()[3].good, noisy.evidence()[5].good) == (1, 1, 2)
    assert exact.evidence()[7].skipped and noisy.evidence()[7].skipped  # a skip without trials, either way
    flipped = SessionState(False, True, records)  # --find-fix: the symptom is the old (good) side
    assert flipped.evidence()[3].good == 1 and flipped.evidence()[5].bad == 1
    assert noisy.outcomes(3) == [VerdictKind.BAD, VerdictKind.GOOD]


def test_an_interrupted_step_s_trials_are_pending_until_its_step_and_numbers_keep_growing() -> None:
    state = SessionState(False, False, [trial(4, 0), trial(4, 1)])
    assert [t.trial for t in state.pending_trials(4)] == [0, 1] and state.next_trial(4) == 2
    state.apply(step(4, VerdictKind.GOOD, trials=2))
    assert state.pending_trials(4) == [] and state.next_trial(4) == 2 and state.next_trial(9) == 0


def test_a_fresh_verdict_that_contradicts_the_store_s_is_known_as_the_records_come() -> None:
    stored = StoredFrom(sessions=["earlier"])
    state = SessionState(False, False, [step(3, VerdictKind.BAD, trials=0, stored=stored),
                                        step(5, VerdictKind.SKIP, trials=0, stored=stored)])
    assert state.stored_at(3) and not state.stored_at(4) and state.judged() == {3, 5}
    assert state.stored_kinds() == {3: {"bad"}} and not state.store_disagreed()  # a skip is no verdict
    state.apply(step(3, VerdictKind.BAD))
    assert not state.store_disagreed()  # run fresh, the same verdict
    state.apply(step(3, VerdictKind.GOOD))
    assert state.store_disagreed() and state.fresh_kinds() == {3: {"bad", "good"}}
    assert state.evidence(without_stored=True)[3].good == 1 and 5 not in state.evidence(without_stored=True)


def test_an_accuracy_step_weighs_its_likelihood_ratio_or_what_its_verdict_at_the_confidence_said() -> None:
    weigh = accuracy_weight(0.99, 10, find_fix=False)
    measured = StepRecord(index=4, commit="c4", verdict=Verdict(kind=VerdictKind.BAD, reason="",
                                                                figures={"log_likelihood_ratio": 2.5}))
    assert weigh(measured).log_lr == 2.5 and accuracy_weight(0.99, 10, find_fix=True)(measured).log_lr == -2.5
    assert weigh(step(4, VerdictKind.GOOD)).log_lr == pytest.approx(-math.log(99))  # from the store: the kind alone
    assert weigh(step(0, VerdictKind.GOOD)).log_lr == 0.0 and weigh(step(10, VerdictKind.BAD)).log_lr == 0.0  # ends
    assert accuracy_weight(None, 10, find_fix=False)(step(4, VerdictKind.BAD)).log_lr == 0.0  # not accuracy


def test_an_accuracy_step_hands_the_search_its_node_terms_swapped_under_find_fix() -> None:
    nodes = {"good": [-3.0, -1.0, 0.0], "bad": [-2.0, -2.5, -4.0]}
    measured = StepRecord(index=4, commit="c4", verdict=Verdict(kind=VerdictKind.GOOD, reason="", figures={
        "log_likelihood_ratio": -1.5, "ends_error_nodes": nodes}))
    weight = accuracy_weight(0.99, 10, find_fix=False)(measured)
    assert (weight.good, weight.bad) == ((-3.0, -1.0, 0.0), (-2.0, -2.5, -4.0))
    fixed = accuracy_weight(0.99, 10, find_fix=True)(measured)
    assert (fixed.log_lr, fixed.good, fixed.bad) == (1.5, (-2.0, -2.5, -4.0), (-3.0, -1.0, 0.0))
    broken = StepRecord(index=4, commit="c4", verdict=Verdict(kind=VerdictKind.GOOD, reason="", figures={
        "log_likelihood_ratio": -1.5, "ends_error_nodes": {"good": [0.0], "bad": []}}))
    assert accuracy_weight(0.99, 10, find_fix=False)(broken).good == ()  # malformed: the ratio alone
    state = SessionState(False, False, [measured, measured], weigh=accuracy_weight(0.99, 10, find_fix=False))
    evidence = state.evidence()[4]
    assert evidence.shared_good == (-6.0, -2.0, 0.0) and evidence.shared_log_lr == -3.0


def test_the_sentences_name_the_culprit_the_range_and_the_end_that_misbehaved() -> None:
    scope = MergeScope(merges=["a" * 40, "b" * 40], bad="f" * 40)
    assert end_messages.found("commit", "c" * 40, "Fix it", find_fix=False, scope=None) == (
        "first bad commit: cccccccccccc Fix it")
    assert end_messages.found("release", "2.9.0", "pkg 2.9.0", find_fix=True, scope=None) == (
        "first fixed release: 2.9.0 pkg 2.9.0")
    assert end_messages.found("commit", "c" * 40, "t", find_fix=False, scope=scope).endswith(
        "(came in through merge aaaaaaaaaaaa -> bbbbbbbbbbbb)")
    assert "the merge itself" in end_messages.found("commit", "b" * 40, "t", find_fix=False, scope=scope)
    assert end_messages.narrowed("1" * 40, "2" * 40, 3, find_fix=True).startswith(
        "the fix is one of 3 commits in (111111111111, 222222222222]")
    judged = end_messages.ends_wrong("good", "v1", "v2", find_fix=False, untested=None, noisy=False, figures={},
                                     oracle="command", log=Path("/s/steps/x.log"))
    assert judged == ("precondition failed: the good end v1 was judged bad; check the command reproduces the problem "
                      "at v2 and not at v1, or pass --no-check-ends (its run's log: /s/steps/x.log)")
    # the bad end judged good: the problem is checked at it and not at the good end (not at itself)
    assert "reproduces the problem at v2 and not at v1, or" in end_messages.ends_wrong(
        "bad", "v1", "v2", find_fix=False, untested=None, noisy=False, figures={}, oracle="recipe", log=None)
    assert "could not be tested (no Dockerfile)" in end_messages.ends_wrong(
        "bad", "v1", "v2", find_fix=True, untested="no Dockerfile", noisy=False, figures={}, oracle="recipe", log=None)
    assert "never showed the symptom in 12 trials" in end_messages.ends_wrong(
        "bad", "v1", "v2", find_fix=False, untested=None, noisy=True, figures={"bad_end_trials": 12.0},
        oracle="recipe", log=None)
    held = HeldUpstream(repo="/up", commit="d" * 40, dependency="vllm", old_pin="v0.1", new_pin="v0.2")
    assert end_messages.ends_ran(held, 9, [(0, "skip", "import failed"), (4, "bad", ""), (9, "bad", "")]) == [
        "dddddddddddd with vllm v0.1: skip (import failed)", "dddddddddddd with vllm v0.2: bad"]
    found = end_messages.dependency_found(held, "e" * 40, "first bad commit: 123456789abc Drop it", fix=None,
                                       verified=set(), github=None, pr=None)
    assert found == ("eeeeeeeeeeee moved vllm v0.1 -> v0.2; first bad vllm commit: 123456789abc Drop it (bisected on "
                     "its parent dddddddddddd: eeeeeeeeeeee could not be judged good with vllm v0.1)")


def test_the_settings_sentences_name_the_trigger_and_the_side_that_misbehaved() -> None:
    from bisect_npu.recipe.settings import Difference

    keys = [Difference("engine.args.async_scheduling", True, False), Difference("cases[*].sampling.top_p", None, 0.9)]
    assert end_messages.settings_found("c" * 40, keys[:1], 3, 5) == (
        "trigger at cccccccccccc: engine.args.async_scheduling: true (good with false); 3 other difference(s) not "
        "needed (5 configuration(s) tried)")
    wrong = {which: end_messages.settings_ends_wrong(which, keys, "cccccccccccc (v1)", skipped=skipped, reference=None,
                                                     reference_label="", log_dir=Path("/s/configurations"))
             for which, skipped in (("good", False), ("bad", True))}
    assert wrong["good"].startswith("precondition failed: the good variant (engine.args.async_scheduling=false, "
                                    "cases[*].sampling.top_p=0.9) is also bad at cccccccccccc (v1)")
    assert "the bad recipe could not be run at cccccccccccc (v1); see its log under /s/configurations" in wrong["bad"]


def _measured_step(index: int, values: list[float] | None, kind: VerdictKind = VerdictKind.GOOD) -> StepRecord:
    figures = {} if values is None else {"throughput_samples": values}
    return StepRecord(index=index, commit=f"c{index}", verdict=Verdict(kind=kind, reason="", figures=figures),
                      trials=[trial(index, 0)])


@given(st.lists(st.tuples(st.integers(0, 6), st.floats(1.0, 2000.0), st.sampled_from(["run", "skip", "none"])),
                max_size=30), st.randoms(use_true_random=False))
def test_levels_state_holds_each_positions_runs_in_journal_order_whatever_the_order_of_positions(
        journaled: list[tuple[int, float, str]], shuffle: Any) -> None:
    """Levels mode (`measured=True`): every step's runs (figure `throughput_samples`) join its
    position's `Evidence.measured`, a skip or a step without the figure adds none; the steps of
    other positions interleaved in any other order give every position the same runs."""
    steps = [_measured_step(i, [v] if what == "run" else None, VerdictKind.SKIP if what == "skip" else
                            VerdictKind.GOOD) for i, v, what in journaled]
    expected: dict[int, tuple[float, ...]] = {}
    for i, v, what in journaled:
        expected[i] = expected.get(i, ()) + ((v,) if what == "run" else ())
    state = SessionState(False, False, steps, measured=True)
    assert {i: ev.measured for i, ev in state.evidence().items()} == expected
    # the same steps, positions interleaved otherwise (each position's own steps in their order)
    by_position: dict[int, list[StepRecord]] = {}
    for record in steps:
        by_position.setdefault(record.index, []).append(record)
    order = [i for i, records in by_position.items() for _ in records]
    shuffle.shuffle(order)
    reordered = [by_position[i].pop(0) for i in order]
    again = SessionState(False, False, reordered, measured=True)
    assert {i: ev.measured for i, ev in again.evidence().items()} == expected
    assert all(not ev.measured for ev in SessionState(False, False, steps).evidence().values())


def test_a_malformed_throughput_figure_is_no_run() -> None:
    bad = StepRecord(index=2, commit="c2", verdict=Verdict(kind=VerdictKind.GOOD, reason="", figures={
        "throughput_samples": [1.0, "fast"]}))
    state = SessionState(False, False, [bad, _measured_step(2, [3.5])], measured=True)
    assert state.evidence()[2].measured == (3.5,)
