"""A noisy session whose steps cannot settle the culprit: every commit fails some of the time (10%,
30%, 50%: the middle one halfway), so all three reach their steps' cap of trials without the
confidence asked, and the search names its best guess and says so, in the run's sentence, the
journal and the report, with the exit code of a culprit found (0)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.search.types import SearchProblem
from tests.helpers.gitrepo import make_linear_repo

pytestmark = pytest.mark.e2e  # a whole session through the CLI: 192 trials of a shell command, a few seconds

CLI = [sys.executable, "-m", "bisect_npu"]

# Fails in `rate`% of trials, drawn per (commit, trial): deterministic, so the session is too.
FLAKY = """roll=$(( $(printf %s "1-$BISECT_NPU_COMMIT-$BISECT_NPU_TRIAL" | cksum | cut -d' ' -f1) % 100 ))
[ "$roll" -ge "$(cat rate)" ]
"""


def test_a_culprit_the_steps_cannot_settle_is_named_as_a_best_guess(tmp_path: Path) -> None:
    rates = [10, 30, 50]
    shas = make_linear_repo(tmp_path / "repo", 3, files=lambda i: {"rate": f"{rates[i]}\n"})
    (tmp_path / "flaky.sh").write_text(FLAKY)
    session = tmp_path / "s"
    done = subprocess.run([*CLI, "run", "--repo", str(tmp_path / "repo"), "--good", shas[0], "--bad", shas[-1],
                           "--cmd", f"sh {tmp_path / 'flaky.sh'}", "--mode", "noisy", "--confidence", "0.99",
                           "--session", str(session), "--no-fix", "--no-verdict-store", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    entries = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    end = next(e for e in entries if e["type"] == "end")
    assert result["culprit"] == end["culprit"] and end["confidence"] < 0.99
    sure = f"{int(end['confidence'] * 100)}%"
    sentence = (f" (a best guess: {sure} sure, under the 99% asked; the steps around it disagree, the report has "
                "each one's evidence)")
    assert end["message"].endswith(sentence)
    assert end["message"] in done.stderr + done.stdout
    assert json.loads((session / "report.json").read_text())["message"] == end["message"]
    assert "the commits around it reached the trial cap or were skipped before the answer was sure" in \
        (session / "report.md").read_text()
    trials: dict[int, int] = {}
    for entry in entries:
        if entry["type"] == "trial":
            trials[entry["index"]] = trials.get(entry["index"], 0) + 1
    cap = SearchProblem(n=2).max_trials_per_query
    assert trials == {0: cap, 1: cap, 2: cap}  # every commit capped: no more evidence to ask for
