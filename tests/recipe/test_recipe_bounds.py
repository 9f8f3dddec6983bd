"""Every number of a recipe has a range, and `recipes validate` refuses what a run could not carry
(an environment entry the OS would refuse, a NUL byte, a count that overflows); a session a bug
stopped says so in its report, and resume continues it."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel

from bisect_npu.recipe import schema as recipe_module
from bisect_npu.recipe.loader import bundled_recipes
from bisect_npu.recipe.schema import Recipe
from tests.helpers.gitrepo import GOOD_CMD, make_linear_repo

CLI = [sys.executable, "-m", "bisect_npu"]
BASE = yaml.safe_load(bundled_recipes()["qwen3-repetition-penalty-async"].read_text(encoding="utf-8"))


def validate(tmp_path: Path, raw: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`bisect-npu recipes validate` on `raw` through the console entry point, in this process (a
    traceback would reach stderr as it would a terminal's): its exit code and stderr."""
    from bisect_npu.cli import main

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True), encoding="utf-8")
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(["recipes", "validate", str(path)])
    return int(ended.value.code or 0), capsys.readouterr().err


def with_value(path: tuple[Any, ...], value: object) -> dict[str, Any]:
    raw = json.loads(json.dumps(BASE))
    node = raw
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    node[path[-1]] = value
    return raw


@pytest.mark.parametrize(("path", "value", "said"), [
    (("environment",), {"A=B": "x"}, "'A=B' is not a variable name"),
    (("environment",), {"": "x"}, "is not a variable name"),
    (("environment",), {"A": "x\0y"}, "holds a NUL byte"),
    (("cases", 0, "prompt"), "a\0b", "holds a NUL byte"),
    (("trials", "count"), 10**32, "does not fit in 64 bits"),
    (("trials", "count"), 10_001, "less than or equal to 10000"),
    (("cases", 0, "sampling", "max_tokens"), 10**21, "does not fit in 64 bits"),
    (("cases", 0, "sampling", "max_tokens"), 2**31, "less than or equal to 2147483647"),
    (("cases", 0, "sampling", "seed"), 2**40, "less than or equal to 2147483647"),
    (("cases", 0, "sampling", "presence_penalty"), 3.0, "less than or equal to 2"),
    (("trials", "load_cost"), float("inf"), "inf is not a finite number"),
    (("engine", "args", "tensor_parallel_size"), 10**6, "a whole number of cards from 1 to 4096"),
])
def test_validate_refuses_what_a_run_could_not_carry(tmp_path: Path, path: tuple[Any, ...], value: object,
                                                     said: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, stderr = validate(tmp_path, with_value(path, value), capsys)
    assert code == 2, stderr
    assert said in stderr and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_the_bundled_recipes_are_within_the_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, path in bundled_recipes().items():
        code, stderr = validate(tmp_path, yaml.safe_load(path.read_text(encoding="utf-8")), capsys)
        assert code == 0, (name, stderr)


def _numeric(annotation: Any) -> bool:
    inner = [arg for arg in get_args(annotation) if arg is not type(None)] if isinstance(
        annotation, types.UnionType) or get_args(annotation) else [annotation]
    return any(arg in (int, float) for arg in inner)


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    seen.add(model)
    for field in model.model_fields.values():
        for arg in [field.annotation, *get_args(field.annotation)]:
            for inner in [arg, *get_args(arg)]:
                if isinstance(inner, type) and issubclass(inner, BaseModel) and inner not in seen \
                        and inner.__module__ == recipe_module.__name__:
                    _models(inner, seen)


def test_every_number_of_the_recipe_models_has_a_range() -> None:
    """Each int or float field of the recipe schema's models is bounded below and above (the page
    docs/reference/recipe.md shows both); a new field without them fails here."""
    models: set[type[BaseModel]] = set()
    _models(Recipe, models)
    unbounded = []
    for model in models:
        for name, field in model.model_fields.items():
            if not _numeric(field.annotation):
                continue
            kinds = {type(item) for item in field.metadata}
            if not (kinds & {Ge, Gt} and kinds & {Le, Lt}):
                unbounded.append(f"{model.__name__}.{name}")
    assert not unbounded, f"fields without a range: {unbounded}"


@pytest.mark.e2e  # a session, and its resume in a subprocess
def test_a_session_a_bug_stopped_says_so_and_resume_continues(tmp_path: Path, monkeypatch) -> None:
    """A bug (here an OverflowError the search raises on its third decision) ends the run with
    its traceback; the report says the session crashed, not that it is still running."""
    from bisect_npu import cli, search
    from bisect_npu.cli import main

    monkeypatch.setattr(cli, "_session", [])  # the session main() notes stays this test's

    repo = tmp_path / "repo"
    shas = make_linear_repo(repo, 17, culprit=9)
    session = tmp_path / "s"
    decide, calls = search.decide, []

    def overflowing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise OverflowError("int too large to convert to float")
        return decide(*args, **kwargs)

    monkeypatch.setattr(search, "decide", overflowing)
    with pytest.raises(SystemExit) as stopped:
        main(["run", "--repo", str(repo), "--good", shas[0], "--bad", shas[16], "--cmd", " ".join(GOOD_CMD),
              "--no-fix", "--no-verdict-store", "--session", str(session)])
    assert stopped.value.code == 1
    report = json.loads((session / "report.json").read_text())
    assert report["status"] == "crashed"
    text = (session / "report.md").read_text()
    assert "Session crashed" in text and "OverflowError: int too large" in text and "still running" not in text

    monkeypatch.setattr(search, "decide", decide)
    done = subprocess.run([*CLI, "resume", "--session", str(session), "--json"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads((session / "report.json").read_text())["status"] == "found"
