"""VLLM_BATCH_INVARIANT=1 for the candidates whose own source starts vllm-ascend's batch-invariant
mode, read at each commit on a small history with the *shape* of that code (not its code), handed
to the runs on the NPUs, journaled per step and shown in the report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import git as gitpython
import pytest

from bisect_npu.builders.switches import batch_invariance_caller, candidate_switches
from bisect_npu.orchestration.session import Session
from bisect_npu.report import load_view, render_json, render_markdown
from tests.helpers.asked import spec_of
from tests.helpers.gitrepo import make_linear_repo

# The shapes: a module defining the initialiser, then a worker that calls it at start.
DEFINES = '''import os


def init_batch_invariance():
    if os.environ.get("VLLM_BATCH_INVARIANT") == "1":
        register_kernels()
'''
CALLS = '''from vllm_ascend.batch_invariant import init_batch_invariance


class NPUWorker:
    def init_device(self):
        init_batch_invariance()
'''
WORKER = "class NPUWorker:\n    def init_device(self):\n        pass\n"
DEFINED_AT, CALLED_AT = 3, 5


def files(i: int) -> dict[str, str | None]:
    if i == 0:
        return {"vllm_ascend/worker/worker.py": WORKER}
    if i == DEFINED_AT:
        return {"vllm_ascend/batch_invariant.py": DEFINES}
    if i == CALLED_AT:
        return {"vllm_ascend/worker/worker.py": CALLS}
    return {}


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "vllm-ascend"
    return path, make_linear_repo(path, 9, files=files)


def test_the_switch_is_offered_from_the_commit_whose_worker_calls_the_initialiser(
        history: tuple[Path, list[str]]) -> None:
    path, shas = history
    repo = gitpython.Repo(path)
    assert [batch_invariance_caller(repo, sha) for sha in shas] == \
        [None] * CALLED_AT + ["vllm_ascend/worker/worker.py"] * (len(shas) - CALLED_AT)
    assert candidate_switches(repo, shas[DEFINED_AT], "A2") == {}  # defined, never called: nothing to switch on
    assert candidate_switches(repo, shas[CALLED_AT], "A3") == {"VLLM_BATCH_INVARIANT": "1"}
    assert candidate_switches(repo, shas[CALLED_AT], None) == {"VLLM_BATCH_INVARIANT": "1"}
    assert candidate_switches(repo, shas[CALLED_AT], "310P") == {}  # vllm-ascend runs it on A2 and A3 only


def test_each_candidate_runs_with_its_own_switch_the_journal_and_report_say_so(
        history: tuple[Path, list[str]], tmp_path: Path) -> None:
    """An oracle that is "bad" exactly when the switch is on finds the commit where it appears: the
    variable reaches the runs of the candidates that have it and only those, each step's journal
    line says whether it was on, and the report warns that such a culprit may be the switch."""
    path, shas = history
    options = spec_of(good=shas[0], bad=shas[-1], repo=str(path), executor="local", devices=[0],
                         command=["sh", "-c", 'test "${VLLM_BATCH_INVARIANT:-0}" != 1'], propose_fix=False)
    session_dir = tmp_path / "session"
    result = Session.start(options, session_dir=session_dir).run()
    assert result.culprit == shas[CALLED_AT]
    steps = [json.loads(line) for line in (session_dir / "journal.jsonl").read_text().splitlines()
             if json.loads(line)["type"] == "step"]
    assert steps and all(step["build"]["run_env"] == ({"VLLM_BATCH_INVARIANT": "1"} if step["index"] >= CALLED_AT
                                                       else {}) for step in steps)
    view = load_view(session_dir)
    on = sum(1 for step in steps if step["build"]["run_env"])
    assert f"- `VLLM_BATCH_INVARIANT=1` (the candidate's own switch) in the runs of {on} of {len(steps)} steps; " \
           "the others' source lacks it" in render_markdown(view)
    assert [s["run_env"] for s in render_json(view)["steps"]] == [s["build"]["run_env"] for s in steps]


def test_the_recipe_environment_has_the_last_word(history: tuple[Path, list[str]], tmp_path: Path) -> None:
    from bisect_npu.builders.local import LocalBuilder
    from bisect_npu.builders.switches import SwitchingBuilder

    path, shas = history
    repo = gitpython.Repo(path)
    builder = LocalBuilder(repo, tmp_path / "work", [])
    switched = SwitchingBuilder(builder, repo, "A2")
    assert switched.acquire(shas[-1], tmp_path / "logs").run_env == {"VLLM_BATCH_INVARIANT": "1"}
    assert switched.acquire(shas[0], tmp_path / "logs").run_env == {}
    told = SwitchingBuilder(builder, repo, "A2", recipe_env={"VLLM_BATCH_INVARIANT": "0"})
    assert told.acquire(shas[-1], tmp_path / "logs").run_env == {}  # the run gets the recipe's 0, and says so
    switched.close()


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("BISECT_NPU_VLLM_ASCEND"), reason="BISECT_NPU_VLLM_ASCEND names no clone")
def test_on_the_real_history() -> None:
    """vllm-ascend's worker starts batch-invariant mode from v0.13.0rc2 (#5517) on (run by hand:
    BISECT_NPU_VLLM_ASCEND=CLONE pytest -m slow ...)."""
    repo = gitpython.Repo(os.environ["BISECT_NPU_VLLM_ASCEND"])
    for tag in ("v0.11.0", "v0.12.0rc1", "v0.13.0rc1"):
        assert candidate_switches(repo, repo.commit(tag).hexsha, "A2") == {}, tag
    for tag in ("v0.13.0rc2", "v0.13.0"):
        assert batch_invariance_caller(repo, repo.commit(tag).hexsha) == "vllm_ascend/worker/worker.py", tag
        assert candidate_switches(repo, repo.commit(tag).hexsha, "A3") == {"VLLM_BATCH_INVARIANT": "1"}, tag
