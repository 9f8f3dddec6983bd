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
