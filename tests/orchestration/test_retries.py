"""Runs that fail on the host are retried, never judged: a whole accuracy bisection on a host whose
server starts fail 30% of the time and whose harness loses the server 10% of the time (both
seeded) names the culprit, journals every failed attempt and resumes after an interrupt in the
middle of a retry; an end that never starts stops the run with exit 5 naming the cause."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import git
import pytest

from bisect_npu.execute.card_memory import CardWait, parse_npu_smi
from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.opening.environments import make_environment
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
from bisect_npu.orchestration.running.infrastructure import RetryPolicy, classify
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import EngineSpec
from bisect_npu.records import RetryRun
from bisect_npu.search.retry_policy import HostRecord, attempts_allowed
from tests.helpers.asked import spec_of
from tests.helpers.flaky_host import CLI, failures, flaky_recipe, free_port, journal, run_on_flaky_host
from tests.helpers.paths import HELPERS
from tests.helpers.signals import interruptible

FLAKY = HELPERS / "flaky_start.py"


@pytest.mark.e2e
@pytest.mark.heavy  # two sessions of a served accuracy bisection with backoffs: about 2 minutes
def test_a_flaky_host_costs_retries_not_the_answer_and_resumes_inside_a_retry(demo_upstream, tmp_path):
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    recipe = flaky_recipe(tmp_path, 0.3, 0.1, seed=5)
    session = tmp_path / "s"
    argv = [*CLI, "run", "--repo", str(repo), "--good", case.good_ref, "--bad", case.bad_ref, "--recipe", str(recipe),
            "--session", str(session), "--no-fix", "--no-verdict-store", "--json"]
    first = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=interruptible)
    deadline = time.monotonic() + 300
    while not any(r["type"] == "retry" for r in journal(session)):  # the first failed attempt: its backoff runs
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.1)
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=120)
    before = journal(session)
    assert not [r for r in before if r["type"] == "end"]
    kept = [r for r in before if r["type"] == "retry"]
    assert kept

    done = subprocess.run([*CLI, "resume", "--session", str(session), "--json", "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=580, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == case.culprit.sha
    entries = journal(session)
    retries = [r for r in entries if r["type"] == "retry"]
    assert retries[:len(kept)] == kept  # the attempts before the interrupt stay, in order
    # Every failed start and every dropped harness run is one journaled attempt, with its cause.
    assert failures(tmp_path / "starts.txt") >= 1 and failures(tmp_path / "harness.txt") >= 1
    assert len(retries) == failures(tmp_path / "starts.txt") + failures(tmp_path / "harness.txt")
    kinds = Counter(r["kind"] for r in retries)
    assert kinds == {"card_busy": failures(tmp_path / "starts.txt"), "transport": failures(tmp_path / "harness.txt")}
    steps = [r for r in entries if r["type"] == "step"]
    assert all(s["verdict"]["kind"] != "skip" for s in steps)  # no step lost to the host
    assert sum(len(s["retries"]) for s in steps) == len(retries)  # each attempt counted at its step
    summary = json.loads((session / "report.json").read_text())
    assert sum(step["retries"] for step in summary["steps"]) == len(retries)
    assert {cause for step in summary["steps"] for cause in step["host_failures"]} == {r["cause"] for r in retries}
    assert "retried: the card was still busy: RuntimeError: NPU device busy" in (session / "report.md").read_text()
    judged = Counter((t["index"], t["case_id"], t["trial"]) for t in entries if t["type"] == "trial"
                     and t.get("observation"))
    assert set(judged.values()) == {1}  # no trial ran twice across the interrupt


@pytest.mark.e2e
# test_settings_retries.py's test_both_spaces_..._number_its_attempts_on[commits] runs this session (then its
# resume) in make test: exit 5, "2 attempts failed on the host", the card busy ("NPU device busy"), two failed
# starts journaled as attempts [1, 2].
@pytest.mark.heavy
def test_an_end_whose_engine_never_starts_stops_with_exit_5_naming_the_cause(demo_upstream, tmp_path):
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    recipe = flaky_recipe(tmp_path, 1.0, 0.0, seed=0)
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", case.good_ref, "--bad", case.bad_ref,
                           "--recipe", str(recipe), "--session", str(tmp_path / "s"), "--no-fix",
                           "--no-verdict-store", "--retries", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-3000:]
    assert "could not be judged, 2 attempts failed on the host: the card was still busy" in done.stderr
    assert "NPU device busy" in done.stderr
    assert failures(tmp_path / "starts.txt") == 2
    assert [r["attempt"] for r in journal(tmp_path / "s") if r["type"] == "retry"] == [1, 2]


@pytest.mark.e2e
# The commit space's variant, with 3 s backoffs (about 18 s of waiting): in make test, the one session engine is
# interrupted in its first backoff and resumed with the budget left through the settings space
# (test_settings_retries.py's test_an_interrupted_search_resumes_with_the_retry_budget_its_journal_left), and a
# run resumed after a spent budget gets a new one (its test_both_spaces_..._number_its_attempts_on[commits]).
@pytest.mark.heavy
def test_a_resumed_trial_goes_on_with_the_attempts_journaled_before_the_interrupt(demo_upstream, tmp_path):
    """Interrupted in its first backoff, then resumed: two more attempts, three in all (the budget
    of --retries 2), then exit 5; resumed after that, a new budget."""
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    recipe = flaky_recipe(tmp_path, 1.0, 0.0, seed=0)
    settings = json.loads(recipe.read_text())
    settings["trials"]["retry_backoff_s"] = 3.0  # the interrupt lands in the first backoff
    recipe.write_text(json.dumps(settings))
    session = tmp_path / "s"
    first = subprocess.Popen([*CLI, "run", "--repo", str(repo), "--good", case.good_ref, "--bad", case.bad_ref,
                              "--recipe", str(recipe), "--session", str(session), "--no-fix", "--no-verdict-store",
                              "--retries", "2"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=interruptible)
    deadline = time.monotonic() + 240
    while not any(r["type"] == "retry" for r in journal(session)):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.1)
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=120)
    assert failures(tmp_path / "starts.txt") == 1
    done = subprocess.run([*CLI, "resume", "--session", str(session), "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-3000:]
    retries = [r for r in journal(session) if r["type"] == "retry"]
    assert len({(r["index"], r["trial"]) for r in retries}) == 1  # one trial, at the end that was interrupted
    assert [r["attempt"] for r in retries] == [1, 2, 3]  # the budget: a first run and 2 retries, all told
    assert failures(tmp_path / "starts.txt") == 3
    assert "could not be judged, 3 attempts failed on the host" in done.stderr
    again = subprocess.run([*CLI, "resume", "--session", str(session), "--quiet"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 5  # the host still busy: a resume after a spent budget gets a new one, and spends it
    assert [r["attempt"] for r in journal(session) if r["type"] == "retry"] == [1, 2, 3, 4, 5, 6]
    assert failures(tmp_path / "starts.txt") == 6


@pytest.mark.e2e
def test_one_seeded_history_on_the_30_and_10_percent_host_keeps_its_answer_and_says_the_rate(demo_upstream,
                                                                                              tmp_path):
    """The short variant of bench/flaky_host_bench.py: one served history, exit 0, the right
    culprit, every failed start and harness run journaled, and the report's host section giving
    the retries and the failure rate they make. From the culprit's third first-parent ancestor to
    its third descendant: both ends and the steps between on the same flaky host (seed 3 fails
    the second start), not the case's 39 commits."""
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    history = git.Repo(repo)
    after = history.git.rev_list("--first-parent", "--reverse", f"{case.culprit.sha}..{case.bad_ref}").split()
    good = history.commit(f"{case.culprit.sha}~3").hexsha
    run = run_on_flaky_host(repo, good, after[2], tmp_path, seed=3)
    assert run.exit_code == 0 and run.culprit == case.culprit.sha, run.output
    assert run.start_failures + run.harness_failures >= 1 and run.every_failure_journaled, run
    row = next(line for line in (tmp_path / "session" / "report.md").read_text().splitlines()
               if line.startswith("| host failures |"))
    assert f"| host failures | {run.retries} retr" in row and "host failure rate estimated at" in row
    assert f"({run.retries} of " in row


