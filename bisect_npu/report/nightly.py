"""The report's section in the shape of vllm-ascend's nightly report (`tests/e2e/models/
report_template.md`): versions, environment, parallel and execution mode, the command, and a
Task | Metric | Value | Stderr table per tested commit, so a nightly user can paste it where the
nightly's own reports go."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

from bisect_npu.defaults import CONFIDENCE
from bisect_npu.errors import UsageError
from bisect_npu.recipe.loader import load_recipe
from bisect_npu.recipe.schema import PARALLEL_SIZES, Recipe
from bisect_npu.report.case import portable_model
from bisect_npu.report.view import SessionView, StepView


@dataclass(frozen=True)
class MetricRow:
    task: str
    metric: str
    value: float
    stderr: float


def metric_rows(task: str, figures: dict[str, Any]) -> list[MetricRow]:
    """A step's figures as the nightly's rows: accuracy (points; stderr from its interval at the
    figures' confidence) and output token throughput (tokens/s; the standard error of the mean)."""
    rows = []
    if isinstance(figures.get("accuracy"), int | float):
        low, high = figures.get("accuracy_low"), figures.get("accuracy_high")
        z = NormalDist().inv_cdf(0.5 + float(figures.get("confidence", CONFIDENCE)) / 2)
        spread = (float(high) - float(low)) / (2 * z) if isinstance(low, int | float) and isinstance(
            high, int | float) else 0.0
        rows.append(MetricRow(task, "accuracy", float(figures["accuracy"]), spread))
    if isinstance(figures.get("throughput_mean"), int | float):
        rows.append(MetricRow(task, "Output_Token_Throughput(OTT)", float(figures["throughput_mean"]),
                              float(figures.get("throughput_stderr", 0.0))))
    return rows


def _recipe(view: SessionView) -> Recipe | None:
    path = view.request.judge.recipe
    if not path or not Path(path).is_file():
        return None
    try:
        return load_recipe(path)
    except UsageError:
        return None


def _modes(recipe: Recipe | None) -> tuple[str, str]:
    """(parallel mode, execution mode) as the nightly's report names them."""
    if recipe is None:
        return "unknown", "unknown"
    sizes = recipe.engine.parallel_sizes()
    parallel = ", ".join(f"{name.removesuffix('_parallel_size').upper()}{sizes[name]}"
                         for name in PARALLEL_SIZES if name in sizes) or "TP1"
    flags = recipe.engine.server_flags
    if "--enable-expert-parallel" in flags:
        parallel += ", EP"
    eager = "--enforce-eager" in flags or bool(recipe.engine.args.get("enforce_eager"))
    return parallel, "Eager" if eager else "ACLGraph"


def _command(recipe: Recipe | None) -> str:
    if recipe is None:
        return ""
    model = portable_model(recipe.model.path)  # a directory of this host by its name only
    server = [word.replace("{model}", model) for word in recipe.engine.launcher]  # vllm serve MODEL
    line = shlex.join([*server, *recipe.engine.server_flags])
    acc = recipe.accuracy
    if acc is not None and acc.aisbench is not None:
        line += (f"\nais_bench --models {acc.aisbench.request_conf} --datasets {acc.aisbench.dataset_conf} "
                 f"# batch {acc.aisbench.batch_size}, max_out_len {acc.sampling.max_tokens}")
    return line


def _task(recipe: Recipe | None, step: StepView) -> str:
    if recipe is not None and recipe.accuracy is not None:
        return Path(recipe.accuracy.dataset).name or "accuracy"
    return recipe.cases[0].id if recipe is not None and recipe.cases else "case"


def nightly_section(view: SessionView) -> dict[str, Any] | None:
    """What the nightly-shaped section shows; None when the session ran no nightly case."""
    if not view.request.judge.nightly_case:
        return None
    recipe = _recipe(view)
    parallel, execution = _modes(recipe)
    versions = view.versions
    culprit = view.end.culprit if view.end is not None else None
    steps = [{"commit": s.commit, "title": s.title, "verdict": s.verdict, "culprit": s.commit == culprit,
              "rows": metric_rows(_task(recipe, s), s.figures)} for s in sorted(view.steps, key=lambda s: s.index)]
    return {"case": view.request.judge.nightly_case, "model": portable_model(recipe.model.path) if recipe else "",
            "vllm": versions.get("vllm", "unknown"), "vllm_ascend": versions.get("vllm_ascend", "unknown"),
            "cann": versions.get("cann", "unknown"), "torch": versions.get("torch", "unknown"),
            "torch_npu": versions.get("torch_npu", "unknown"), "hardware": view.header.context.host or "unknown",
            "parallel": parallel, "execution": execution, "command": _command(recipe), "steps": steps}
