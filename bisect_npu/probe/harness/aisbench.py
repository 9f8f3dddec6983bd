"""AISBench (`ais_bench`, package ais-bench-benchmark) against the candidate's server, as
vllm-ascend's nightly runs it: a model config of the `vllm_api_*` kind (`request_conf`) and a
dataset config (`dataset_conf`), with the dataset's `path` set to the trial's local data.

The run reads a config file of our own (AISBench's configs are Python): the named model config
from AISBench's tree, pointed at the server (host, port, served model id, the recipe's sampling
as `generation_kwargs`), and the dataset config (an AISBench config name such as
`aime2024/aime2024_gen_0_shot_chat_prompt`, or a `.py` file of your own), its `path` the trial's data. With
`--dump-eval-details`, correctness per sample comes from the result file's `details` and the
answer text from the prediction file, never from the summary.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

from . import HarnessError, excerpt, find_executable, json_lines, run_harness

MODEL_ABBR = "candidate"
_INDEX = re.compile(r"_(\d+)$")

# Appended to the model config's and the dataset config's own text: AISBench reads its configs
# with mmengine, whose lazy imports allow no computation on imported modules, so the configs are
# composed as text and only plain dicts are touched here.
OVERRIDE_TEMPLATE = """

# Written by bisect-npu for one AISBench run: the candidate's server and the trial's data.
models = [dict(_m, **{model_overrides},
               generation_kwargs=dict(_m.get("generation_kwargs") or {{}}, **{generation_kwargs})) for _m in models]
datasets = [dict(_d, path={data_path!r}) for _k, _v in list(locals().items())
            if _k == "datasets" or _k.endswith("_datasets") for _d in _v]
summarizer = dict(attr="accuracy")
"""


def configs_dir(executable: str) -> str:
    """AISBench's own config tree, beside the `ais_bench` executable's venv."""
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(executable)))
    found = sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", "ais_bench", "benchmark",
                                          "configs")))
    if not found:
        raise HarnessError(f"cannot find AISBench's configs in {prefix}/lib/python3*/site-packages/ais_bench; "
                           "is it a venv with ais-bench-benchmark installed?")
    return found[-1]


def _config_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise HarnessError(f"cannot read the AISBench {what} {path} ({exc}); fix `accuracy.aisbench`") from exc


def dataset_file(dataset_conf: str, configs: str) -> str:
    """The dataset config as a path: a `.py` file as given, an AISBench name within its configs."""
    if dataset_conf.endswith(".py"):
        return dataset_conf
    return os.path.join(configs, "datasets", dataset_conf + ".py")


def write_config(path: str, spec: dict[str, Any], configs: str, host: str, port: int, model_id: str,
                 data_path: str, sampling: dict[str, Any], seed: int) -> None:
    overrides = {"abbr": MODEL_ABBR, "host_ip": host, "host_port": port, "url": "", "model": model_id,
                 "batch_size": int(spec.get("batch_size") or 1), "retry": 1,
                 "max_out_len": int(sampling.get("max_tokens") or 512)}
    generation: dict[str, Any] = {"seed": seed}
    for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty"):
        if sampling.get(key) is not None:
            generation[key] = sampling[key]
    model_text = _config_text(os.path.join(configs, "models", "vllm_api", spec["request_conf"] + ".py"),
                              "model config")
    dataset_text = _config_text(dataset_file(spec["dataset_conf"], configs), "dataset config")
    tail = OVERRIDE_TEMPLATE.format(model_overrides=repr(overrides), generation_kwargs=repr(generation),
                                    data_path=os.path.abspath(data_path))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(model_text.rstrip() + "\n\n" + dataset_text.rstrip() + "\n" + tail)


def _load_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise HarnessError(f"cannot read AISBench's {path} ({exc}); see its log") from exc


def _jsonl(path: str) -> list[dict[str, Any]]:
    return [row for _, row in json_lines(path, "AISBench's predictions are broken") if isinstance(row, dict)]


def _correct(detail: dict[str, Any], where: str) -> float:
    for key in ("is_correct", "correct"):
        value = detail.get(key)
        if isinstance(value, list) and value and all(isinstance(v, bool) for v in value):
            return sum(value) / len(value)
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)) and 0 <= value <= 1:
            return float(value)
    raise HarnessError(f"{where}: a detail without is_correct/correct; the dataset config's evaluator must write "
                       "per-sample details (AccwithDetailsEvaluator, or one of AISBench's math evaluators)")


class NoDetails(HarnessError):
    """AISBench's results hold only the aggregate: it ran without --dump-eval-details."""