@pytest.mark.e2e
@pytest.mark.heavy  # ten engine starts over two sessions: about a minute under load
def test_a_host_that_stopped_stops_an_end_in_the_prior_budget_and_a_recipe_bound_caps_it(demo_upstream, tmp_path):
    """No bound given: a host whose every start fails is given up at an end after the attempts a
    fresh session's prior allows (exit 5, naming the rate), not after twenty; the recipe's
    trials.retries caps them."""
    repo, manifest = demo_upstream
    case = manifest.case("accuracy")
    for where, bound, attempts in ((tmp_path / "free", None, attempts_allowed(HostRecord())),
                                   (tmp_path / "bounded", 2, 3)):
        recipe = flaky_recipe(where, 1.0, 0.0, seed=0, backoff_s=0.0, retries=bound)
        done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", case.good_ref, "--bad", case.bad_ref,
                               "--recipe", str(recipe), "--session", str(where / "s"), "--no-fix",
                               "--no-verdict-store"], cwd=where, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-3000:]
        assert failures(where / "starts.txt") == attempts
        assert f"could not be judged, {attempts} attempts failed on the host" in done.stderr
        assert "host failure rate estimated at 10% (0 of 0 attempts failed" in done.stderr
        assert ("at most 2 retries as asked" in done.stderr) == (bound is not None)
    assert 4 < attempts_allowed(HostRecord()) < 10


