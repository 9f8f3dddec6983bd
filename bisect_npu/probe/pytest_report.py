"""A pytest plugin (loaded with `-p bisect_npu.probe.pytest_report`) for `run --unit-test`: keeps
only the items the named node ids select, and writes what happened to each as JSON.

Runs inside the candidate's venv: stdlib and pytest only. The files are passed to pytest whole
and narrowed here (not as `file::test` arguments), so a named test the commit does not have yet is
"matched nothing", not pytest's usage error, and the runner can judge it.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from collections.abc import Generator
from typing import Any

import pytest

from .unit_tests import CONFTEST_KEY, selects

REPORT_ENV = "BISECT_NPU_UT_REPORT"  # where the JSON goes
SELECT_ENV = "BISECT_NPU_UT_SELECT"  # the node ids, as a JSON list

_state: dict[str, Any] = {"tests": {}, "collect_errors": {}, "collect_frames": {}, "matched": {}, "exit": None}
# A frame of pytest's short traceback: "path/to/file.py:12: in <module>".
_FRAME = re.compile(r"^(\S.*?\.py):\d+: in ")


def _wanted() -> list[str]:
    return list(json.loads(os.environ.get(SELECT_ENV, "[]")))


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests() -> Generator[None, Any, None]:
    """A conftest that cannot be imported stops pytest before it collects anything (exit 4, no
    session): kept as the collection error of `CONFTEST_KEY`, with its traceback's files from the
    conftest on, and the report written now."""
    outcome = yield
    if outcome.excinfo is None:
        return
    error = outcome.excinfo[1]
    cause = getattr(error, "cause", None) or error.__cause__ or error
    frames = [frame.filename for frame in traceback.extract_tb(cause.__traceback__)]
    conftest = str(getattr(error, "path", ""))
    start = next((i for i, frame in enumerate(frames) if frame == conftest), 0)
    _state["collect_errors"][CONFTEST_KEY] = f"{type(cause).__name__}: {cause}"[:300]
    _state["collect_frames"][CONFTEST_KEY] = frames[start:]
    _state["conftest"] = os.path.relpath(conftest) if conftest else ""
    _write()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = _wanted()
    matched = {node_id: 0 for node_id in wanted}
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        hits = [node_id for node_id in wanted if selects(node_id, item.nodeid)]
        for node_id in hits:
            matched[node_id] += 1
        (kept if hits else dropped).append(item)
    _state["matched"] = matched
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _state["collect_errors"][report.nodeid or "<session>"] = _short(report)
        _state["collect_frames"][report.nodeid or "<session>"] = _frames(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tests = _state["tests"]
    if report.when == "call" or report.failed or (report.when == "setup" and report.skipped):
        outcome = "error" if report.failed and report.when != "call" else report.outcome
        if tests.get(report.nodeid) in ("failed", "error"):
            return  # a teardown error after a failure: the failure stands
        tests[report.nodeid] = outcome
        if report.failed or report.skipped:
            _state.setdefault("messages", {})[report.nodeid] = _short(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _state["exit"] = int(exitstatus)
    _write()


def _write() -> None:
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(_state, handle, indent=1)


def _frames(report: pytest.CollectReport) -> list[str]:
    """The files of a collection error's traceback, outermost first (where the import failed is last)."""
    lines = str(report.longrepr or "").splitlines()
    return [match.group(1) for line in lines if (match := _FRAME.match(line.strip()))]


def _short(report: pytest.CollectReport | pytest.TestReport) -> str:
    """The last line that names an exception ("E   ImportError: ..."), else the report's last line."""
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, "Skipped: why")
        return str(report.longrepr[2]).removeprefix("Skipped: ")[:300]
    text = str(report.longrepr or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    chosen = errors[-1].removeprefix("E").strip() if errors else (lines[-1] if lines else "")
    return chosen[:300]
