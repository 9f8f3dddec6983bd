"""A noisy session whose steps cannot settle the culprit: every commit fails some of the time (10%,
30%, 50%: the middle one halfway), so all three reach their steps' cap of trials without the
confidence asked: the search answers with the range that holds the confidence (exit 3, narrowed,
never the 0 of a culprit found) and names its best guess inside it, in the run's sentence, the JSON
line, the journal and both reports, and again when the finished session is resumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bisect_npu.orchestration.bisection import Bisection
from bisect_npu.records import NextLevelRecord
from bisect_npu.search.types import SearchProblem
from tests.helpers.gitrepo import make_linear_repo

CLI = [sys.executable, "-m", "bisect_npu"]

# Fails in `rate`% of trials, drawn per (commit, trial): deterministic, so the session is too.
FLAKY = """roll=$(( $(printf %s "1-$BISECT_NPU_COMMIT-$BISECT_NPU_TRIAL" | cksum | cut -d' ' -f1) % 100 ))
[ "$roll" -ge "$(cat rate)" ]
"""


@pytest.mark.e2e  # a whole session through the CLI: 192 trials of a shell command, a few seconds
def test_a_culprit_the_steps_cannot_settle_is_named_as_a_best_guess(tmp_path: Path) -> None:
    rates = [10, 30, 50]
    shas = make_linear_repo(tmp_path / "repo", 3, files=lambda i: {"rate": f"{rates[i]}\n"})
    (tmp_path / "flaky.sh").write_text(FLAKY)
    session = tmp_path / "s"
    done = subprocess.run([*CLI, "run", "--repo", str(tmp_path / "repo"), "--good", shas[0], "--bad", shas[-1],
                           "--cmd", f"sh {tmp_path / 'flaky.sh'}", "--mode", "noisy", "--confidence", "0.99",
                           "--session", str(session), "--no-fix", "--no-verdict-store", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    entries = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    end = next(e for e in entries if e["type"] == "end")
    assert result["status"] == end["status"] == "narrowed" and result["culprit"] is None
    assert result["best_guess"] == end["best_guess"] in shas[1:] and end["figures"]["posterior"] < 0.99
    assert result["range"] == [end["lo"], end["hi"]] and end["figures"]["range_posterior"] >= 0.99
    sure = f"{int(end['figures']['posterior'] * 100)}%"
    assert f"no commit reached the 99% asked; the best guess is {end['best_guess'][:12]}" in end["message"]
    assert f"({sure} sure)" in end["message"]
    assert end["message"] in done.stderr + done.stdout
    report = json.loads((session / "report.json").read_text())
    assert report["message"] == end["message"] and report["best_guess"] == end["best_guess"]
    assert report["culprit"] is None and report["status"] == "narrowed"
    markdown = (session / "report.md").read_text()
    assert f"no commit reached the confidence asked; the best guess is `{end['best_guess'][:12]}`" in markdown
    assert "the commits around it reached the trial cap or were skipped before the answer was sure" in markdown
    trials: dict[int, int] = {}
    for entry in entries:
        if entry["type"] == "trial":
            trials[entry["index"]] = trials.get(entry["index"], 0) + 1
    cap = SearchProblem(n=2).max_trials_per_query
    assert trials == {0: cap, 1: cap, 2: cap}  # every commit capped: no more evidence to ask for
    resumed = subprocess.run([*CLI, "resume", "--session", str(session), "--json"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600, check=False)
    assert resumed.returncode == 3, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    again = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert (again["status"], again["best_guess"], again["range"]) == ("narrowed", end["best_guess"], result["range"])


def test_a_finished_finer_level_answers_its_range_and_best_guess_again() -> None:
    """Resuming a session whose finer level is done answers from its `next_level` line alone: a
    best guess there stays a narrowed answer with its range and best guess (exit 3), as first run."""
    record = NextLevelRecord(session="s/commit-level", status="narrowed", lo="a" * 40, hi="c" * 40,
                             best_guess="b" * 40, message="the culprit is one of 2 commits", steps=7)
    parent = SimpleNamespace(session=SimpleNamespace(state=SimpleNamespace(journaled_steps=lambda: [1, 2])))
    result = Bisection._finer_answer(parent, record)  # type: ignore[arg-type]
    assert (result.status, result.exit_code, result.range, result.best_guess) == (
        "narrowed", 3, ("a" * 40, "c" * 40), "b" * 40)
    assert result.culprit is None and result.steps == 9