SERVER_LOG_TAIL = """Traceback (most recent call last):
  File "probe/__main__.py", line 41, in main
RuntimeError: server exited with 1 before /health answered; log /s/obs.server.log:
{line}
"""


@pytest.mark.parametrize(("returncode", "line", "kind"), [
    (3, "OSError: [Errno 98] Address already in use", "port_in_use"),
    (3, "RuntimeError: NPU device busy", "card_busy"),
    (3, "ImportError: cannot import name 'x' from 'vllm_ascend'", "engine_start"),
    (4, "the harness lm_eval exited 1; log h.log: ConnectionResetError: [Errno 104] Connection reset by peer",
     "transport"),
    (4, "the harness ais_bench exited 1; log h.log: HTTP Error 503: Service Unavailable", "transport"),
    (-9, "", "engine_killed"),
])
def test_a_failure_of_the_host_is_told_by_its_log(returncode: int, line: str, kind: str) -> None:
    text = SERVER_LOG_TAIL.format(line=line) if returncode == 3 else f"accuracy harness failed: {line}"
    failure = classify(returncode, False, text if line else "")
    assert failure is not None and failure.kind == kind


@pytest.mark.parametrize(("returncode", "timed_out", "text"), [
    (3, False, "Traceback ...\nZeroDivisionError: division by zero"),  # the commit's own crash in a trial
    (4, False, "accuracy harness failed: the harness wrote no sample line"),  # a harness that cannot run: exit 5
    (4, False, "accuracy harness failed: the harness wrote a line that is not JSON"),
    (1, True, "server exited with 1 before /health answered"),  # past --timeout: --timeout-is decides
    (0, False, "connection reset"),
])
def test_a_verdict_or_a_harness_that_cannot_run_is_never_a_host_failure(returncode: int, timed_out: bool,
                                                                           text: str) -> None:
    assert classify(returncode, timed_out, text) is None


def test_backoff_doubles_up_to_five_minutes() -> None:
    policy = RetryPolicy(retries=10, backoff_s=10.0)
    assert [policy.delay(n) for n in (1, 2, 3)] == [10.0, 20.0, 40.0]
    assert policy.delay(9) == 300.0


NPU_SMI = """+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc3                 Version: 23.0.rc3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 91.3        37                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          {used0} / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 90.1        36                0    / 0             |
| 0                         | 0000:01:00.0  | 0           0    / 0          {used1} / 65536         |
+===========================+===============+====================================================+
"""


class FakeNpuSmi:
    """The cards of an NPU host that cannot exist here: `npu-smi info` as it reads while an engine
    that exited releases card 1's memory over `busy_polls` polls."""

    def __init__(self, busy_polls: int) -> None:
        self.busy_polls = busy_polls
        self.polls = 0

    def used_shares(self) -> list[float]:
        self.polls += 1
        used1 = 60000 if self.polls <= self.busy_polls else 3384
        return parse_npu_smi(NPU_SMI.format(used0=3384, used1=used1))


def test_npu_smi_shows_each_chips_hbm_share() -> None:
    assert parse_npu_smi(NPU_SMI.format(used0=16384, used1=65536)) == [0.25, 1.0]


