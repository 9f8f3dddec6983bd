"""Builds that fail on the network are retried like runs: a local build whose package index is out
of reach (a closed port on this host) is built again with the retry budget, each failed attempt
journaled with its cause, and goes on once the index answers; with the budget spent the run
stops with exit 5 naming the network, at any step; a build that fails on the commit's own code
is a skip at once, never retried."""

from __future__ import annotations

import functools
import http.server
import json
import pickle
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest
import yaml

from bisect_npu.builders.failures import BuildUnreachable, EnvironmentFailure, classify_build_failure
from bisect_npu.builders.local import LocalBuilder
from bisect_npu.errors import InfrastructureError
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.observations import VerdictKind
from bisect_npu.orchestration.running.evaluate import EvaluationRequest, Evaluator
from bisect_npu.orchestration.running.infrastructure import RetryPolicy
from bisect_npu.recipe.loader import bundled_recipes
from bisect_npu.records import RetryRun
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo

CLI = [sys.executable, "-m", "bisect_npu"]
PACKAGE = "tinydep"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def package_index(root: Path) -> Path:
    """A PEP 503 simple index holding one real wheel of `tinydep` 1.0 (served by `serve`)."""
    wheel = root / "files" / f"{PACKAGE}-1.0-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{PACKAGE}/__init__.py", "VALUE = 1\n")
        archive.writestr(f"{PACKAGE}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n")
        archive.writestr(f"{PACKAGE}-1.0.dist-info/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{PACKAGE}-1.0.dist-info/RECORD", "")
    listing = root / "simple" / PACKAGE / "index.html"
    listing.parent.mkdir(parents=True)
    listing.write_text(f'<html><body><a href="../../files/{wheel.name}">{wheel.name}</a></body></html>\n')
    return root


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per request on the test's stderr."""


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[int, Any]]:
    """(port, start): the index's port, closed until `start()` serves it (the outage ends)."""
    root = package_index(tmp_path / "index")
    port = free_port()
    servers: list[http.server.ThreadingHTTPServer] = []

    def start() -> None:
        handler = functools.partial(QuietHandler, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)

    yield port, start
    for server in servers:
        server.shutdown()
        server.server_close()


def pip_download(port: int, into: Path) -> list[str]:
    """The build's network step: pip fetching `tinydep` from the index at `port` (one pip retry, so
    pip says what failed; --isolated: this host's pip configuration plays no part)."""
    return [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--retries", "1", "--timeout", "5",
            "--disable-pip-version-check", "-d", str(into), "-i", f"http://127.0.0.1:{port}/simple/", PACKAGE]


def local_evaluator(tmp_path: Path, build: list[str], retries: int) -> tuple[Evaluator, list[str]]:
    shas = make_linear_repo(tmp_path / "repo", 3, culprit=2,
                            files=lambda i: {"build.py": "import sys\nsys.exit(0)\n" if i != 1 else "import sys\n(\n"})
    builder = LocalBuilder(git.Repo(tmp_path / "repo"), tmp_path / "work", build)
    evaluator = Evaluator(builder, LocalExecutor(), tmp_path / "s", command=GOOD_CMD)
    evaluator.retry = RetryPolicy(retries, 0.05)
    return evaluator, shas


@pytest.mark.e2e
def test_a_build_the_index_fails_is_built_again_once_the_index_answers(tmp_path: Path, index) -> None:
    port, start = index
    evaluator, shas = local_evaluator(tmp_path, pip_download(port, tmp_path / "downloads"), retries=3)
    attempts: list[RetryRun] = []

    def on_retry(attempt: RetryRun) -> None:
        attempts.append(attempt)
        if len(attempts) == 2:
            start()  # the outage ends after the second failed attempt

    try:
        result = evaluator.evaluate(EvaluationRequest(shas[2], 1, on_retry=on_retry))
    finally:
        evaluator.close()
    assert result.verdict.kind == VerdictKind.BAD and result.build.how == "built"  # the commit judged, not skipped
    assert [(a.attempt, a.stage, a.kind) for a in attempts] == [(1, "build", "network"), (2, "build", "network")]
    assert all(f"could not reach 127.0.0.1:{port} (pip: NewConnectionError)" in a.cause for a in attempts)
    kept = [tmp_path / "s" / a.log for a in attempts]
    assert [p.name for p in kept] == [f"build-{shas[2][:12]}.attempt-1.log", f"build-{shas[2][:12]}.attempt-2.log"]
    assert all("Connection refused" in p.read_text() for p in kept)  # each attempt's own log
    assert (tmp_path / "downloads" / f"{PACKAGE}-1.0-py3-none-any.whl").is_file()


