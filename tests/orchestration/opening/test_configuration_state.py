"""A settings search's state folded once from its journal (`orchestration/opening/configuration_state.py`),
as a commit session's is: applied one record at a time it is the state of the whole journal; the
host's record counts the failed attempts of trials that then finished, at the commit and at the
reference commit apart; a configuration the host left unjudged before this process is no evidence
(it runs again). And the host's failure estimate a reopened search retries with is the one its
journal gives, shared by every configuration's runs (search/retry_policy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.opening.configuration_state import ConfigurationState
from bisect_npu.orchestration.opening.state import SessionState
from bisect_npu.orchestration.settings_search import SettingsQuestion, settings_request
from bisect_npu.orchestration.settings_session import SettingsSearch
from bisect_npu.records import Record, RetryRecord, StepRecord, StoredFrom, TrialRecord
from bisect_npu.search import Evidence
from bisect_npu.search.retry_policy import HostRecord
from bisect_npu.settings_journal import (
    ConfigurationRecord,
    ConfigurationRetry,
    ConfigurationTrial,
    ReferenceRecord,
    ReferenceTrial,
    SettingsEntry,
    SettingsJournal,
)
from tests.helpers.gitrepo import make_one_commit_repo

RECIPE = "demo-async-penalty"
GOOD_SET = "engine.args.async_scheduling=false"


def trial(keys: list[int], number: int, outcome: VerdictKind | None = None, *, digest: str = "",
          reference: bool = False) -> ConfigurationTrial | ReferenceTrial:
    made = ReferenceTrial if reference else ConfigurationTrial
    return made(configuration=keys, digest=digest or f"d{keys}", case_id="c", trial=number, outcome=outcome)


def retry(keys: list[int], number: int, attempt: int, *, reference: bool = False) -> ConfigurationRetry:
    return ConfigurationRetry(configuration=keys, digest=f"d{keys}", reference=reference, case_id="c", trial=number,
                              attempt=attempt, kind="port_in_use", cause="a port was still taken")


def record(keys: list[int], kind: VerdictKind, *, host_failure: str | None = None,
           stored: StoredFrom | None = None, check: str | None = None) -> ConfigurationRecord:
    return ConfigurationRecord(configuration=keys, digest=f"d{keys}" + (check or ""), value_check=check,
                               verdict=Verdict(kind=kind, reason=""), host_failure=host_failure, stored=stored)


def test_the_host_record_counts_failed_attempts_of_finished_trials_at_each_commit_apart() -> None:
    entries: list[SettingsEntry] = [
        retry([0], 0, 1), retry([0], 0, 2), trial([0], 0),  # two failures, then the trial ran
        retry([1], 0, 1, reference=True), trial([1], 0, reference=True),  # at the reference commit
        retry([1], 0, 1),  # at the commit: not settled by the reference's trial
        retry([2], 0, 1), trial([2], 0, VerdictKind.SKIP),  # a trial given up: not the working host's record
    ]
    state = ConfigurationState(False, entries)
    assert state.host_record == HostRecord(failures=3, successes=2)
    assert [r.attempt for r in state.pending_retries("d[1]")] == [1]
    assert [r.attempt for r in state.pending_retries("d[1]", reference=True)] == [1]
    state.apply(ReferenceRecord(configuration=[1], digest="d[1]", commit="c", verdict=Verdict(kind="good", reason="")))
    assert state.pending_retries("d[1]", reference=True) == [] and len(state.pending_retries("d[1]")) == 1


def test_what_the_host_left_unjudged_before_this_process_is_no_evidence_and_runs_again() -> None:
    unjudged = record([0], VerdictKind.SKIP, host_failure="a port was still taken")
    opened = ConfigurationState(False, [record([0, 1], VerdictKind.BAD), unjudged])
    assert frozenset({0}) not in opened.evidence() and opened.evidence()[frozenset({0, 1})].bad == 1
    opened.apply(unjudged)  # this process's own: the answer stops on it (exit 5), it is not run again here
    assert opened.evidence()[frozenset({0})].skipped == 1
    assert [r.verdict.kind for r in opened.records(frozenset({0}))] == ["skip", "skip"]


def test_stored_verdicts_drop_out_once_one_was_contradicted_and_checks_stay_apart() -> None:
    state = ConfigurationState(True, [
        record([0], VerdictKind.GOOD, stored=StoredFrom(sessions=["s"], good=3, bad=0)),
        trial([1], 0, VerdictKind.BAD), trial([1], 1, VerdictKind.GOOD), record([1], VerdictKind.BAD),
        record([1], VerdictKind.GOOD, check="k=1"),
    ])
    assert state.evidence()[frozenset({0})] == Evidence(good=3)
    assert frozenset({0}) not in state.evidence(without_stored=True)
    assert state.evidence()[frozenset({1})] == Evidence(good=1, bad=1)  # noisy: the trials, not the record
    assert [r.value_check for r in state.value_records("k=1")] == ["k=1"] and state.records(frozenset({2})) == []
    assert state.next_trial("d[1]") == 2 and state.outcomes("d[1]") == [VerdictKind.BAD, VerdictKind.GOOD]
    assert state.tried() == 3 and state.stored_at("d[0]") and not state.stored_at("d[1]")


entry_lists = st.lists(st.one_of(
    st.builds(lambda k, n, o, r: trial([k], n, o, reference=r), st.integers(0, 2), st.integers(0, 3),
              st.sampled_from([None, VerdictKind.GOOD, VerdictKind.BAD, VerdictKind.SKIP]), st.booleans()),
    st.builds(lambda k, n, a, r: retry([k], n, a, reference=r), st.integers(0, 2), st.integers(0, 3),
              st.integers(1, 3), st.booleans()),
    st.builds(lambda k, v, h: record([k], v, host_failure=h), st.integers(0, 2),
              st.sampled_from(list(VerdictKind)), st.sampled_from([None, "busy"]))), max_size=30)


@given(entry_lists, st.booleans())
def test_applied_record_by_record_after_opening_the_state_reads_as_opened_with_them(
        entries: list[SettingsEntry], noisy: bool) -> None:
    """Folded at opening or applied one by one, the same records give the same reading, but for the
    host's leftovers that only an earlier process's records make stale."""
    whole = ConfigurationState(noisy, entries)
    kept = ConfigurationState(noisy)
    for entry in entries:
        kept.apply(entry)
    assert kept.host_record == whole.host_record
    for digest in ("d[0]", "d[1]", "d[2]"):
        for reference in (False, True):
            assert kept.pending_trials(digest, reference=reference) == whole.pending_trials(digest,
                                                                                           reference=reference)
            assert kept.pending_retries(digest, reference=reference) == whole.pending_retries(digest,
                                                                                             reference=reference)
        assert kept.next_trial(digest) == whole.next_trial(digest)
    fresh = {k for k in kept.evidence() if not any(r.host_failure for r in whole.records(k))}
    assert {k: kept.evidence()[k] for k in fresh} == {k: whole.evidence()[k] for k in fresh}


attempt_lists = st.lists(st.tuples(st.booleans(), st.integers(0, 3),
                                    st.sampled_from([None, VerdictKind.GOOD, VerdictKind.BAD, VerdictKind.SKIP])),
                          max_size=20)


@given(attempt_lists)
def test_both_searches_keep_the_same_attempts_and_host_record_of_the_same_runs(
        attempts: list[tuple[bool, int, VerdictKind | None]]) -> None:
    """One candidate's trials and failed attempts, journaled by the commit search at a position and by
    the settings search for a configuration: the same host record, pending work and trial numbers."""
    commit: list[TrialRecord | RetryRecord] = []
    settings: list[SettingsEntry] = []
    for failed, number, outcome in attempts:
        if failed:
            commit.append(RetryRecord(index=1, commit="c", case_id="c", trial=number, attempt=1, kind="port_in_use",
                                      cause="a port was still taken"))
            settings.append(retry([0], number, 1))
        else:
            commit.append(TrialRecord(index=1, commit="c", case_id="c", trial=number, outcome=outcome))
            settings.append(trial([0], number, outcome))
    positions, configurations = SessionState(False, False, commit), ConfigurationState(False, settings)
    assert positions.host_record == configurations.host_record
    assert positions.pending_trials(1) == configurations.pending_trials("d[0]")
    assert positions.pending_retries(1) == configurations.pending_retries("d[0]")
    assert positions.next_trial(1) == configurations.next_trial("d[0]")


@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.integers(0, 2), st.booleans())
def test_both_searches_number_an_unjudged_ends_attempts_on_from_its_given_up_records(
        budgets: list[int], interrupted: int, noisy: bool) -> None:
    """An end the host left unjudged once per entry of `budgets` (after that many failed attempts at
    its trial 0, journaled with its host failure), then `interrupted` more attempts before an
    interrupt: reopened, neither search reads a given-up record as evidence, both number the end's
    attempts on from the given-up ones, on the same trial, and go on with the interrupted ones' budget."""
    commit: list[Record] = []
    settings: list[SettingsEntry] = []
    attempt = 0

    def failed() -> None:
        nonlocal attempt
        attempt += 1
        commit.append(RetryRecord(index=0, commit="c", case_id="c", trial=0, attempt=attempt, kind="port_in_use",
                                  cause="a port was still taken"))
        settings.append(retry([], 0, attempt))

    for spent in budgets:
        for _ in range(spent):
            failed()
        why = "a port was still taken"
        skip = Verdict(kind=VerdictKind.SKIP, reason=why)
        commit += [TrialRecord(index=0, commit="c", case_id="c", trial=0, outcome=VerdictKind.SKIP),
                   StepRecord(index=0, commit="c", verdict=skip, host_failure=why)]
        settings += [trial([], 0, VerdictKind.SKIP), record([], VerdictKind.SKIP, host_failure=why)]
    given_up = list(range(1, attempt + 1))
    for _ in range(interrupted):
        failed()
    positions = SessionState(noisy, False, commit, ends=(0, 5))
    configurations = ConfigurationState(noisy, settings)
    assert [r.attempt for r in positions.given_up(0)] == [r.attempt for r in configurations.given_up("d[]")] == given_up
    assert [r.attempt for r in positions.pending_retries(0)] == [r.attempt for r in configurations.pending_retries(
        "d[]")] == list(range(given_up[-1] + 1, attempt + 1))
    assert positions.next_trial(0) == configurations.next_trial("d[]") == 0
    assert positions.evidence() == {} and configurations.evidence() == {}
    assert positions.steps() == [] and positions.judged() == set()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_one_commit_repo(tmp_path / "repo")


