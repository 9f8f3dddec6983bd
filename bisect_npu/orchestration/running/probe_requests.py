"""The request the probe reads for one trial of a case (bisect_npu/probe/request.py's format): the
case, the engine, the trial's seed, the loop guard, an accuracy recipe's harness settings and the
host files it reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bisect_npu.recipe.schema import CaseSpec, Recipe


def trial_seed(case: CaseSpec, trial: int) -> int | None:
    """The case's seed moved on by the trial number: repeated trials must differ, yet be
    reproducible. None when the case leaves the seed to the engine."""
    seed = case.sampling.to_request().get("seed")
    return None if seed is None else seed + trial


def accuracy_request(recipe: Recipe, sample_ids: Sequence[str] | None) -> dict[str, Any] | None:
    """The probe request's `accuracy` key (docs/reference/oracles.md, "The probe request"): the
    harness settings, the dataset resolved against the recipe, and the samples to run (None: all)."""
    if recipe.accuracy is None:
        return None
    spec = recipe.accuracy
    request = {**spec.model_dump(mode="json", include={"harness", "lm_eval", "aisbench", "command", "limit", "metric",
                                                       "repeats"}),
               "dataset": str(spec.dataset_path(recipe.source)),
               "sample_ids": None if sample_ids is None else list(sample_ids)}
    for section, key, path in _config_files(recipe):
        request[section][key] = str(path)
    if request.get("command"):
        request["command"]["argv"] = [str(_beside_recipe(recipe, word) or word) for word in request["command"]["argv"]]
    return request


def _beside_recipe(recipe: Recipe, word: str) -> Path | None:
    """A command harness's word that names a file relative to the recipe (`my_eval.py`), as a path
    resolved against the recipe's directory as the dataset is; None for any other word."""
    if "{" in word or Path(word).is_absolute() or not recipe.source or recipe.source.startswith("<"):
        return None
    path = Path(recipe.source).resolve().parent / word
    return path if path.is_file() else None


def _config_files(recipe: Recipe) -> list[tuple[str, str, Path]]:
    """A task YAML or dataset config given as a file, resolved against the recipe as the dataset is."""
    spec = recipe.accuracy
    if spec is None:
        return []
    named = (("lm_eval", "task", spec.lm_eval.task if spec.lm_eval else None, (".yaml", ".yml")),
             ("aisbench", "dataset_conf", spec.aisbench.dataset_conf if spec.aisbench else None, (".py",)))
    return [(section, key, spec.model_copy(update={"dataset": value}).dataset_path(recipe.source))
            for section, key, value, suffixes in named if value is not None and value.endswith(suffixes)]


def accuracy_inputs(recipe: Recipe) -> list[Path]:
    """The host files an accuracy trial reads besides the server (the dataset, a task YAML or a
    dataset config given as a file, a command harness's own files), those that exist here: a
    container gets them at the same path."""
    if recipe.accuracy is None:
        return []
    programs = recipe.accuracy.command.argv if recipe.accuracy.command else []
    paths = [recipe.accuracy.dataset_path(recipe.source), *(path for _, _, path in _config_files(recipe)),
             *filter(None, (_beside_recipe(recipe, word) for word in programs))]
    return [path for path in paths if path.exists()]


def probe_request(recipe: Recipe, case: CaseSpec, commit: str, trial: int,
                  sample_ids: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON the probe reads (format: bisect_npu/probe/request.py)."""
    sampling = case.sampling.to_request()
    if sampling.get("seed") is not None:
        sampling["seed"] = trial_seed(case, trial)
    rep = recipe.oracle.repetition
    loop_guard = None
    if "repetition" in recipe.oracle.kinds and rep.stop_early:
        loop_guard = {"min_pattern_size": rep.min_pattern_size, "max_pattern_size": rep.max_pattern_size,
                      "min_count": rep.min_count, "min_covered_tokens": rep.min_loop_tokens}
    return {
        "schema_version": 1,
        "commit": commit,
        "recipe": recipe.name,
        "run_digest": recipe.run_digest(),
        "case_id": case.id,
        "trial": trial,
        "seed": sampling.get("seed"),
        "backend": recipe.engine.backend,
        "model": recipe.model.model_dump(exclude={"host_path"}),
        "engine": recipe.engine.model_dump(exclude={"backend"}),
        "case": {**({"prompt": case.prompt} if case.prompt is not None else
                    {"messages": [m.model_dump() for m in case.messages or []]}),
                 "sampling": sampling},
        "loop_guard": loop_guard,
        "logits": {**recipe.capture.model_dump(), "top_k": case.sampling.logprobs or recipe.capture.top_k,
                   "dump_dir": None},
        "output": "",
        **({"accuracy": accuracy_request(recipe, sample_ids)} if recipe.accuracy is not None else {}),
    }
