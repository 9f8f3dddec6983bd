"""What a vllm-ascend nightly run leaves where it ran, read as an end's earlier results.

The nightly's single-node test runs AISBench from its checkout without a work directory
(`tools/aisbench.py`), so each benchmark is one run directory `outputs/default/<TIMESTAMP>/`
(`results/<model abbr>/<dataset abbr>.json`, `predictions/...`), and it writes
`benchmark_results/<job>.json`: the model it served, `vllm_ascend_version` (the commit it ran at,
`git rev-parse HEAD` in its workflow) and, per benchmark, the dataset's name (its `dataset_path`
after the owner) and `test_input` (`max_out_len`, `batch_size`). The run gives the per-sample
outcomes; the JSON is checked against the case the end runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bisect_npu.probe.harness import HarnessError, aisbench
from bisect_npu.recipe.schema import Recipe

RUNS_UNDER = ("", "*", "outputs/default/*", "outputs/*")  # where a run directory may lie under the path given
_SHA = re.compile(r"[0-9a-fA-F]{7,40}")


def aisbench_run(path: Path) -> Path:
    """The one AISBench accuracy run `path` names: itself, the one in it, or the one under its
    `outputs/default` (the nightly's checkout); none or several is a HarnessError saying which."""
    for pattern in RUNS_UNDER:
        found = [run for run in ([path] if not pattern else sorted(path.glob(pattern))) if (run / "results").is_dir()]
        if len(found) == 1:
            return found[0]
        if found:
            raise HarnessError(f"{path} holds {len(found)} AISBench runs ({', '.join(run.name for run in found)}); "
                               f"give the one of this benchmark, e.g. {found[-1]}")
    raise HarnessError(f"{path} holds no AISBench run (a TIMESTAMP directory with results/ in it, as the nightly "
                       "leaves under outputs/default)")


def read_run(run: Path, ids: list[str]) -> list[dict[str, Any]]:
    """The run's per-sample outcomes (AISBench's own files, read as a trial's are)."""
    try:
        return aisbench.read_samples(str(run.parent), ids, model="*", run=run.name)
    except aisbench.NoDetails:
        raise HarnessError(f"{run} holds AISBench's aggregate score only (the nightly runs it without "
                           "--dump-eval-details); score its predictions again where it ran: move its results/ "
                           "aside, run `ais_bench` with the nightly's --models and --datasets and "
                           f"`-m eval --reuse {run.name} --dump-eval-details`") from None


def benchmark_files(path: Path) -> list[Path]:
    """The nightly's `benchmark_results/*.json` beside the run `path` names: in `path` (the
    checkout it ran in) or above the run's `outputs/default`."""
    try:
        run = aisbench_run(path)
    except HarnessError:
        return []
    for root in (path, run.parent.parent.parent):
        files = sorted((root / "benchmark_results").glob("*.json"))
        if files:
            return files
    return []


def nightly_differences(path: Path, recipe: Recipe, commit: str) -> list[str]:
    """What the nightly's benchmark JSON says its run was that this end's case is not: the
    commit, the model, the dataset, the output length and batch size (nothing without a JSON)."""
    spec = recipe.accuracy
    files = benchmark_files(path)
    if spec is None or not files:
        return []
    dataset = Path(spec.dataset).as_posix()
    matched = [(file, doc, task) for file in files for doc in [_load(file)] for task in _tasks(doc)
               if task.get("name") and (dataset == task["name"] or dataset.endswith("/" + str(task["name"])))]
    if not matched:
        return [f"no benchmark in {', '.join(file.name for file in files)} is of this case's dataset {dataset}"]
    file, doc, task = matched[0]
    said = []
    version = str(doc.get("vllm_ascend_version") or "")
    if _SHA.fullmatch(version) and not commit.startswith(version.lower()):
        said.append(f"the nightly ran at {version[:12]} ({file.name}), this end is {commit[:12]}")
    model = str(doc.get("model_name") or "")
    if model and recipe.model.path != model and not recipe.model.path.endswith("/" + model):
        said.append(f"the nightly served {model}, the case's model is {recipe.model.path}")
    test_input = task.get("test_input")
    given: dict[str, Any] = test_input if isinstance(test_input, dict) else {}
    ours = {"max_out_len": spec.sampling.max_tokens, "batch_size": spec.aisbench.batch_size if spec.aisbench else None}
    for key, value in ours.items():
        if value is not None and given.get(key) is not None and given[key] != value:
            said.append(f"the nightly's {key} was {given[key]}, the case's is {value}")
    return said


def _load(file: Path) -> dict[str, Any]:
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _tasks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    tasks = doc.get("tasks")
    return [task for task in tasks if isinstance(task, dict)] if isinstance(tasks, list) else []