def open_search(repo: Path, session: Path) -> SettingsSearch:
    question, request = settings_request(SettingsQuestion(ref="v1", good_set=[GOOD_SET]),
                                         {"repo": str(repo), "recipe": RECIPE, "verdict_store": None})
    return SettingsSearch.start(question, request, session)


def test_a_reopened_search_retries_with_the_host_estimate_its_journal_gives(repo: Path, tmp_path: Path) -> None:
    session = tmp_path / "session"
    open_search(repo, session).close()
    with SettingsJournal.open(session) as journal:  # what a killed process left: four failures, two trials run
        for entry in (retry([0], 0, 1), retry([0], 0, 2), trial([0], 0), retry([], 0, 1), retry([], 0, 2),
                      trial([], 0)):
            journal.append(entry)
    search = open_search(repo, session)
    try:
        assert search.base.retry.host.record == HostRecord(failures=4, successes=2)
        recipe = search.space.recipe_of(frozenset({0}))
        evaluator = search.space._evaluator(Path("configurations") / recipe.digest(), recipe)
        assert evaluator.retry.host is search.base.retry.host  # one record of the host for every configuration
        assert evaluator.retry.allowed() == search.base.retry.allowed() > 2  # the rate (4 of 6) asks for more
    finally:
        search.close()
