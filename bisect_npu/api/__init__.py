"""The library surface of bisect-npu: what a Python program may import and rely on. Everything
else in the package is internal and may change between releases.

    from bisect_npu.api import bisect

    def oracle(checkout: Path, commit: str) -> bool:   # True: good, False: bad
        return "NaN" not in subprocess.run([...], cwd=checkout, capture_output=True, text=True).stdout

    result = bisect("path/to/clone", "v0.9.0", "main", oracle=oracle)
    print(result.culprit, result.report)

The oracle is a recipe (its path, a bundled recipe's name, or a loaded Recipe), a command (an
argument list, or one string split as `--cmd` splits it: exit 0 good, 125 skip, 1-127 bad), or
any callable implementing `Oracle`. A session driven by a callable is resumed by calling
`bisect` again with the same `session_dir` and the callable: the journal cannot hold it, so
`bisect-npu resume` refuses such a session.

Each `bisect-npu` command is a call here that returns a typed answer (the command prints it):
`bisect`/`resume` (run, resume), `plan`, `simulate`, `fix`, `judge`, `render_report` (report),
`doctor`, `list_recipes`/`validate_recipes`/`check_recipe_at`/`recipe_plan`/`recipe_lws`/`import_nightly`/
`survey_nightly` (recipes), `search_settings` (settings), `demo_upstream`/`demo_cases`/
`run_demo_case` (demo), `ci_bisect`/`ci_issue`/`ci_comment` (ci) and `record`/`align` (record,
align). The heavy rooms they use are imported when they are called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bisect_npu.alignment.record import Record, record_command
    from bisect_npu.api.alignment import align, record
    from bisect_npu.api.bisection import OracleSpec, Result, bisect, judge, plan_range, propose_fixes, resume
    from bisect_npu.api.ci import BisectComment, ci_bisect, ci_comment, ci_issue
    from bisect_npu.api.demo import DemoCase, DemoOutcome, DemoUpstream, demo_cases, demo_upstream, run_demo_case
    from bisect_npu.api.fixes import Fixes, fix
    from bisect_npu.api.host_checks import Check, Doctor, doctor
    from bisect_npu.api.planning import Plan, Simulation, plan, simulate
    from bisect_npu.api.recipes import (
        ImportedRecipe,
        RecipeAtRef,
        RecipeEntry,
        Validation,
        check_recipe_at,
        import_nightly,
        list_recipes,
        recipe_lws,
        recipe_plan,
        survey_nightly,
        validate_recipes,
    )
    from bisect_npu.api.reports import render_report
    from bisect_npu.api.settings import SettingsOutcome, search_settings
    from bisect_npu.builders.cache import parse_size
    from bisect_npu.ci import BisectInputs
    from bisect_npu.errors import BisectError, InfrastructureError, UsageError
    from bisect_npu.execute.ascend import parse_devices
    from bisect_npu.execute.inprocess import Oracle, OracleAnswer
    from bisect_npu.fix import FixReport
    from bisect_npu.forecast.plan import RangePlan
    from bisect_npu.journal import session_named
    from bisect_npu.observations import VERDICT_EXIT, Observation, Verdict, VerdictKind
    from bisect_npu.orchestration.opening.preflight import command_words
    from bisect_npu.recipe.loader import load_recipe
    from bisect_npu.recipe.schema import Recipe
    from bisect_npu.request import (
        ExecutorSpec,
        FixSpec,
        JudgeSpec,
        RangeSpec,
        RunRequest,
        SearchSpec,
        StoreSpec,
    )

# Where each name lives: `api.X` imports X's module on first use, so a command that needs the
# settings search does not also import the alignment's, and each command starts with what it uses.
_HOMES: dict[str, str] = {
    "align": "bisect_npu.api.alignment",
    "bisect": "bisect_npu.api.bisection",
    "BisectComment": "bisect_npu.api.ci",
    "BisectError": "bisect_npu.errors",
    "BisectInputs": "bisect_npu.ci",
    "Check": "bisect_npu.api.host_checks",
    "check_recipe_at": "bisect_npu.api.recipes",
    "ci_bisect": "bisect_npu.api.ci",
    "ci_comment": "bisect_npu.api.ci",
    "ci_issue": "bisect_npu.api.ci",
    "command_words": "bisect_npu.orchestration.opening.preflight",
    "demo_cases": "bisect_npu.api.demo",
    "demo_upstream": "bisect_npu.api.demo",
    "DemoCase": "bisect_npu.api.demo",
    "DemoOutcome": "bisect_npu.api.demo",
    "DemoUpstream": "bisect_npu.api.demo",
    "Doctor": "bisect_npu.api.host_checks",
    "doctor": "bisect_npu.api.host_checks",
    "ExecutorSpec": "bisect_npu.request",
    "fix": "bisect_npu.api.fixes",
    "Fixes": "bisect_npu.api.fixes",
    "FixReport": "bisect_npu.fix",
    "FixSpec": "bisect_npu.request",
    "import_nightly": "bisect_npu.api.recipes",
    "ImportedRecipe": "bisect_npu.api.recipes",
    "InfrastructureError": "bisect_npu.errors",
    "judge": "bisect_npu.api.bisection",
    "JudgeSpec": "bisect_npu.request",
    "list_recipes": "bisect_npu.api.recipes",
    "load_recipe": "bisect_npu.recipe.loader",
    "Observation": "bisect_npu.observations",
    "Oracle": "bisect_npu.execute.inprocess",
    "OracleAnswer": "bisect_npu.execute.inprocess",
    "OracleSpec": "bisect_npu.api.bisection",
    "parse_devices": "bisect_npu.execute.ascend",
    "parse_size": "bisect_npu.builders.cache",
    "Plan": "bisect_npu.api.planning",
    "plan": "bisect_npu.api.planning",
    "plan_range": "bisect_npu.api.bisection",
    "propose_fixes": "bisect_npu.api.bisection",
    "RangePlan": "bisect_npu.forecast.plan",
    "RangeSpec": "bisect_npu.request",
    "Recipe": "bisect_npu.recipe.schema",
    "recipe_lws": "bisect_npu.api.recipes",
    "recipe_plan": "bisect_npu.api.recipes",
    "RecipeAtRef": "bisect_npu.api.recipes",
    "RecipeEntry": "bisect_npu.api.recipes",
    "Record": "bisect_npu.alignment.record",
    "record": "bisect_npu.api.alignment",
    "record_command": "bisect_npu.alignment.record",
    "render_report": "bisect_npu.api.reports",
    "Result": "bisect_npu.api.bisection",
    "resume": "bisect_npu.api.bisection",
    "run_demo_case": "bisect_npu.api.demo",
    "RunRequest": "bisect_npu.request",
    "search_settings": "bisect_npu.api.settings",
    "SearchSpec": "bisect_npu.request",
    "session_named": "bisect_npu.journal",
    "SettingsOutcome": "bisect_npu.api.settings",
    "simulate": "bisect_npu.api.planning",
    "Simulation": "bisect_npu.api.planning",
    "StoreSpec": "bisect_npu.request",
    "survey_nightly": "bisect_npu.api.recipes",
    "UsageError": "bisect_npu.errors",
    "validate_recipes": "bisect_npu.api.recipes",
    "Validation": "bisect_npu.api.recipes",
    "Verdict": "bisect_npu.observations",
    "VERDICT_EXIT": "bisect_npu.observations",
    "VerdictKind": "bisect_npu.observations",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "VERDICT_EXIT",
    "BisectComment",
    "BisectError",
    "BisectInputs",
    "Check",
    "DemoCase",
    "DemoOutcome",
    "DemoUpstream",
    "Doctor",
    "ExecutorSpec",
    "FixReport",
    "FixSpec",
    "Fixes",
    "ImportedRecipe",
    "InfrastructureError",
    "JudgeSpec",
    "Observation",
    "Oracle",
    "OracleAnswer",
    "OracleSpec",
    "Plan",
    "RangePlan",
    "RangeSpec",
    "Recipe",
    "RecipeAtRef",
    "RecipeEntry",
    "Record",
    "Result",
    "RunRequest",
    "SearchSpec",
    "SettingsOutcome",
    "Simulation",
    "StoreSpec",
    "UsageError",
    "Validation",
    "Verdict",
    "VerdictKind",
    "align",
    "bisect",
    "check_recipe_at",
    "ci_bisect",
    "ci_comment",
    "ci_issue",
    "command_words",
    "demo_cases",
    "demo_upstream",
    "doctor",
    "fix",
    "import_nightly",
    "judge",
    "list_recipes",
    "load_recipe",
    "parse_devices",
    "parse_size",
    "plan",
    "plan_range",
    "propose_fixes",
    "recipe_lws",
    "recipe_plan",
    "record",
    "record_command",
    "render_report",
    "resume",
    "run_demo_case",
    "search_settings",
    "session_named",
    "simulate",
    "survey_nightly",
    "validate_recipes",
]