def read_samples(work_dir: str, ids: list[str] | None, model: str = MODEL_ABBR, run: str = "*") -> list[dict[str, Any]]:
    """Outcomes from the runs under `work_dir` (`run`: one run's directory name, a timestamp):
    results/<model>/<dataset>.json details joined with predictions/<model>/<dataset>.jsonl by row
    number. `model` "*": whichever model abbreviation the run's config gave (a run not ours)."""
    run = run if run == "*" else glob.escape(run)
    results = sorted(glob.glob(os.path.join(work_dir, run, "results", model, "*.json")))
    failed = [p for p in glob.glob(os.path.join(work_dir, run, "predictions", model, "*_failed.jsonl"))
              if _jsonl(p)]
    if failed:
        rows = _jsonl(failed[0])
        raise HarnessError(f"AISBench's requests to the server failed for {len(rows)} samples ({failed[0]}): "
                           f"{str(rows[0].get('error_info') or 'no reason given')[:200]}")
    if not results:
        raise HarnessError(f"AISBench wrote no result file under {work_dir}/{run}/results/{model}; see its log")
    outcomes: list[dict[str, Any]] = []
    for path in results:
        result = _load_json(path)
        details = result.get("details") if isinstance(result, dict) else None
        if not details:
            raise NoDetails(f"{path} has no per-sample details (only the aggregate); run with --dump-eval-details "
                            "and an evaluator that writes details")
        entries = list(details.items()) if isinstance(details, dict) else list(enumerate(details))
        prediction_file = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(path))), "predictions",
                                       os.path.basename(os.path.dirname(path)),
                                       os.path.basename(path)[:-len(".json")] + ".jsonl")
        predictions = {int(row["id"]): row for row in (_jsonl(prediction_file) if os.path.exists(prediction_file)
                                                       else []) if isinstance(row.get("id"), int)}
        for position, (key, detail) in enumerate(entries):
            if not isinstance(detail, dict):
                raise HarnessError(f"{path}: detail {key!r} is not an object")
            index = _row_index(key, detail, position)
            sid = ids[index] if ids is not None and index < len(ids) else str(index)
            prediction = predictions.get(index, {})
            outcomes.append({"id": sid, "correct": _correct(detail, f"{path}: detail {key!r}"), "runs": 1,
                             "prompt": excerpt(prediction.get("origin_prompt") or _first(detail.get("prompt"))),
                             "output": excerpt(prediction.get("prediction") or _first(detail.get("pred"))),
                             "target": excerpt(prediction.get("gold") or _first(detail.get("refr")))})
    return outcomes


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


def _row_index(key: Any, detail: dict[str, Any], position: int) -> int:
    if isinstance(key, str) and key.isdigit():
        return int(key)
    match = _INDEX.search(str(detail.get("example_abbr") or ""))
    return int(match.group(1)) if match else position


def run(spec: dict[str, Any], host: str, port: int, model_id: str, dataset: str, ids: list[str] | None,
        sampling: dict[str, Any], seed: int, work_dir: str, timeout_s: float) -> list[dict[str, Any]]:
    executable = find_executable("aisbench")
    os.makedirs(work_dir, exist_ok=True)
    config = os.path.join(work_dir, "bisect_npu_aisbench.py")
    write_config(config, spec, configs_dir(executable), host, port, model_id, dataset, sampling, seed)
    outputs = os.path.join(work_dir, "outputs")
    command = [executable, config, "--work-dir", outputs, "--dump-eval-details", "--num-warmups", "0",
               *list(spec.get("extra_args") or [])]
    with open(os.path.join(work_dir, "argv.json"), "w", encoding="utf-8") as fh:
        json.dump(command, fh)
    # TERM=dumb: its progress monitor draws with curses otherwise (escape codes in the log).
    run_harness(command, os.path.join(work_dir, "harness.log"), timeout_s, env={"TERM": "dumb"}, cwd=work_dir)
    return read_samples(outputs, ids)
