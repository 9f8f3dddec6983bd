"""What a vllm-ascend nightly run leaves where it ran, read as an end's earlier results.

The nightly's single-node test runs AISBench from its checkout without a work directory
(`tools/aisbench.py`), so each benchmark is one run directory `outputs/default/<TIMESTAMP>/`
(`results/<model abbr>/<dataset abbr>.json`, `predictions/...`), and it writes
`benchmark_results/<job>.json`: the model it served, `vllm_ascend_version` (the commit it ran at,
`git rev-parse HEAD` in its workflow) and, per benchmark, the dataset's name (its `dataset_path`
after the owner) and `test_input` (`max_out_len`, `batch_size`). The run gives the per-sample
outcomes; the JSON is checked against the case the end runs. A performance benchmark's task holds
AISBench's figures under the nightly's names, units stripped: its `Output_Token_Throughput(OTT)`
is the end's throughput (`--nightly-result END=PATH`).

The multi-node test writes the same JSON on its master node (tasks named by the same rule, the
same metric names, `num_warmups` among the test inputs), as `<branch>-<job>.json`, which its
workflow uploads alone in an artifact folder. Its `vllm_ascend_version` is the ref the run was
given: a branch (`main`) unless it was dispatched at a commit, so only then is it checked against
the end's commit (the value is read saying its commit is unknown). Several such files in one folder
are named after the workflow's matrix, not the case: they are told apart by their `model_name`.
Whichever file is read, a `model_name` that names another model than the case's is refused: its
task may share the case's dataset and inputs, but it is another case's run. The accuracy path
(`--earlier-results`) refuses one alike, before anything runs; its other differences (the commit,
the inputs) only set the results aside.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_npu.errors import UsageError
from bisect_npu.oracle.throughput import UNITS
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
    commit, the dataset, the output length and batch size (nothing without a JSON). A JSON whose
    `model_name` names another model than the case's is refused (`check_nightly_model`), not
    listed: that run is another case's at any commit."""
    spec = recipe.accuracy
    files = benchmark_files(path)
    if spec is None or not files:
        return []
    matched = _of_dataset(files, spec.dataset)
    if not matched:
        return [f"no benchmark in {', '.join(file.name for file in files)} is of this case's dataset "
                f"{Path(spec.dataset).as_posix()}"]
    file, doc, task = matched[0]
    _check_model(file, doc, recipe.name, recipe.model.path, **ACCURACY_REFUSED)
    said = []
    version = _version(doc)
    if _SHA.fullmatch(version) and not commit.startswith(version.lower()):
        said.append(f"the nightly ran at {version[:12]} ({file.name}), this end is {commit[:12]}")
    test_input = task.get("test_input")
    given: dict[str, Any] = test_input if isinstance(test_input, dict) else {}
    ours = {"max_out_len": spec.sampling.max_tokens, "batch_size": spec.aisbench.batch_size if spec.aisbench else None}
    for key, value in ours.items():
        if value is not None and given.get(key) is not None and given[key] != value:
            said.append(f"the nightly's {key} was {given[key]}, the case's is {value}")
    return said


ACCURACY_REFUSED = {"what": "its results are", "give": "the checkout", "flag": "--earlier-results END=COMMIT:PATH"}


def check_nightly_model(path: Path, recipe: Recipe) -> None:
    """Refuse a nightly's accuracy outputs whose benchmark JSON (its entry for the case's dataset)
    names another model than the case's, before anything runs: its run may share the dataset and
    inputs, but it is another case's, at any commit (as `--nightly-result` refuses one). A JSON
    naming no model, or no JSON beside the run, is read, its model unchecked."""
    spec = recipe.accuracy
    matched = _of_dataset(benchmark_files(path), spec.dataset) if spec is not None else []
    if matched:
        file, doc, _ = matched[0]
        _check_model(file, doc, recipe.name, recipe.model.path, **ACCURACY_REFUSED)