@pytest.mark.e2e
def test_a_build_that_never_reaches_its_index_stops_the_run_at_any_step(tmp_path: Path, index) -> None:
    port, _ = index
    evaluator, shas = local_evaluator(tmp_path, pip_download(port, tmp_path / "downloads"), retries=2)
    attempts: list[RetryRun] = []
    try:
        with pytest.raises(InfrastructureError) as stopped:  # a middle candidate, not an end
            evaluator.evaluate(EvaluationRequest(shas[1], 1, on_retry=attempts.append))
    finally:
        evaluator.close()
    assert [a.attempt for a in attempts] == [1, 2, 3]
    message = str(stopped.value)
    assert f"{shas[1][:12]} could not be built, 3 attempts failed on the network" in message
    assert f"could not reach 127.0.0.1:{port}" in message and "bisect-npu resume" in message
    kept = tmp_path / "s" / attempts[-1].log
    assert f"(build log: {kept})" in message and "Connection refused" in kept.read_text()  # where the log is now


@pytest.mark.e2e
def test_a_build_that_fails_on_its_own_code_is_a_skip_at_once(tmp_path: Path, index) -> None:
    """The commit's own breakage wins over a network warning earlier in the same build."""
    port, _ = index
    build = ["sh", "-c", '"$@" || true; exec python build.py', "build", *pip_download(port, tmp_path / "downloads")]
    evaluator, shas = local_evaluator(tmp_path, build, retries=3)
    attempts: list[RetryRun] = []
    try:
        result = evaluator.evaluate(EvaluationRequest(shas[1], 1, on_retry=attempts.append))
    finally:
        evaluator.close()
    assert attempts == []
    assert result.verdict.kind == VerdictKind.SKIP and result.verdict.reason.startswith("build failed")
    assert "SyntaxError" in result.build.log_tail and "Connection refused" in result.build.log_tail


def test_a_pull_is_retried_only_when_the_network_failed() -> None:
    refused = classify_build_failure("initializing source docker://quay.io/a/b:1: pinging container registry "
                                     "quay.io: Get \"https://quay.io/v2/\": dial tcp: connect: connection refused")
    denied = classify_build_failure("initializing source docker://quay.io/a/b:1: reading manifest 1 in quay.io/a/b: "
                                    "unauthorized: access to the requested resource is not authorized")
    full = classify_build_failure("write /var/lib/containers/x: no space left on device")
    assert refused is not None and isinstance(refused.error(), BuildUnreachable)
    assert denied is not None and not isinstance(denied.error(), BuildUnreachable)
    assert full is not None and not isinstance(full.error(), BuildUnreachable)


def test_an_unreachable_build_keeps_its_cause_across_processes(tmp_path: Path) -> None:
    error = BuildUnreachable(EnvironmentFailure("the build could not reach x", "check x", network=True),
                             tmp_path / "b.log")
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.failure, copy.log_path, copy.exit_code) == (str(error), error.failure, error.log_path, 5)


# -- whole sessions -------------------------------------------------------------------------------

def session_recipe(tmp_path: Path, recipe: str, port: int) -> Path:
    """The demo case's recipe whose local build first fetches a package from the index at `port`."""
    settings = yaml.safe_load(bundled_recipes()[recipe].read_text())
    settings["build"]["local_command"] = ["sh", "-c", '"$@" && exec python tools/build_kernels.py', "build",
                                          *pip_download(port, tmp_path / "downloads")]
    settings["trials"]["retry_backoff_s"] = 2.0
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(settings))
    return path


