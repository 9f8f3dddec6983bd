"""The Markdown report as the maintainer who receives the GitHub issue reads it, compared whole
with golden files, for sessions the demo ran (tests/data/sessions/README.md says how each was
made) and sessions built here for the kinds the demo has no case of (dumps, a stopped session).

The golden files are rendered from copies of the sessions; what differs from run to run (the
session's directory, this machine's name, the tool's version) is normalized. Set
BISECT_NPU_UPDATE_GOLDEN=1 to write them again after a deliberate change, and read the diff.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from bisect_npu import __version__
from bisect_npu.journal import Journal
from bisect_npu.level import CommitsLevel
from bisect_npu.observations import Observation, Verdict, VerdictKind
from bisect_npu.records import CandidateRange, EndRecord, HeaderRecord, StepRecord, TrialRun
from bisect_npu.report import load_view, note_stop, render_json, render_markdown
from bisect_npu.request import RunRequest
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import DATA

SESSIONS = DATA / "sessions"
GOLDEN = DATA / "reports"
DEMO_CASES = ["loop", "tokens", "acceptance", "loop-settings", "accuracy", "nightly"]
# The sections a maintainer reads, in order (a session shows those it has an answer for).
ORDER = ["The case", "Bad against good", "Culprit", "Settings", "Fix upstream", "Host", "Reproduce"]


def copied(name: str, tmp_path: Path) -> Path:
    session = tmp_path / "session"
    shutil.copytree(SESSIONS / name, session)
    journal = session / "journal.jsonl"  # a recipe file kept beside the journal is named from where it lies
    journal.write_text(journal.read_text().replace("@SESSION@", str(session)))
    return session


def normalized(markdown: str, session: Path) -> str:
    markdown = markdown.replace(str(session), "SESSION").replace(__version__, "VERSION")
    return re.sub(r"^- bisect-npu VERSION on .*$", "- bisect-npu VERSION on MACHINE", markdown, flags=re.M)


def check_golden(name: str, markdown: str) -> None:
    path = GOLDEN / f"{name}.md"
    if os.environ.get("BISECT_NPU_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(markdown, encoding="utf-8")
    assert markdown == path.read_text(encoding="utf-8"), f"{path.name} differs: BISECT_NPU_UPDATE_GOLDEN=1 rewrites it"


def outside_details(markdown: str) -> str:
    return re.sub(r"<details>.*?</details>", "", markdown, flags=re.S)


def machine_paths(session: Path) -> list[str]:
    """What names this machine: the session's directory, the home directory, the host's name, and
    the repository the session bisected (a path here)."""
    header = json.loads((session / "journal.jsonl").read_text().splitlines()[0])
    repo = header["request"]["range"]["repo"] or ""
    return [p for p in (str(session), str(Path.home()), repo if repo.startswith("/") else "") if p]


def assert_no_machine_path(markdown: str, session: Path) -> None:
    shown = outside_details(markdown)
    for path in machine_paths(session):
        assert path not in shown, path
    assert not re.search(rf"\b{re.escape(platform.node())}\b", shown)


@pytest.mark.parametrize("name", DEMO_CASES)
def test_the_demo_sessions_reports_match_their_golden_files(name: str, tmp_path: Path) -> None:
    session = copied(name, tmp_path)
    markdown = render_markdown(load_view(session))
    assert_no_machine_path(markdown, session)
    check_golden(name, normalized(markdown, session))


def headings(markdown: str) -> list[tuple[int, str]]:
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    return [(int(token.tag[1]), tokens[i + 1].content) for i, token in enumerate(tokens)
            if token.type == "heading_open"]


@pytest.mark.parametrize("name", DEMO_CASES)
def test_the_report_parses_into_the_sections_a_maintainer_reads_in_order(name: str, tmp_path: Path) -> None:
    session = copied(name, tmp_path)
    markdown = render_markdown(load_view(session))
    parser = MarkdownIt("commonmark").enable("table")
    tokens = parser.parse(markdown)
    found = headings(markdown)
    assert found[0][0] == 1 and found[0][1].startswith("bisect-npu report")
    sections = [text for level, text in found if level == 2 and text in ORDER]
    assert sections == sorted(sections, key=ORDER.index) and sections[0] == "The case"
    assert {"The case", "Culprit", "Host", "Reproduce"} <= set(sections)
    # The verdict is the first paragraph, bold, naming the culprit the journal found.
    culprit = load_view(session).end.culprit  # type: ignore[union-attr]
    first = next(t for t in tokens if t.type == "inline")
    second = tokens[[t.type for t in tokens].index("paragraph_open") + 1]
    assert first.content.startswith("bisect-npu report") and culprit[:12] in second.content
    assert next(c.type for c in second.children or [] if c.type != "text" or c.content) == "strong_open"
    # Tables render as tables (a stray pipe or a missing row break would turn them into text).
    assert sum(1 for t in tokens if t.type == "table_open") >= 2
    fences = {t.info: t.content for t in tokens if t.type == "fence"}
    assert fences["sh"].startswith("bisect-npu run ") and "--no-verdict-store" not in fences["sh"]
    # Every <details> closes: the tested commits fold away, and nothing after them is swallowed.
    html = "".join(t.content for t in tokens if t.type in ("html_block", "html_inline"))
    assert html.count("<details>") == html.count("</details>") >= 1


def test_the_bad_output_is_shown_against_the_good_aligned_at_the_first_difference(tmp_path: Path) -> None:
    session = copied("loop", tmp_path)
    view = load_view(session)
    block = render_markdown(view).split("## Bad against good")[1].split("```text\n")[1].split("```")[0]
    good, bad, caret = block.splitlines()
    column = caret.index("^")
    assert good[:column] == bad[:column].replace("bad:  ", "good: ") and good[column] != bad[column]
    culprit = next(s for s in view.steps if s.commit == view.end.culprit)  # type: ignore[union-attr]
    text = Observation.load(session / culprit.observations[0]).text
    assert bad.removeprefix("bad:  ").rstrip("…") in text.replace("\n", "\\n")


def commits_header(tmp_path: Path, **request: object) -> HeaderRecord:
    shas = [str(i) * 40 for i in range(1, 4)]
    return HeaderRecord(range=CandidateRange(kind="commits", good="0" * 40, bad=shas[-1], base="0" * 40,
                                             good_ref="v1", bad_ref="v2", candidates=shas,
                                             titles={sha: f"Change {i}" for i, sha in enumerate(shas, 1)}),
                        request=RunRequest.of(good="v1", bad="v2", repo=str(tmp_path / "upstream"), **request),
                        level=CommitsLevel())


def test_a_dumps_session_names_the_first_divergent_module(tmp_path: Path) -> None:
    """No demo case compares dumps: the session is built from the records a logits judge writes."""
    session = tmp_path / "session"
    first = {"name": "model.layers.3.mlp.down_proj.output.0", "index": 41, "step": 0, "layer": 3,
             "module": "model.layers.3.mlp.down_proj", "problem": "cosine 0.71 < 0.99", "rule": "cosine",
             "cosine": 0.71, "max_abs_error": 3.2}
    with Journal.create(session, commits_header(tmp_path, recipe="precision-alignment")) as journal:
        for index, kind in ((0, VerdictKind.GOOD), (3, VerdictKind.BAD), (2, VerdictKind.BAD), (1, VerdictKind.GOOD)):
            figures = {"first_divergent": first, "tensors_compared": 120} if index == 2 else {"tensors_compared": 120}
            sha = "0" * 40 if index == 0 else str(index) * 40
            journal.append(StepRecord(index=index, commit=sha, verdict=Verdict(kind=kind, figures=figures,
                                                                                reason=f"judged {kind.value}"),
                                      trials=[TrialRun(case_id="default", trial=0, outcome=kind)]))
        journal.append(EndRecord(status="found", culprit="2" * 40, index=2, message="first bad commit"))
    markdown = render_markdown(load_view(session))
    assert_no_machine_path(markdown, session)
    check_golden("dumps", normalized(markdown, session))
    assert ("The first divergent tensor at the culprit: **`model.layers.3.mlp.down_proj.output.0`** (module "
            "`model.layers.3.mlp.down_proj`), layer 3, step 0: cosine 0.71 < 0.99 [cosine rule]") in markdown


@pytest.mark.parametrize(("code", "reason"), [(5, "accuracy harness failed: harness lm_eval is not installed"),
                                              (2, "the recipe at 2222222: field cases.0.sampling.max_tokens")])
def test_a_stopped_session_says_stopped_and_why_in_both_reports(tmp_path: Path, code: int, reason: str) -> None:
    session = tmp_path / "session"
    with Journal.create(session, commits_header(tmp_path, command=["true"])) as journal:
        journal.append(StepRecord(index=3, commit="3" * 40, verdict=Verdict(kind=VerdictKind.BAD, reason="exit 1")))
    assert render_json(load_view(session))["status"] == "running"
    note_stop(session, reason, code)
    view = load_view(session)
    summary = render_json(view)
    assert summary["status"] == "stopped" and summary["stopped"] == {"exit_code": code, "reason": reason}
    markdown = render_markdown(view)
    assert f"**Session stopped (exit {code}) before an answer**: {reason}." in markdown
    assert "still running" not in markdown
    with Journal.open(session) as journal:  # resumed: a step journaled since, the stop no longer holds
        journal.append(StepRecord(index=0, commit="0" * 40, verdict=Verdict(kind=VerdictKind.GOOD, reason="exit 0")))
    assert render_json(load_view(session))["status"] == "running"


def test_a_run_aborted_by_its_command_reports_stopped_with_exit_5_and_no_path_of_the_machine(tmp_path: Path) -> None:
    """`git bisect run` aborts on an exit above 127; so does `run`, and its report says so."""
    make_linear_repo(tmp_path / "repo", 4)
    session = tmp_path / "session"
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "run", "--repo", str(tmp_path / "repo"),
                           "--good", "HEAD~3", "--bad", "HEAD", "--cmd", "sh -c 'exit 255'", "--session", str(session),
                           "--no-verdict-store", "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 5, done.stderr
    summary = json.loads((session / "report.json").read_text())
    assert summary["status"] == "stopped" and summary["stopped"]["exit_code"] == 5
    assert "command exited 255" in summary["stopped"]["reason"]
    markdown = (session / "report.md").read_text()
    assert "**Session stopped (exit 5) before an answer**: command exited 255" in markdown
    assert "see SESSION/steps/" in markdown
    assert_no_machine_path(markdown, session)
