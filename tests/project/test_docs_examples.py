"""The shell examples of the README, getting-started and the guides cannot drift from the tool:
each is marked (an HTML comment just before it) as run here, or as needing what this machine
lacks, and the ones run here run.

Markers: `<!-- example: runs -->` (each `bisect-npu` line runs and exits 0; `<demo-upstream>` is
the generated demo upstream), `<!-- example: demo-settings -->` (a settings search on the demo:
its good variant is the one tests/orchestration/test_settings_demo.py runs for that case), `<!-- example:
synopsis -->` (a command's shape, with [optional] parts), and `<!-- example: needs X -->` for X
in an NPU host, a Docker daemon, the network, a vllm-ascend clone, minutes (`make demo`).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from bisect_npu.demo.generate import CASES, SAME_REGRESSION, SETTINGS
from tests.helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
NEEDS = {"an NPU host", "a Docker daemon", "the network", "a vllm-ascend clone", "minutes"}
MARKER = re.compile(r"<!--\s*example:\s*(.+?)\s*-->")
COMMANDS = ("bisect-npu", "make", "git", "pip", "python", "bash", "docker", "podman", "export", "ray", "cd")
NUMBERS = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def examples(page: Path) -> list[tuple[str | None, str, int]]:
    """(marker, text, line) of each code block that is a shell example: its first command line
    starts with a program a reader would type (output samples and YAML are not examples)."""
    tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
    found = []
    for i, token in enumerate(tokens):
        if token.type not in ("code_block", "fence") or token.info not in ("", "sh", "bash", "console", "shell"):
            continue
        lines = [line.strip() for line in token.content.splitlines() if line.strip()]
        first = next((line for line in lines if not line.startswith("#")), "")
        if not first.startswith(COMMANDS) or first.startswith("bisect-npu:"):
            continue
        before = tokens[i - 1] if i else None
        marker = MARKER.search(before.content) if before is not None and before.type == "html_block" else None
        found.append((marker.group(1) if marker else None, token.content, (token.map or [0])[0] + 1))
    return found


def commands(text: str) -> list[list[str]]:
    """The `bisect-npu` command lines of a block as argument lists (continuations joined, comments cut)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip().startswith("bisect-npu")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_shell_example_is_run_here_or_marked_with_what_it_needs(page: Path) -> None:
    for marker, text, line in examples(page):
        where = f"{page.relative_to(ROOT)}:{line}: {text.splitlines()[0]}"
        assert marker is not None, f"{where}: mark it <!-- example: runs --> or <!-- example: needs ... -->"
        assert marker in ("runs", "demo-settings", "synopsis") or (
            marker.startswith("needs ") and marker.removeprefix("needs ") in NEEDS), f"{where}: unknown {marker!r}"


def marked(kind: str) -> list[tuple[Path, str, int]]:
    return [(page, text, line) for page in PAGES for marker, text, line in examples(page) if marker == kind]


def test_the_examples_marked_runs_run(demo_upstream: tuple[Path, object], tmp_path: Path) -> None:
    repo = demo_upstream[0]
    ran = 0
    for page, text, line in marked("runs"):
        for argv in commands(text):
            argv = [str(repo) if word == "<demo-upstream>" else word for word in argv]
            done = subprocess.run([sys.executable, "-m", "bisect_npu", *argv[1:]], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=120, check=False)
            assert done.returncode == 0, f"{page.relative_to(ROOT)}:{line}: {shlex.join(argv)}\n{done.stderr[-2000:]}"
            ran += 1
    assert ran >= 3


def test_the_settings_examples_on_the_demo_are_the_searches_its_tests_run() -> None:
    """A settings search on the demo takes minutes: tests/orchestration/test_settings_demo.py runs each case's
    good variant (bisect_npu.demo.generate.SETTINGS); a documented one must be one of them."""
    seen = 0
    for page, text, line in marked("demo-settings"):
        for argv in commands(text):
            case = argv[argv.index("--recipe") + 1].removeprefix("demo-")
            given = {argv[i + 1] for i, word in enumerate(argv) if word == "--good-set"}
            good, _ = SETTINGS[case]
            assert given == {f"{key}={_yaml(value)}" for key, value in good.items()}, f"{page.name}:{line}"
            assert argv[argv.index("--repo") + 1] == "<demo-upstream>", f"{page.name}:{line}"
            seen += 1
    assert seen >= 2


def _yaml(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_the_demo_is_counted_alike_everywhere() -> None:
    """README and getting-started count the demo's seeded regressions and cases as the generator does."""
    regressions, cases = len(CASES) - len(SAME_REGRESSION), len(CASES)
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = " ".join(page.read_text(encoding="utf-8").split())
        assert f"{NUMBERS[regressions]} seeded regressions" in text, page.name
        assert f"{NUMBERS[cases]} demo cases" in text, page.name
        assert not re.search(r"bisect-npu \d+\.\d+\.\d+", text), f"{page.name}: a version belongs to the package alone"


def test_the_index_lists_every_page() -> None:
    docs = ROOT / "docs"
    index = (docs / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#]+\.md)", index))
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")} - {"index.md"}
    assert pages - linked == set()
