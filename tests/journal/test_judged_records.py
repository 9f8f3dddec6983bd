"""One record family for both searches: a judged commit (`step`), a judged configuration
(`configuration`) and a configuration at the reference commit (`reference`) are each the same
`JudgedRun` under their own keys, made in one place (`engine.judged_record`); written and read back
through their journals, the same judged run comes back from each. The journals earlier versions
wrote (tests/data/journals) still read and fold under the shared shape, field for field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_npu.journal import Journal
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration import engine
from bisect_npu.orchestration.opening.configuration_state import ConfigurationState
from bisect_npu.orchestration.opening.state import SessionState
from bisect_npu.records import (
    BuildInfo,
    EndRecord,
    JudgedRun,
    RetryRun,
    SearchEnd,
    StepRecord,
    StoredFrom,
    TrialRun,
    parse_record,
)
from bisect_npu.settings_journal import (
    SETTINGS_FILE,
    ConfigurationRecord,
    ReferenceRecord,
    SettingsEnd,
    SettingsJournal,
    read_settings,
)
from tests.helpers.paths import DATA

JOURNALS = DATA / "journals"
JUDGED_TYPES = {"step", "configuration", "reference"}
SHA = "c2c849e90b307099bec315c73809730189b0951a"

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)
figures = st.dictionaries(st.sampled_from(["z", "p", "flips"]), st.floats(allow_nan=False, allow_infinity=False),
                          max_size=2)
verdicts = st.builds(Verdict, kind=st.sampled_from(list(VerdictKind)), reason=text, figures=figures,
                     trials=st.integers(0, 64))
builds = st.none() | st.builds(BuildInfo, how=st.sampled_from(["built", "overlay", "reused", "stored", "failed"]),
                               key=st.none() | text, seconds=st.none() | seconds, error=st.none() | text,
                               run_env=st.dictionaries(st.sampled_from(["A", "B"]), text, max_size=2))
trial_runs = st.builds(TrialRun, case_id=st.sampled_from(["command", "greedy"]), trial=st.integers(0, 99),
                       observation=st.none() | text, seconds=seconds, log=text,
                       outcome=st.none() | st.sampled_from(list(VerdictKind)), reason=text)
retry_runs = st.builds(RetryRun, case_id=st.sampled_from(["", "greedy"]), trial=st.integers(0, 99),
                       attempt=st.integers(1, 5), kind=st.sampled_from(["engine_start", "network"]), cause=text,
                       seconds=seconds, stage=st.sampled_from(["run", "build"]))
stored = st.none() | st.builds(StoredFrom, sessions=st.lists(text, max_size=2), good=st.integers(0, 9),
                               bad=st.integers(0, 9))
judged_runs = st.builds(JudgedRun, verdict=verdicts, build=builds, trials=st.lists(trial_runs, max_size=3),
                        seconds=seconds, stored=stored, retries=st.lists(retry_runs, max_size=3),
                        host_failure=st.none() | text)


def _candidate(record: Any, keys: dict[str, object]) -> engine.Candidate[str, Any]:
    """A candidate with only its records' type and keys: what `judged_record` reads of it."""
    def unused(*_args: object) -> Any:
        raise AssertionError("judged_record runs nothing")

    return engine.Candidate(key="k", commit=SHA, build_key="", label="k", evaluation=unused, retried=(),
                            trial=unused, retry=unused, record=record, record_keys=keys)


def _written_and_read(record: Any) -> Any:
    """The record as its journal writes its line and reads it back."""
    line = json.loads(json.dumps(record.model_dump(), ensure_ascii=False, separators=(",", ":")))
    if isinstance(record, StepRecord):
        return parse_record(line)
    return SettingsJournal._parse_entry(line)


SPACES = [
    (StepRecord, {"index": 3, "commit": SHA, "title": "a commit", "told": {"cost": 1.5}}),
    (ConfigurationRecord, {"configuration": [0, 2], "digest": "d1", "settings": {"a": 1, "b": None},
                           "value_check": None}),
    (ReferenceRecord, {"configuration": [1], "digest": "d2", "commit": SHA}),
]