def _of_dataset(files: list[Path], dataset: str) -> list[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """Each (file, JSON, task) of the nightly's benchmark files whose task is of `dataset`."""
    name = Path(dataset).as_posix()
    return [(file, doc, task) for file in files for doc in [_load(file)] for task in _tasks(doc)
            if task.get("name") and (name == task["name"] or name.endswith("/" + str(task["name"])))]


def _load(file: Path) -> dict[str, Any]:
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _tasks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    tasks = doc.get("tasks")
    return [task for task in tasks if isinstance(task, dict)] if isinstance(tasks, list) else []


OTT = "Output_Token_Throughput(OTT)"  # the nightly's name for AISBench's "Output Token Throughput" (token/s)
TEST_INPUTS = ("num_prompts", "max_out_len", "batch_size", "request_rate")  # what the nightly's task says it ran
_FIGURE = re.compile(r"\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(.*?)\s*")


@dataclass(frozen=True)
class ThroughputRead:
    """One end's output token throughput as a nightly's benchmark JSON has it."""

    value: float
    file: Path
    why: str  # why this file, when the path held several
    unknown_commit: str = ""  # why the commit it ran is not known (a multi-node run given `main`)
    model: str = ""  # the JSON's `model_name`: the model the nightly served (empty where it names none)


def task_name(key: str, bench: dict[str, Any]) -> str:
    """The name the nightly's JSON gives a benchmark's task: its `dataset_path` after the owner,
    else its `dataset_conf`'s first part, else its key (test_single_node.py's rule)."""
    if bench.get("dataset_path"):
        return str(bench["dataset_path"]).split("/", 1)[-1]
    if bench.get("dataset_conf"):
        return str(bench["dataset_conf"]).split("/")[0]
    return key


def nightly_throughput(path: Path, key: str, bench: dict[str, Any], case: str, commit: str | None,
                       model: str = "") -> ThroughputRead:
    """The output token throughput of benchmark `key` of `case` (serving `model`) in the nightly's
    `benchmark_results/*.json` that `path` names (a file, that folder, or the checkout above it),
    run at `commit` (None: not known yet). Several files with the benchmark: the one run at
    `commit`, else the one named after the case (as the single-node nightly names it), else the
    one of the case's model (the multi-node files are named after the workflow's matrix); else a
    UsageError naming them. A missing file, a task without the figure, a figure in another unit or
    a file whose `model_name` names another model than `model` is a UsageError naming what the file
    holds."""
    files = _result_files(path)
    docs = [(file, _load(file)) for file in files]
    name = task_name(key, bench)
    found: list[tuple[Path, dict[str, Any], dict[str, Any]]] = []
    without: list[str] = []
    for file, doc in docs:
        tasks = [task for task in _tasks(doc) if task.get("name") == name and _same_inputs(task, bench)]
        found += [(file, doc, task) for task in tasks if OTT in _metrics(task)]
        without += [f"{file.name} ({', '.join(_metrics(task)) or 'no metrics: its run failed'})"
                    for task in tasks if OTT not in _metrics(task)]
    if not found:
        if without:
            raise UsageError(f"{path}: the task {name} has no {OTT} in {'; '.join(without)}; give the JSON of a "
                             "nightly whose performance benchmark ran")
        held = sorted({str(task.get("name")) for _, doc in docs for task in _tasks(doc)})
        raise UsageError(f"{path}: no task {name} (benchmark {key} of {case}) in {', '.join(f.name for f in files)} "
                         f"(their tasks: {', '.join(held) or 'none: not the nightly benchmark_results JSON'})")
    file, doc, task, why = _chosen(found, case, model, commit, path, name)
    _check_commit(file, doc, commit)
    _check_model(file, doc, case, model)
    version = _version(doc)
    ran = f"it ran {version}" if version else "no vllm_ascend_version"
    unknown = "" if _SHA.fullmatch(version) else f"{ran}: its commit unknown, not checked against the end's"
    return ThroughputRead(_tokens_per_s(task["metrics"][OTT], file), file, why, unknown, _model_name(doc))


def _result_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UsageError(f"{path} does not exist; give the nightly's benchmark_results JSON, its folder or the "
                         "vllm-ascend checkout it ran in")
    files = sorted(path.glob("*.json")) or sorted((path / "benchmark_results").glob("*.json"))
    if not files:
        raise UsageError(f"{path} holds no benchmark_results JSON (*.json in it or in its benchmark_results/, "
                         "as the nightly's single-node and multi-node tests write them)")
    return files


def _chosen(found: list[tuple[Path, dict[str, Any], dict[str, Any]]], case: str, model: str, commit: str | None,
            path: Path, name: str) -> tuple[Path, dict[str, Any], dict[str, Any], str]:
    """The one of several files holding the task: the one run at `commit`, else the case's own,
    else the one of its model."""
    if len(found) == 1:
        file, doc, task = found[0]
        return file, doc, task, ""
    at_commit = [hit for hit in found if commit and _ran_at(hit[1], commit)]
    if commit and len(at_commit) == 1:
        file, doc, task = at_commit[0]
        return file, doc, task, f"of {len(found)} files with task {name}, the one run at {commit[:12]}"
    named = [hit for hit in at_commit or found if hit[0].stem == case.replace("/", "_").replace(" ", "_")]
    if len(named) == 1:
        file, doc, task = named[0]
        return file, doc, task, f"of {len(found)} files with task {name}, the one named after case {case}"
    of_model = [hit for hit in named or at_commit or found if model and _same_model(hit[1], model)]
    if len(of_model) == 1:
        file, doc, task = of_model[0]
        return file, doc, task, f"of {len(found)} files with task {name}, the one of the case's model {model}"
    held = ", ".join(f"{hit[0].name} (model {_model_name(hit[1]) or 'not given'}, ran {_ref(hit[1])})"
                     for hit in found)
    raise UsageError(f"{path}: {len(found)} tasks {name} in {held}, none told apart by its commit, by the case's "
                     f"name {case} or by its model {model or '(not given)'}; give the one file: --nightly-result "
                     f"END={found[0][0]}, say")


def _ref(doc: dict[str, Any]) -> str:
    """The ref a nightly's JSON says it ran, a commit shortened as the messages show one."""
    version = _version(doc)
    return version[:12] if _SHA.fullmatch(version) else version or "no ref given"


def _model_name(doc: dict[str, Any]) -> str:
    """The model a nightly's JSON says it served (`model_name`), empty where it says none."""
    return str(doc.get("model_name") or "")


def _same_model(doc: dict[str, Any], model: str) -> bool:
    """Whether the nightly served the case's model: the same name, or one a path ending in the other."""
    served = _model_name(doc)
    return bool(served) and (_names_model(model, served) or _names_model(served, model))


def _names_model(path: str, name: str) -> bool:
    """Whether a model `path` is `name` or ends in it (a local copy of a hub model)."""
    return path == name or path.endswith("/" + name)


def _version(doc: dict[str, Any]) -> str:
    """The ref a nightly's JSON says it ran (`vllm_ascend_version`), empty where it says none."""
    return str(doc.get("vllm_ascend_version") or "")


def _check_commit(file: Path, doc: dict[str, Any], commit: str | None) -> None:
    version = _version(doc)
    if commit and _SHA.fullmatch(version) and not _ran_at(doc, commit):
        raise UsageError(f"{file}: the nightly ran at {version[:12]}, this end is {commit[:12]}; its throughput is "
                         f"not a run of this end: pass the end {version[:12]} or the JSON of a run at {commit[:12]}")


def _check_model(file: Path, doc: dict[str, Any], case: str, model: str, *, what: str = "its throughput is",
                 give: str = "the JSON", flag: str = "--nightly-result END=PATH") -> None:
    """A file whose `model_name` is another model than the case's is another case's run (its task
    may share the dataset and inputs); a file naming none, or a case whose model is not known, is
    read as is. `what`, `give` and `flag`: what the file gave, and what to give instead and how."""
    served = _model_name(doc)
    if model and served and not _same_model(doc, model):
        raise UsageError(f"{file}: the nightly served {served}, the case {case} serves {model}; {what} not a run "
                         f"of this case: give {give} of the nightly job that ran {case} ({flag}), or the "
                         "--nightly-case of the model it served")


def _ran_at(doc: dict[str, Any], commit: str) -> bool:
    version = _version(doc).lower()
    return bool(_SHA.fullmatch(version)) and commit.lower().startswith(version)


def _same_inputs(task: dict[str, Any], bench: dict[str, Any]) -> bool:
    given = task.get("test_input")
    said = given if isinstance(given, dict) else {}
    return all(said[k] == bench[k] for k in TEST_INPUTS if k in said and k in bench)


def _metrics(task: dict[str, Any]) -> dict[str, Any]:
    metrics = task.get("metrics")
    return metrics if isinstance(metrics, dict) else {}


def _tokens_per_s(figure: Any, file: Path) -> float:
    """A figure as the nightly writes it (a number, its "token/s" stripped) or as AISBench does
    ("951.2 token/s"); any other unit is refused."""
    if isinstance(figure, int | float) and not isinstance(figure, bool):
        return float(figure)
    match = _FIGURE.fullmatch(str(figure))
    if match is None:
        raise UsageError(f"{file}: {OTT} is {figure!r}, not a number of tokens/s")
    if match[2] and match[2].lower() not in UNITS:
        raise UsageError(f"{file}: {OTT} is {figure!r}, in {match[2]}, not tokens/s (output token throughput)")
    return float(match[1])