def test_the_cards_are_waited_for_until_free_and_the_wait_is_bounded() -> None:
    slept: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    smi = FakeNpuSmi(busy_polls=3)
    assert CardWait(smi, limit_s=60, poll_s=2).wait(sleep, lambda: now[0]) == ""
    assert smi.polls == 4 and slept == [2, 2, 2]
    assert CardWait(FakeNpuSmi(busy_polls=3), cards=[0]).wait(sleep, lambda: now[0]) == ""  # card 1 not watched
    held = CardWait(FakeNpuSmi(busy_polls=100), limit_s=10, poll_s=2).wait(sleep, lambda: now[0])
    assert held == "card memory still held after 10s: card 1 92% used"


def never_starting_evaluator(demo_upstream, tmp_path: Path) -> tuple[Evaluator, str]:
    """The demo's presence-penalty case served over HTTP by a launcher whose every start fails
    (busy card), one retry, no backoff: a real worktree build and real probe runs."""
    repo_path, manifest = demo_upstream
    truth = manifest.case("presence-penalty")
    recipe = load_recipe(truth.recipe)
    launcher = [sys.executable, str(FLAKY), "--fail-rate", "1.0", "--seed", "0", "--count",
                str(tmp_path / "starts.txt"), "--", "{python}", "-m", "{probe}.serve_mini", "{model}"]
    engine = EngineSpec(backend="openai", launcher=launcher, port=free_port(), startup_timeout_s=60,
                        args=recipe.engine.args)
    recipe = recipe.model_copy(update={"engine": engine,
                                       "trials": recipe.trials.model_copy(update={"retry_backoff_s": 0.0})})
    options = spec_of(good=truth.good_ref, bad=truth.bad_ref, repo=str(repo_path))
    builder, executor = make_environment(options, git.Repo(repo_path), recipe, tmp_path, tmp_path / "worktrees")
    cards = CardWait(FakeNpuSmi(busy_polls=10**6), limit_s=0.0, poll_s=0.0)  # card 1 never let go
    return Evaluator(builder, executor, tmp_path, recipe=recipe, retries=1, cards=cards), truth.culprit.sha


@pytest.mark.e2e
def test_a_candidate_the_host_never_starts_is_a_skip_naming_every_attempt(demo_upstream, tmp_path):
    evaluator, commit = never_starting_evaluator(demo_upstream, tmp_path)
    attempts: list[RetryRun] = []
    try:
        result = evaluator.evaluate(EvaluationRequest(commit, 1, on_retry=attempts.append))
    finally:
        evaluator.close()
    assert [a.attempt for a in attempts] == [1, 2] and {a.kind for a in attempts} == {"card_busy"}
    assert result.verdict.kind == VerdictKind.SKIP
    assert "the card was still busy" in result.verdict.reason and "(2 attempts: 1. card_busy; 2. card_busy)" in \
        result.verdict.reason
    kept = sorted(p.name for p in (tmp_path / "steps" / commit[:12]).glob("probe-*.attempt-*.log"))
    assert kept == ["probe-server-default-t0.attempt-1.log", "probe-server-default-t0.attempt-2.log"]
    assert all((tmp_path / a.log).is_file() for a in attempts)  # each attempt's own log, journaled by path
    assert all(a.cause.endswith("(card memory still held after 0s: card 1 92% used)") for a in attempts)


def test_a_resumed_session_keeps_the_hosts_record_from_its_journal() -> None:
    """The failed attempts before a trial that ran, and the trials that ran, are the host's record
    again after a resume; attempts of a trial not finished yet are not (its streak is judged against
    the record)."""
    from bisect_npu.orchestration.opening.state import SessionState
    from bisect_npu.records import RetryRecord, TrialRecord

    sha = "a" * 40
    entries = [RetryRecord(index=1, commit=sha, case_id="c", trial=0, attempt=1, kind="card_busy", cause="busy"),
               RetryRecord(index=1, commit=sha, case_id="c", trial=0, attempt=2, kind="transport", cause="reset"),
               TrialRecord(index=1, commit=sha, case_id="c", trial=0, outcome=VerdictKind.GOOD),
               TrialRecord(index=2, commit=sha, case_id="c", trial=0, outcome=VerdictKind.BAD),
               TrialRecord(index=2, commit=sha, case_id="c", trial=1, outcome=VerdictKind.SKIP),
               RetryRecord(index=3, commit=sha, case_id="c", trial=0, attempt=1, kind="card_busy", cause="busy")]
    assert SessionState(False, False, entries).host_record == HostRecord(failures=2, successes=2)
