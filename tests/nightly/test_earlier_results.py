"""The ends' evaluations a user already ran stand for the ends once a control share agrees: a real
accuracy bisection of the demo upstream, served over HTTP and scored by the command harness, run
once in full, then again with the first run's end results handed over by `--earlier-results`
(over the recipe's `accuracy.earlier_results`, whose own good end names the wrong commit): the
good end's are used once the second stage of its control share agrees (one sample of the first
was flipped), the bad end's are said to be of another commit, so they are set aside and that end
runs in full."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.demo.accuracy import DATASET, read_dataset
from bisect_npu.journal import Journal
from bisect_npu.observations import Observation
from bisect_npu.orchestration.opening.open_session import request_difference
from bisect_npu.orchestration.running.earlier_results import control_stages
from bisect_npu.request import RunRequest
from tests.helpers.paths import HELPERS

pytestmark = [pytest.mark.e2e, pytest.mark.heavy]  # two served accuracy bisections: about 2.5 minutes

HARNESS = HELPERS / "accuracy_command_harness.py"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bisect(repo: Path, good: str, bad: str, tmp_path: Path, name: str, earlier: dict[str, Any] | None,
           options: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    accuracy: dict[str, Any] = {
        "harness": "command", "dataset": str(DATASET),
        "command": {"argv": [sys.executable, str(HARNESS), "{base_url}", "{model}", "{dataset}", "{output}"]},
        "sampling": {"temperature": 0.0, "max_tokens": 4, "seed": 0}}
    if earlier is not None:
        accuracy["earlier_results"] = earlier
    recipe = {"name": "earlier-results", "model": {"path": "seed:0", "dtype": "float32"},
              "engine": {"backend": "openai", "launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"],
                         "port": free_port(), "startup_timeout_s": 120},
              "accuracy": accuracy, "oracle": {"kinds": ["accuracy"]},
              "build": {"local_command": ["python", "tools/build_kernels.py"]}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(recipe))
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(repo), "--good", good, "--bad", bad,
                           "--recipe", str(path), "--session", str(tmp_path / name), "--no-fix", "--no-verdict-store",
                           "--json", *options], cwd=tmp_path, capture_output=True, text=True, timeout=580, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    entries = [json.loads(line) for line in (tmp_path / name / "journal.jsonl").read_text().splitlines()]
    return json.loads(done.stdout.strip().splitlines()[-1]), entries


def sample_runs(session: Path, step: dict[str, Any]) -> int:
    """Generations a step ran (an earlier-results observation ran none)."""
    return sum(len(Observation.load(session / t["observation"]).samples or []) for t in step["trials"]
               if t.get("observation") and not t["reason"].startswith("earlier results"))


def test_the_ends_earlier_results_stand_for_them_once_a_control_share_agrees(demo_upstream, tmp_path, monkeypatch):
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    summary, first = bisect(repo, case.good_ref, case.bad_ref, tmp_path, "full", None)
    assert summary["culprit"] == case.culprit.sha
    steps = {s["index"]: s for s in first if s["type"] == "step"}
    n = max(steps)
    files = {}
    for index, role in ((0, "good"), (n, "bad")):  # the ends' results as the command harness wrote them
        samples = [s for t in steps[index]["trials"]
                   for s in Observation.load(tmp_path / "full" / t["observation"]).samples or []]
        # The good end's one sample in the control's first stage flipped: the rest of the share runs, and
        # with 1 sample of it differing the results still stand.
        flip = control_stages([s.id for s in samples], 0.2, steps[0]["commit"])[0][0] if role == "good" else None
        files[role] = tmp_path / f"{role}-end.jsonl"
        files[role].write_text("".join(json.dumps({"id": s.id, "correct": 1 - s.correct if s.id == flip else s.correct,
                                                   "runs": s.runs}) + "\n" for s in samples))
    wrong = {"path": str(files["bad"]), "commit": steps[n]["commit"]}  # the bad end's: the option replaces it
    options = ("--earlier-results", f"good={steps[0]['commit'][:10]}:{files['good'].name}",  # relative to the cwd
               "--earlier-results", f"bad={steps[0]['commit']}:{files['bad'].name}")  # said to be the good end's
    summary, second = bisect(repo, case.good_ref, case.bad_ref, tmp_path, "earlier",
                             {"good": wrong, "control_share": 0.2}, options)
    assert summary["culprit"] == case.culprit.sha
    ends = {s["index"]: s for s in second if s["type"] == "step" and s["index"] in (0, n)}
    total = len(read_dataset())
    control = max(5, -(-total // 5))
    assert ends[0]["verdict"]["reason"].startswith(f"from the earlier results {files['good']} (1 of {control} ")
    assert sample_runs(tmp_path / "earlier", ends[0]) == control  # the control share only, both stages
    assert f"set aside: they ran at {steps[0]['commit']}, this end is {steps[n]['commit'][:12]}" in \
        ends[n]["verdict"]["reason"]
    assert sample_runs(tmp_path / "earlier", ends[n]) == total  # set aside: the whole dataset ran
    header = second[0]["request"]["judge"]["earlier_results"]
    assert header == [f"good={steps[0]['commit'][:10]}:{files['good']}", f"bad={steps[0]['commit']}:{files['bad']}"]
    assert f"--earlier-results good={steps[0]['commit'][:10]}:{files['good']}" in \
        (tmp_path / "earlier" / "report.md").read_text()  # the reproduce line asks for them again

    monkeypatch.chdir(tmp_path)  # the same flags asked again from here are the same run; another file is another
    header = Journal.open(tmp_path / "earlier", read_only=True).header
    asked = RunRequest.of(repo=str(repo), good=case.good_ref, bad=case.bad_ref, recipe=str(tmp_path / "earlier.yaml"),
                          propose_fix=False, verdict_store=None, earlier_results=list(options[1::2]))
    assert request_difference(header, asked) is None
    asked.judge.earlier_results[1] = f"bad={steps[0]['commit']}:{files['good'].name}"
    assert "its --earlier-results is " in (request_difference(header, asked) or "")