def journal(session: Path) -> list[dict[str, Any]]:
    path = session / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.e2e
def test_a_session_whose_index_comes_back_names_the_culprit_with_its_retries_journaled(demo_upstream, tmp_path,
                                                                                         index) -> None:
    repo, manifest = demo_upstream
    truth = manifest.case("rope-longseq")
    port, start = index
    session = tmp_path / "s"
    # From the culprit's fourth first-parent ancestor to the culprit: the outage, its retry and the
    # culprit as over the case's whole range, in fewer steps.
    good = git.Repo(repo).commit(f"{truth.culprit.sha}~4").hexsha
    run = subprocess.Popen([*CLI, "run", "--repo", str(repo), "--good", good, "--bad", truth.culprit.sha,
                            "--recipe", str(session_recipe(tmp_path, truth.recipe, port)), "--session", str(session),
                            "--no-fix", "--no-verdict-store", "--json"],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not any(r["type"] == "retry" for r in journal(session)):  # the first build met the outage
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.1)
    start()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, out[-2000:] + err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["culprit"] == truth.culprit.sha
    retries = [r for r in journal(session) if r["type"] == "retry"]
    assert [(r["attempt"], r["stage"], r["kind"]) for r in retries] == [(1, "build", "network")]
    steps = json.loads((session / "report.json").read_text())["steps"]
    retried = [s for s in steps if s["retries"]]
    assert len(retried) == 1 and retried[0]["commit"] == retries[0]["commit"]
    assert f"could not reach 127.0.0.1:{port}" in retried[0]["host_failures"][0]
    assert all(s["verdict"] != "skip" for s in steps)  # the outage cost no candidate its verdict


@pytest.mark.e2e
def test_a_session_whose_index_never_answers_stops_with_exit_5_naming_the_network(demo_upstream, tmp_path,
                                                                                  index) -> None:
    repo, manifest = demo_upstream
    truth = manifest.case("rope-longseq")
    port, _ = index
    recipe = session_recipe(tmp_path, truth.recipe, port)
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", truth.good_ref, "--bad", truth.bad_ref,
                           "--recipe", str(recipe), "--session", str(tmp_path / "s"), "--no-fix", "--no-verdict-store",
                           "--retries", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-3000:]
    assert "could not be built, 2 attempts failed on the network" in done.stderr
    assert f"could not reach 127.0.0.1:{port} (pip: NewConnectionError)" in done.stderr
    entries = journal(tmp_path / "s")
    assert [r["attempt"] for r in entries if r["type"] == "retry"] == [1, 2]
    assert not any(r["type"] == "step" for r in entries)  # no commit was judged on the outage


@pytest.mark.e2e
def test_build_attempts_journaled_before_an_interrupt_count_against_the_budget(tmp_path: Path, index) -> None:
    """Two attempts journaled, then the session was interrupted: with --retries 2 one more attempt
    is left, numbered 3; a run attempt's record at the same step is not the build's."""
    port, _ = index
    evaluator, shas = local_evaluator(tmp_path, pip_download(port, tmp_path / "downloads"), retries=2)
    before = (RetryRun(case_id="", trial=0, attempt=1, kind="network", cause="x", stage="build"),
              RetryRun(case_id="", trial=0, attempt=2, kind="network", cause="x", stage="build"),
              RetryRun(case_id="default", trial=0, attempt=1, kind="card_busy", cause="y"))
    attempts: list[RetryRun] = []
    try:
        with pytest.raises(InfrastructureError, match="could not be built, 3 attempts failed on the network"):
            evaluator.evaluate(EvaluationRequest(shas[2], 1, on_retry=attempts.append, retried=before))
    finally:
        evaluator.close()
    assert [a.attempt for a in attempts] == [3]
