"""The docs cannot rot quietly: the recipe reference matches the models, and the README stays a
newcomer's page (short, no benchmark tables, links that resolve). `make docs` builds the site
with --strict for the pages' own links."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import pytest

from bisect_npu import __version__
from bisect_npu.recipe.schema import EngineSpec
from tests.helpers.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
CHANGELOG = REPO_ROOT / "CHANGELOG.md"

# A measured figure: a number with a time, size, speed-up or share unit ("5.15 s", "1.0 GB", "27.1x", "99.3%").
FIGURE = re.compile(r"\b\d[\d.,]*\s*(?:(?:ms|µs|s|min|h|GB|GiB|MB|MiB|x)\b|%)")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("recipe_reference", REPO_ROOT / "docs" / "recipe_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recipe_reference_matches_the_models() -> None:
    generator = _generator()
    committed = generator.PAGE.read_text(encoding="utf-8")
    assert generator.render() == committed, "docs/reference/recipe.md is stale: run python docs/recipe_reference.py"


def test_recipe_reference_shows_each_field_with_its_default_and_description(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = _generator()
    page = generator.render()
    assert "| `loop_guard` | \"engine\" \\| \"probe\" | `\"engine\"` | who stops a loop early" in page
    assert "## `trials.earlier_runs`" in page and "## `cases[].sampling`" in page
    # A changed default shows on the page, so the committed page would then be stale.
    monkeypatch.setattr(EngineSpec.model_fields["port"], "default", 9000)
    assert "| `port` | int | `9000` |" in generator.render()


def _tables(text: str) -> list[list[list[str]]]:
    """Markdown tables outside code: each a list of rows of cells (the separator row dropped)."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    in_fence = False
    for line in [*text.splitlines(), ""]:
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(set(cell) <= set("-: ") for cell in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def _figure_tables(text: str) -> list[list[str]]:
    """The header rows of tables that hold measured figures."""
    return [table[0] for table in _tables(text) if any(FIGURE.search(cell) for row in table for cell in row)]


def test_readme_is_short_and_holds_no_benchmark_table() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    assert _figure_tables(text) == [], "benchmark figures belong on docs/benchmarks.md"


def test_a_benchmark_table_is_recognised() -> None:
    table = ("| run | full build | overlay |\n|---|---|---|\n| `pip install -e` | 5.15 s | 0.19 s |\n\n"
             "| N | mean rounds |\n|---|---|\n| 32 | 7.00 |\n")
    assert _figure_tables(table) == [["run", "full build", "overlay"]]


def test_readme_prose_lines_fit_and_its_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and not line.startswith("    "):
            assert len(line) <= 120, line
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into docs/"
    for target in local:
        assert (REPO_ROOT / target).is_file(), target


def test_the_changelog_opens_with_the_package_version() -> None:
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\b", CHANGELOG.read_text(encoding="utf-8"), re.MULTILINE)
    assert versions and versions[0] == __version__, "a new version gets its CHANGELOG.md section first"
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
