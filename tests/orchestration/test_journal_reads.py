"""A session's journal is read once, into its state (`opening/state.py` for a commit session,
`opening/configuration_state.py` for a settings search), and kept by folding each record appended:
no module of the orchestration reads a journal's records (`entries`, `records(...)`) or opens a
journal anywhere else than the places named here, each with why, and only the space's `append`,
which folds the record in, appends to one. The seconds the costs are measured by, folded record
by record, are the journal's."""

from __future__ import annotations

import ast

from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.opening.state import MeasuredSeconds
from bisect_npu.records import COMMAND_CASE, BuildInfo, StepRecord, TrialRecord, trial_seconds
from tests.helpers.paths import REPO_ROOT

ORCHESTRATION = REPO_ROOT / "bisect_npu" / "orchestration"

# (module, function) -> why it reads a journal there.
ALLOWED = {
    ("opening/session_opening.py", "open_session"): "the one opening of a session's journal",
    ("session.py", "Session.__init__"): "the commit session's journal folded into its state",
    ("configurations.py", "Configurations.__init__"): "the settings search's journal folded into its state",
    ("opening/open_session.py", "check_same_request"): "a request given again: the header of the session it names",
    ("settings_search.py", "settings_request"): "--after: another, finished session's header and answer",
}

# Where a record is journaled: each space's one `append`, which folds it into the state as well.
APPENDS = {("session.py", "Session.append"), ("configurations.py", "Configurations.append")}


def _is_journal(node: ast.expr) -> bool:
    """`journal`, `self.journal`, `opening.journal`, or the class `Journal`/`SettingsJournal`."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith("journal")


def journal_uses(source: str, attributes: tuple[str, ...] = ("entries", "records", "open")) -> list[tuple[str, int]]:
    """Where a module uses these attributes of a journal (by default: reads its records or opens
    one): (the enclosing function, line)."""
    reads: list[tuple[str, int]] = []

    def visit(node: ast.AST, where: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*where, child.name])
                continue
            if isinstance(child, ast.Attribute) and _is_journal(child.value) and child.attr in attributes:
                reads.append((".".join(where), child.lineno))
            visit(child, where)

    visit(ast.parse(source), [])
    return reads


def test_no_module_of_the_orchestration_reads_a_journal_outside_the_fold() -> None:
    found = {(path.relative_to(ORCHESTRATION).as_posix(), where): line
             for path in sorted(ORCHESTRATION.rglob("*.py"))
             for where, line in journal_uses(path.read_text())}
    outside = {f"{module}:{line} ({where})" for (module, where), line in found.items()
               if (module, where) not in ALLOWED}
    assert not outside, "journal records read outside the state fold: " + ", ".join(sorted(outside))
    assert set(ALLOWED) <= set(found)  # each allowance still names a read (none left stale)


def test_only_the_append_that_folds_a_record_in_journals_one() -> None:
    appends = {(path.relative_to(ORCHESTRATION).as_posix(), where) for path in sorted(ORCHESTRATION.rglob("*.py"))
               for where, _ in journal_uses(path.read_text(), ("append",))}
    assert appends == APPENDS


def test_the_check_sees_a_read_of_records_entries_or_an_open() -> None:
    source = """
class Level:
    def descent(self, session):
        return session.journal.records(EndRecord)

def ended(journal):
    return [e for e in journal.entries]

def child(path):
    return Journal.open(path, read_only=True)

def fine(session):
    return session.state.records(frozenset()), session.journal.header
"""
    assert journal_uses(source) == [("Level.descent", 4), ("ended", 7), ("child", 10)]


def _trial(index: int, seconds: float, startup: float = 0.0, outcome: VerdictKind = VerdictKind.GOOD) -> TrialRecord:
    return TrialRecord(index=index, commit=f"c{index}", case_id=COMMAND_CASE, trial=0, outcome=outcome,
                       seconds=seconds, startup_s=startup)


def _step(index: int, how: str | None = None, build_s: float = 0.0) -> StepRecord:
    return StepRecord(index=index, commit=f"c{index}", verdict=Verdict(kind=VerdictKind.GOOD, reason=""),
                      build=BuildInfo(how=how, seconds=build_s) if how else None)


def test_the_seconds_folded_record_by_record_are_the_journal_s() -> None:
    """Interleaved positions: a step's probe seconds are its position's trials since its last
    step (a skipped command trial did not run), builds and overlays kept apart."""
    records = [_trial(3, 10.0, startup=4.0), _trial(5, 7.0), _trial(3, 6.0), _step(3, "built", 90.0),
               _trial(5, 2.0, outcome=VerdictKind.SKIP), _step(5, "overlay", 12.0), _step(8, "built", 80.0),
               _trial(3, 5.0), _step(3)]
    seconds = MeasuredSeconds()
    for record in records:
        seconds.apply(record)
    assert (seconds.startups, seconds.trial_runs) == trial_seconds(records)
    assert seconds.step_runs == [16.0, 7.0, 5.0]
    assert seconds.builds == {"built": [90.0, 80.0], "overlay": [12.0]}
    copy = seconds.copy()
    seconds.apply(_trial(9, 1.0))
    seconds.apply(_step(9))
    assert copy.step_runs == [16.0, 7.0, 5.0]  # what the state hands out does not move under it
