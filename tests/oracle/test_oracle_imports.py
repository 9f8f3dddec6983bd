"""The oracles that compute with numpy are imported by the judging that needs them: reading a
recipe, listing the bundled ones or showing a session's report starts no numpy (each command
a test or a user starts pays for its imports), and judging still imports what it uses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

READ_RECIPE = ("import sys\n"
               "from bisect_npu.recipe.loader import load_recipe\n"
               "recipe = load_recipe('demo-async-penalty')\n"
               "assert recipe.oracle.kinds, 'no oracle kinds read'\n"
               "print('numpy' in sys.modules)\n")
JUDGE = ("import sys\n"
         "from bisect_npu import oracle\n"
         "from bisect_npu.recipe.loader import load_recipe\n"
         "print('numpy' in sys.modules, end=' ')\n"
         "oracle._judges()\n"
         "print(oracle.judge_accuracy.__module__, 'numpy' in sys.modules)\n")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_reading_a_recipe_imports_no_numpy() -> None:
    assert _run(READ_RECIPE) == "False"


def test_judging_imports_the_kinds_it_needs() -> None:
    assert _run(JUDGE) == "False bisect_npu.oracle.accuracy.judge True"


@pytest.mark.parametrize("argv", [["recipes", "list"], ["recipes", "show", "demo-async-penalty"]])
def test_commands_that_judge_nothing_import_no_numpy(argv: list[str]) -> None:
    code = ("import sys\nfrom bisect_npu.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('numpy' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "False"
