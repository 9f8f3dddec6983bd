"""The verdict store: a bisection again over a range it has seen runs nothing for the commits it
judged, `--good last-good` starts from the newest commit judged good, and nothing is reused across
another oracle or environment. Real git repositories and `--cmd` checks that count their own runs."""

from __future__ import annotations

import io
import json
import multiprocessing
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_npu.errors import InfrastructureError
from bisect_npu.observations import Verdict, VerdictKind
from bisect_npu.orchestration.opening.verdict_reuse import VerdictReuse
from bisect_npu.progress import PlainProgress
from bisect_npu.store import Scope, StoredVerdict, VerdictStore
from tests.helpers.cli_exit import cli_in_process
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.store_writer import put_many

# Each test runs bisect-npu end to end (sessions, the command line, the demo's model).
pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-m", "bisect_npu"]
CULPRIT = 21
# Writes the position it judged (the `counter` file of make_linear_repo) to the file named by its
# argument, then judges as `git bisect run` would: 0 before the culprit, 1 from it on.
CHECK = """import pathlib, sys
with open(sys.argv[1], "a") as runs:
    runs.write(pathlib.Path("counter").read_text().strip() + "\\n")
sys.exit(0 if pathlib.Path("state").read_text().strip() == "good" else 1)
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("store") / "repo"
    return path, make_linear_repo(path, 33, culprit=CULPRIT)


@pytest.fixture
def check(tmp_path: Path) -> tuple[str, Path]:
    """The `--cmd` and the file it counts its runs in (one line per run: the position it judged)."""
    script = tmp_path / "check" / "check.py"
    script.parent.mkdir()
    script.write_text(CHECK)
    runs = tmp_path / "check" / "runs.txt"
    return f"{sys.executable} {script} {runs}", runs


def bisect(repo: Path, session: Path, good: str, bad: str, command: str, *extra: str) -> tuple[int, dict, str]:
    done = cli_in_process(["run", "--repo", str(repo), "--good", good, "--bad", bad, "--cmd", command, "--no-fix",
                           "--session", str(session), "--json", *extra])
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def ran(runs: Path) -> list[int]:
    """The positions the check judged, in order (and cleared for the next run)."""
    positions = [int(line) for line in runs.read_text().split()] if runs.exists() else []
    runs.unlink(missing_ok=True)
    return positions


def steps(session: Path) -> list[dict]:
    lines = [json.loads(line) for line in (session / "journal.jsonl").read_text().splitlines()]
    return [line for line in lines if line["type"] == "step"]


def test_a_rerun_over_an_overlapping_range_runs_nothing_it_judged(repo, check, tmp_path: Path) -> None:
    path, shas = repo
    command, runs = check
    code, first, err = bisect(path, tmp_path / "first", shas[0], shas[24], command)
    assert (code, first["culprit"]) == (0, shas[CULPRIT]), err
    judged = ran(runs)
    assert len(judged) == first["steps"] and CULPRIT - 1 in judged

    # The same range again, in a new session: every verdict from the store; only the culprit and
    # its parent, which the answer rests on, run again (fresh, to confirm the stored verdicts).
    code, again, err = bisect(path, tmp_path / "again", shas[0], shas[24], command)
    assert (code, again["culprit"], ran(runs)) == (0, shas[CULPRIT], [CULPRIT - 1, CULPRIT]), err
    stored = [step for step in steps(tmp_path / "again") if step["stored"]]
    assert all(step["build"]["how"] == "stored" for step in stored) and len(stored) == again["steps"] - 2
    report = Path(again["report"]).read_text()
    assert f"{len(stored)} verdicts reused from the store" in report

    # Newer commits since: last-good is the culprit's parent, the newest commit judged good; the
    # search over (20, 32] runs only commits the first session never judged.
    code, later, err = bisect(path, tmp_path / "later", "last-good", shas[32], command)
    assert (code, later["culprit"]) == (0, shas[CULPRIT]), err
    assert f"--good last-good: {shas[CULPRIT - 1][:12]}" in err
    header = json.loads((tmp_path / "later" / "journal.jsonl").read_text().splitlines()[0])
    assert (header["range"]["base"], header["range"]["good_ref"]) == (shas[CULPRIT - 1], "last-good")
    judged_later = ran(runs)
    assert judged_later and set(judged_later) & set(judged) <= {CULPRIT - 1, CULPRIT}  # known: only the confirmation
    reused = [step for step in steps(tmp_path / "later") if step["stored"]]
    assert {step["commit"] for step in reused} >= {shas[CULPRIT - 1], shas[CULPRIT]}
    assert len(reused) + len(judged_later) == later["steps"]
    assert f"{len(reused)} verdicts reused from the store" in Path(later["report"]).read_text()
    assert json.loads(Path(later["report_json"]).read_text())["reused_verdicts"] == len(reused)


def test_no_verdict_store_neither_reuses_nor_keeps(repo, check, tmp_path: Path, own_verdict_store: Path) -> None:
    path, shas = repo
    command, runs = check
    bisect(path, tmp_path / "first", shas[0], shas[24], command)
    judged = ran(runs)
    with sqlite3.connect(own_verdict_store) as db:
        kept = db.execute("SELECT count(*) FROM verdicts").fetchone()[0]
    code, summary, err = bisect(path, tmp_path / "off", shas[0], shas[24], command, "--no-verdict-store")
    assert (code, ran(runs)) == (0, judged), err
    with sqlite3.connect(own_verdict_store) as db:
        assert db.execute("SELECT count(*) FROM verdicts").fetchone()[0] == kept == len(judged)
    # This host's store is this host's: the reproduce line another person runs does not name it.
    reproduce = Path(summary["report"]).read_text().split("## Reproduce")[1].split("```sh\n")[1].split("\n")[0]
    assert reproduce.startswith("bisect-npu run ") and "verdict-store" not in reproduce


@pytest.mark.parametrize("change", ["timeout", "script", "store"])
def test_another_oracle_or_environment_reuses_nothing(repo, check, tmp_path: Path, change: str) -> None:
    path, shas = repo
    command, runs = check
    bisect(path, tmp_path / "first", shas[0], shas[24], command)
    judged = ran(runs)
    extra: list[str] = []
    if change == "timeout":  # a run's timeout changes what a slow commit shows
        extra = ["--timeout", "99"]
    elif change == "script":  # the check's own content is part of the oracle
        script = Path(command.split()[1])
        script.write_text(script.read_text() + "# edited\n")
    else:
        extra = ["--verdict-store", str(tmp_path / "elsewhere.sqlite")]
    code, summary, err = bisect(path, tmp_path / "second", shas[0], shas[24], command, *extra)
    assert (code, summary["culprit"], ran(runs)) == (0, shas[CULPRIT], judged), err


def test_last_good_with_nothing_judged_is_a_clear_error(repo, check, tmp_path: Path) -> None:
    path, shas = repo
    command, _ = check
    code, summary, err = bisect(path, tmp_path / "s", "last-good", shas[32], command)
    assert code == 2 and summary["status"] == "error"
    assert "--good last-good: the verdict store" in err and "holds no commit judged good" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = bisect(path, tmp_path / "t", "last-good", shas[32], command, "--no-verdict-store")
    assert code == 2 and "drop --no-verdict-store or name a good ref" in err


def test_last_good_is_on_the_bad_end_s_first_parent_line(repo, tmp_path: Path) -> None:
    """A commit judged good that is not an ancestor of the bad end is never picked."""
    import git

    from bisect_npu.orchestration.opening.verdict_reuse import resolve_last_good, scope_of
    from tests.helpers.asked import spec_of

    path, shas = repo
    options = spec_of(good="last-good", bad=shas[10], repo=str(path), command=["true"], mode="exact",
                         verdict_store=str(tmp_path / "v.sqlite"))
    scope = scope_of(options, None)
    assert scope is not None
    store = VerdictStore(tmp_path / "v.sqlite")
    for index in (3, 7, 12):  # 12 is newer than the bad end
        store.put(scope, StoredVerdict(shas[index], "", "earlier", VerdictKind.GOOD, 1, 0, "exit 0", float(index)))
    store.put(scope, StoredVerdict(shas[7], "", "another", VerdictKind.BAD, 0, 1, "exit 1", 20.0))  # disputed
    assert resolve_last_good(options, None, git.Repo(path))[0] == shas[3]


def test_sessions_that_disagree_are_tested_again_and_noisy_tallies_add_up(tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / "v.sqlite")
    exact, noisy = Scope("oracle", "env", "exact"), Scope("oracle", "env", "noisy")
    for session, kind in (("a", VerdictKind.GOOD), ("b", VerdictKind.GOOD)):
        store.put(exact, StoredVerdict("c1", "", session, kind, 1, 0, "exit 0", 1.0))
    store.put(exact, StoredVerdict("c2", "", "a", VerdictKind.GOOD, 1, 0, "exit 0", 1.0))
    store.put(exact, StoredVerdict("c2", "", "b", VerdictKind.BAD, 0, 1, "exit 1", 2.0))
    memory = VerdictReuse(store, exact, "now", PlainProgress())
    recalled = memory.recall("c1", "")
    assert recalled is not None and recalled.verdict.kind == VerdictKind.GOOD and recalled.stored.sessions == ["a", "b"]
    assert memory.recall("c2", "") is None  # they disagree: run it again
    assert memory.recall("c1", "another-build-key") is None
    theirs = VerdictReuse(store, exact, "a", PlainProgress()).recall("c2", "")
    assert theirs.verdict.kind == VerdictKind.BAD  # not its own
    store.put(noisy, StoredVerdict("c1", "", "a", VerdictKind.BAD, 7, 3, "3 of 10 trials bad", 1.0))
    store.put(noisy, StoredVerdict("c1", "", "b", VerdictKind.GOOD, 5, 0, "0 of 5 trials bad", 2.0))
    tally = VerdictReuse(store, noisy, "c", PlainProgress()).recall("c1", "")
    assert tally is not None and (tally.stored.good, tally.stored.bad, tally.verdict.kind) == (12, 3, VerdictKind.BAD)
    # A session keeps its own tally once, replaced as it grows, never added twice.
    own = VerdictReuse(store, noisy, "d", PlainProgress())
    own.keep("c1", "", Verdict(kind=VerdictKind.GOOD, reason="r"), 2, 0)
    own.keep("c1", "", Verdict(kind=VerdictKind.GOOD, reason="r"), 4, 0)
    own.keep("c1", "", Verdict(kind=VerdictKind.SKIP, reason="no trial judged"), 0, 0)  # a skip is not kept
    assert VerdictReuse(store, noisy, "e", PlainProgress()).recall("c1", "").stored.good == 16


def test_sessions_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=put_many, args=(str(path), w)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [worker.exitcode for worker in workers] == [0] * 4
    assert all(len(VerdictStore(path).get(Scope("o", "e", "exact"), f"c{i}", "", besides="")) == 4 for i in range(40))


def test_a_store_broken_under_a_running_session_is_an_infrastructure_error(tmp_path: Path) -> None:
    """(A store damaged when a session opens it is moved aside: test_verdict_store_damage.py.)"""
    store = VerdictStore(tmp_path / "ok.sqlite")
    (tmp_path / "ok.sqlite").write_bytes(b"garbage " * 512)  # broken under a running session
    with pytest.raises(InfrastructureError, match="verdict store"):
        store.get(Scope("o", "e", "exact"), "c", "", besides="")


def test_a_noisy_rerun_counts_the_stored_trials_as_evidence(tmp_path: Path) -> None:
    path = tmp_path / "noisy-repo"
    shas = make_linear_repo(path, 17, culprit=9)
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    runs = tmp_path / "runs.txt"
    command = f"{sys.executable} {script} {runs}"
    noisy = ("--mode", "noisy", "--confidence", "0.9")
    code, first, err = bisect(path, tmp_path / "first", shas[0], shas[16], command, *noisy)
    assert (code, first["culprit"]) == (0, shas[9]), err
    judged = ran(runs)
    code, again, err = bisect(path, tmp_path / "again", shas[0], shas[16], command, *noisy)
    assert (code, again["culprit"]) == (0, shas[9]), err
    judged_again = ran(runs)
    stored = [step["stored"] for step in steps(tmp_path / "again") if step["stored"]]
    assert stored and all(s["good"] + s["bad"] > 0 for s in stored)
    assert len(judged_again) < len(judged), (judged, judged_again)


@pytest.mark.parametrize(("case", "reference_runs"), [
    ("async-penalty", False),
    pytest.param("rope-longseq", True, marks=pytest.mark.heavy),  # the good-end reference variant, the heavier
])
def test_a_recipe_rerun_makes_no_probe_run_for_a_known_commit(demo_upstream, tmp_path: Path, case: str,
                                                              reference_runs: bool) -> None:
    """The demo's real probe runs: the second session runs no trial but at the culprit and its
    parent (the answer's two commits, confirmed fresh) and the good end of a recipe whose reference
    is the good end (its observations are what the others are compared with)."""
    repo, manifest = demo_upstream
    truth = manifest.case(case)
    # Four commits either side of the culprit, on the case's first-parent line: three steps, not five.
    history = subprocess.run(["git", "-C", str(repo), "rev-list", "--first-parent", "--reverse",
                           f"{truth.good_ref}..{truth.bad_ref}"], capture_output=True, text=True, check=True)
    shas = history.stdout.split()
    at = shas.index(truth.culprit.sha)
    good, bad = shas[at - 4], shas[at + 3]
    results = []
    for name in ("first", "again"):
        done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", good, "--bad", bad,
                               "--recipe", truth.recipe, "--no-fix", "--session", str(tmp_path / name), "--json"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=1200, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert results[0]["culprit"] == results[1]["culprit"] == truth.culprit.sha
    lines = [json.loads(line) for line in (tmp_path / "again" / "journal.jsonl").read_text().splitlines()]
    trials = {line["index"] for line in lines if line["type"] == "trial"}
    end = next(line for line in lines if line["type"] == "end")
    confirmed = {end["index"] - 1, end["index"]}
    assert trials - confirmed == ({0} if reference_runs else set())
    again = steps(tmp_path / "again")
    assert all(step["stored"] for step in again if step["index"] not in trials)


@pytest.mark.heavy  # a property over many sessions
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 24), data=st.data())
def test_any_stored_verdicts_give_the_same_culprit_without_running_them(tmp_path: Path, n: int,
                                                                       data: st.DataObject) -> None:
    """Whatever part of a history earlier sessions judged (truthfully), a session finds the same
    culprit, runs none of the commits they judged but the culprit and its parent (confirmed fresh),
    and journals each of them as reused."""
    from bisect_npu.orchestration.bisection import Bisection
    from bisect_npu.orchestration.opening.verdict_reuse import scope_of
    from tests.helpers.asked import spec_of

    culprit = data.draw(st.integers(1, n), label="culprit")
    known = data.draw(st.sets(st.integers(0, n)), label="stored positions")
    # hypothesis may draw the same example twice within one test's tmp_path: a fresh directory each time
    work = Path(tempfile.mkdtemp(prefix=f"{n}-{culprit}-", dir=tmp_path))
    shas = make_linear_repo(work / "repo", n + 1, culprit=culprit)
    script, runs = work / "check.py", work / "runs.txt"
    script.write_text(CHECK)
    options = spec_of(good=shas[0], bad=shas[n], repo=str(work / "repo"), command=[sys.executable, str(script),
                         str(runs)], mode="exact", propose_fix=False, verdict_store=str(work / "v.sqlite"))
    scope = scope_of(options, None)
    assert scope is not None
    store = VerdictStore(work / "v.sqlite")
    for index in known:
        kind = VerdictKind.BAD if index >= culprit else VerdictKind.GOOD
        store.put(scope, StoredVerdict(shas[index], "", "earlier", kind, int(kind == "good"), int(kind == "bad"),
                                       f"exit {int(kind == 'bad')}", 0.0))
    result = Bisection.start(options, session_dir=work / "s", progress=PlainProgress(io.StringIO())).run()
    assert result.culprit == shas[culprit]
    assert set(ran(runs)) & known <= {culprit - 1, culprit}
    assert {step["index"] for step in steps(work / "s") if step["stored"]} == known


def test_a_store_that_breaks_under_a_session_is_told_once_and_left_alone(tmp_path: Path) -> None:
    store = VerdictStore(tmp_path / "v.sqlite")
    said = io.StringIO()
    memory = VerdictReuse(store, Scope("o", "e", "exact"), "now", PlainProgress(said))
    (tmp_path / "v.sqlite").write_bytes(b"garbage " * 512)
    for commit in ("c1", "c2", "c3"):
        assert memory.recall(commit, "") is None
        memory.keep(commit, "", Verdict(kind=VerdictKind.GOOD, reason="exit 0"), 1, 0)
    assert said.getvalue().count("the verdict store failed") == 1 and memory.failed
