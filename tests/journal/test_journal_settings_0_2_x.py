"""Settings searches bisect-npu 0.2.x wrote (tests/data/journals/settings-0.2.x, settings header schema 1:
the request's fields copied into the header) still resume: a standalone `bisect-npu settings` and the
one `run --settings` made at its culprit, each cut as a kill mid-search leaves it, each finished by the
current code under the request its old header reads as, without running a finished configuration again.

Real journals, the demo upstream regenerated (the same shas), real builds and forward passes for the
configurations the cut journals lack.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.settings_journal import SETTINGS_FILE, read_settings
from tests.helpers.paths import DATA as TEST_DATA

pytestmark = pytest.mark.e2e

DATA = TEST_DATA / "journals" / "settings-0.2.x"
WRITTEN_AT = "/tmp/bisect-npu-0.2.x"  # where 0.2.x ran them: the journals name paths below it
AT = "cc37f87c04f0a87307e2cd59b46bb7d905c22b6b"  # v0.9.1 of the demo upstream
CULPRIT = "c2c849e90b307099bec315c73809730189b0951a"
GOOD_SET = ["cases[*].sampling.logprobs=3", "engine.args.async_scheduling=false",
            "environment.TINYVLLM_LOGGING_LEVEL=WARNING", "cases[*].sampling.top_p=0.9"]
CLI = [sys.executable, "-m", "bisect_npu"]


@pytest.fixture(scope="module")
def written_at(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory standing for 0.2.x's: the demo upstream regenerated in it."""
    from bisect_npu.demo.generate import generate_upstream

    root = tmp_path_factory.mktemp("settings-0.2.x")
    generate_upstream(root / "upstream", seed=0)
    return root


def placed(name: str, root: Path, where: Path) -> Path:
    """A copy of a stored session at `where`, its journals' paths moved to `root` (and the session
    directory's own to `where`) as a user who moved them would move them."""
    session = Path(shutil.copytree(DATA / name, where / name))
    for journal in [*session.rglob("*.jsonl")]:
        journal.write_text(journal.read_text().replace(f"{WRITTEN_AT}/{name}", str(session))
                           .replace(WRITTEN_AT, str(root)))
    return session


def cut(journal: Path, configurations: int) -> list[str]:
    """The journal as a kill after its first `configurations` configuration records leaves it (and a
    torn line); the digests of the configurations it keeps."""
    lines = journal.read_text().splitlines(keepends=True)
    kept = [i for i, line in enumerate(lines) if '"type":"configuration"' in line][configurations - 1]
    journal.write_text("".join(lines[:kept + 1]) + '{"type":"configuration_tri')
    return [json.loads(line)["digest"] for line in lines[1:kept + 1] if '"type":"configuration"' in line]


def configuration_digests(journal: Path) -> list[str]:
    return [json.loads(line)["digest"] for line in journal.read_text().splitlines()
            if '"type":"configuration"' in line]


def test_an_old_header_reads_as_its_request_and_level(written_at: Path, tmp_path: Path) -> None:
    session = placed("settings-async-penalty", written_at, tmp_path)
    read = read_settings(session)
    assert read is not None
    header, entries = read
    assert header.schema_version == 1 and header.commit == header.level.commit == AT
    request = header.request
    assert (request.range.repo, request.range.good, request.range.bad) == (str(written_at / "upstream"), AT, AT)
    assert (request.judge.recipe, request.judge.timeout_s, request.search.mode) == ("demo-async-penalty", 3600.0,
                                                                                   "exact")
    assert (request.executor.executor, request.executor.slots, request.store.verdict_store) == ("local", 1, None)
    assert [d.key for d in header.differences] == [s.partition("=")[0] for s in GOOD_SET]
    assert header.level.good_set == ['cases[*].sampling.logprobs=3', 'engine.args.async_scheduling=false',
                                     'environment.TINYVLLM_LOGGING_LEVEL="WARNING"', 'cases[*].sampling.top_p=0.9']
    assert len(entries) == 11


def test_a_0_2_x_settings_search_resumes(written_at: Path, tmp_path: Path) -> None:
    session = placed("settings-async-penalty", written_at, tmp_path)
    journal = session / SETTINGS_FILE
    written = configuration_digests(journal)
    header_line = journal.read_text().splitlines()[0]
    kept = cut(journal, len(written) - 1)  # killed before its last configuration: one left to run
    sets = [part for setting in GOOD_SET for part in ("--good-set", setting)]
    done = subprocess.run([*CLI, "settings", "--repo", str(written_at / "upstream"), "--at", "v0.9.1", "--recipe",
                           "demo-async-penalty", *sets, "--session", str(session), "--no-verdict-store", "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["trigger"] == ["engine.args.async_scheduling"]
    digests = configuration_digests(journal)
    assert digests[:len(kept)] == kept and sorted(digests) == sorted(written)  # none run twice, none missing
    assert journal.read_text().splitlines()[0] == header_line  # the old header stays as it was written


def test_a_0_2_x_run_settings_resumes_with_its_session(written_at: Path, tmp_path: Path) -> None:
    session = placed("run-settings-async-penalty", written_at, tmp_path)
    journal = session / "settings" / SETTINGS_FILE
    written = configuration_digests(journal)
    kept = cut(journal, len(written) - 1)
    done = subprocess.run([*CLI, "resume", "--session", str(session), "--json", "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == CULPRIT
    digests = configuration_digests(journal)
    assert digests[:len(kept)] == kept and sorted(digests) == sorted(written)
    found = json.loads((session / "report.json").read_text())["settings"]
    assert found["commit"] == CULPRIT and found["trigger"] == ["engine.args.async_scheduling"]