@settings(max_examples=60, deadline=None)
@given(judged=judged_runs)
def test_every_space_keeps_the_same_judged_run(judged: JudgedRun) -> None:
    """The same judgement, made into each space's record by the engine, written and read back: the
    shared fields come back equal to what was judged (and so to each other), the keys as given, the
    line's type the space's."""
    for record_type, keys in SPACES:
        made = engine.judged_record(_candidate(record_type, keys), judged)
        read = _written_and_read(made)
        assert type(read) is record_type
        assert read.judged_run() == judged
        assert {name: getattr(read, name) for name in keys} == keys
        assert json.loads(json.dumps(made.model_dump()))["type"] == record_type.model_fields["type"].default


def test_the_ends_share_their_shape() -> None:
    """Both ends are a `SearchEnd` under their own status: the same sentence, figures and end."""
    shared = {"message": "the good end is bad", "figures": {"z": 2.0}, "which": "good"}
    ends = [EndRecord(status="ends_wrong", **shared), SettingsEnd(status="ends_wrong", **shared)]
    for end in ends:
        read = _written_and_read_end(end)
        assert SearchEnd(**{name: getattr(read, name) for name in SearchEnd.model_fields}) == SearchEnd(**shared)


def _written_and_read_end(end: EndRecord | SettingsEnd) -> Any:
    line = json.loads(json.dumps(end.model_dump()))
    return parse_record(line) if isinstance(end, EndRecord) else SettingsJournal._parse_entry(line)


def _journal_dirs(name: str) -> list[Path]:
    return sorted(path.parent for path in JOURNALS.rglob(name))


def _holds(written: Any, read: Any, where: str) -> None:
    """`read` holds everything `written` does, value for value (a field added since reads as its default)."""
    if isinstance(written, dict):
        assert isinstance(read, dict), where
        for name, value in written.items():
            assert name in read, f"{where}.{name} dropped"
            _holds(value, read[name], f"{where}.{name}")
    elif isinstance(written, list):
        assert isinstance(read, list) and len(read) == len(written), where
        for at, (value, again) in enumerate(zip(written, read, strict=True)):
            _holds(value, again, f"{where}[{at}]")
    else:
        assert read == written, where


def _same_on_disk(raw: dict[str, Any], read: JudgedRun) -> None:
    """Every shared field the line holds reads back as written: no field renamed or dropped."""
    dumped = json.loads(json.dumps(read.judged_run().model_dump()))
    _holds({name: value for name, value in raw.items() if name in JudgedRun.model_fields}, dumped, raw["type"])


def test_earlier_commit_journals_read_and_fold_under_the_shared_shape() -> None:
    """0.1.x's and 0.2.x's commit journals: each step reads as written and the state folds them."""
    dirs = _journal_dirs("journal.jsonl")
    assert dirs
    steps = 0
    for session in dirs:
        journal = Journal.open(session, read_only=True)
        state = SessionState(noisy=journal.header.mode == "noisy", find_fix=False, entries=journal.entries)
        raws = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()[1:] if line]
        judged = [raw for raw in raws if raw.get("type") in JUDGED_TYPES]
        read = [entry for entry in journal.entries if isinstance(entry, StepRecord)]
        assert len(read) == len(judged)
        for raw, entry in zip(judged, read, strict=True):
            _same_on_disk(raw, entry)
        assert state.steps() == read
        assert set(state.evidence()) >= {step.index for step in read if step.verdict.kind != VerdictKind.SKIP}
        steps += len(read)
    assert steps > 0


def test_settings_journals_0_2_x_read_and_fold_under_the_shared_shape() -> None:
    """0.2.x's settings journals: each configuration and reference reads as written, the state folds them."""
    dirs = _journal_dirs(SETTINGS_FILE)
    assert dirs
    for session in dirs:
        opened = read_settings(session)
        assert opened is not None
        header, entries = opened
        state = ConfigurationState(noisy=header.mode == "noisy", entries=entries)
        raws = [json.loads(line) for line in (session / SETTINGS_FILE).read_text().splitlines()[1:] if line]
        judged = [raw for raw in raws if raw.get("type") in JUDGED_TYPES]
        read = [entry for entry in entries if isinstance(entry, ConfigurationRecord | ReferenceRecord)]
        assert judged and len(read) == len(judged)
        for raw, entry in zip(judged, read, strict=True):
            _same_on_disk(raw, entry)
        for entry in read:
            if isinstance(entry, ReferenceRecord):
                assert state.reference_record(entry.digest) is not None
