"""lm-eval (`lm-eval` package) against the candidate's server: `local-completions` or
`local-chat-completions`, tokenizer-free, `--log_samples`; correctness per sample from its
samples JSONL (the first metric each line names), never from the results table.

A task YAML (`lm_eval.task` a path) runs through a task of our own that `include:`s it and
points its test split at the trial's dataset file (the focus subset), written as JSON, which
YAML reads. A task name runs as lm-eval knows it, focused with `--samples` (ids are doc ids).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from . import HarnessError, excerpt, find_executable, json_lines, run_harness

WRAPPER_TASK = "bisect_npu_accuracy"
ENDPOINTS = {"local-completions": "/v1/completions", "local-chat-completions": "/v1/chat/completions"}
# Metric names lm-eval tasks use for a per-sample 0/1 score, in the order they are tried when a
# samples line does not list its metrics.
KNOWN_METRICS = ("exact_match", "acc", "acc_norm", "pass@1", "pass_at_1", "em", "correct")


def is_task_file(task: str) -> bool:
    return task.endswith((".yaml", ".yml"))


def gen_kwargs(sampling: dict[str, Any]) -> str:
    """What the recipe's sampling sends, as lm-eval's --gen_kwargs (over the task's own)."""
    values: dict[str, Any] = {}
    temperature = sampling.get("temperature")
    if temperature is not None:
        values["temperature"] = temperature
        values["do_sample"] = temperature > 0
    if sampling.get("top_p") is not None:
        values["top_p"] = sampling["top_p"]
    if sampling.get("max_tokens") is not None:
        values["max_gen_toks"] = sampling["max_tokens"]
    return ",".join(f"{key}={json.dumps(value)}" for key, value in values.items())


def argv(executable: str, spec: dict[str, Any], base_url: str, model_id: str, dataset: str, ids: list[str] | None,
         sample_ids: list[str] | None, sampling: dict[str, Any], seed: int, work_dir: str) -> list[str]:
    """The lm-eval command line of one run (and, for a task YAML, the wrapper task it reads)."""
    model = spec.get("model") or "local-chat-completions"
    model_args = (f"model={model_id},base_url={base_url}{ENDPOINTS[model]},tokenized_requests=False,"
                  f"tokenizer_backend=None,num_concurrent=1,max_retries=1,seed={seed}")
    task = spec["task"]
    command = [executable, "run", "--model", model, "--model_args", model_args, "--log_samples",
               "--output_path", os.path.join(work_dir, "output"), "--seed", str(seed)]
    if is_task_file(task):
        if not os.path.isfile(task):
            raise HarnessError(f"the lm-eval task file {task} does not exist; fix `accuracy.lm_eval.task`")
        if ids is None:
            raise HarnessError(f"an lm-eval task YAML needs a JSONL dataset file; {dataset} is not one")
        tasks_dir = os.path.join(work_dir, "tasks")
        os.makedirs(tasks_dir, exist_ok=True)
        wrapper = {"include": os.path.abspath(task), "task": WRAPPER_TASK, "dataset_path": "json",
                   "dataset_name": None, "dataset_kwargs": {"data_files": {"test": os.path.abspath(dataset)}},
                   "test_split": "test", "validation_split": None}
        with open(os.path.join(tasks_dir, f"{WRAPPER_TASK}.yaml"), "w", encoding="utf-8") as fh:
            json.dump(wrapper, fh, indent=1)
        command += ["--tasks", WRAPPER_TASK, "--include_path", tasks_dir]
    else:
        command += ["--tasks", task]
        if sample_ids is not None:
            command += ["--samples", json.dumps({task: [int(s) for s in sample_ids if s.isdigit()]})]
    if model == "local-chat-completions":
        command += ["--apply_chat_template"]
    if spec.get("num_fewshot") is not None:
        command += ["--num_fewshot", str(spec["num_fewshot"])]
    kwargs = gen_kwargs(sampling)
    if kwargs:
        command += ["--gen_kwargs", kwargs]
    return command + list(spec.get("extra_args") or [])


def _metric(line: dict[str, Any], where: str) -> float:
    names = [m for m in line.get("metrics") or [] if isinstance(m, str)] or [m for m in KNOWN_METRICS if m in line]
    for name in names:
        value = line.get(name)
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)) and 0.0 <= value <= 1.0:
            return float(value)
    raise HarnessError(f"{where}: no per-sample 0..1 score among {names or list(KNOWN_METRICS)}; a task for "
                       "bisection scores each sample (exact_match, acc)")


def read_samples(work_dir: str, ids: list[str] | None) -> list[dict[str, Any]]:
    """Outcomes from lm-eval's samples JSONL (one line per doc and filter: the first filter's counts)."""
    files = sorted(glob.glob(os.path.join(work_dir, "output", "**", "samples_*.jsonl"), recursive=True))
    if not files:
        raise HarnessError(f"lm-eval wrote no samples file under {work_dir}/output (was --log_samples dropped?); "
                           "see its log")
    outcomes: dict[str, dict[str, Any]] = {}
    for path in files:
        for where, line in json_lines(path, "lm-eval's samples file is broken"):
            if not isinstance(line, dict) or "doc_id" not in line:
                raise HarnessError(f"{where}: a samples line without doc_id; not lm-eval's format")
            doc: dict[str, Any] = line["doc"] if isinstance(line.get("doc"), dict) else {}
            doc_id = int(line["doc_id"])
            sid = str(doc["id"]) if doc.get("id") is not None else (
                ids[doc_id] if ids is not None and doc_id < len(ids) else str(doc_id))
            if sid in outcomes:
                continue
            resps = line.get("filtered_resps") or line.get("resps") or []
            while isinstance(resps, list) and resps:
                resps = resps[0]
            outcomes[sid] = {"id": sid, "correct": _metric(line, where), "runs": 1,
                             "prompt": excerpt(_prompt(line)), "output": excerpt(resps if resps != [] else ""),
                             "target": excerpt(line.get("target"))}
    if not outcomes:
        raise HarnessError(f"lm-eval's samples files under {work_dir}/output hold no sample; see its log")
    return list(outcomes.values())


def _prompt(line: dict[str, Any]) -> Any:
    arguments = line.get("arguments")
    if isinstance(arguments, dict):
        first = next(iter(arguments.values()), None)
        if isinstance(first, dict):
            return first.get("arg_0")
    if isinstance(arguments, list) and arguments and isinstance(arguments[0], list) and arguments[0]:
        return arguments[0][0]
    return None


def run(spec: dict[str, Any], base_url: str, model_id: str, dataset: str, ids: list[str] | None,
        sample_ids: list[str] | None, sampling: dict[str, Any], seed: int, work_dir: str,
        timeout_s: float) -> list[dict[str, Any]]:
    executable = find_executable("lm_eval")
    os.makedirs(work_dir, exist_ok=True)
    command = argv(executable, spec, base_url, model_id, dataset, ids, sample_ids, sampling, seed, work_dir)
    with open(os.path.join(work_dir, "argv.json"), "w", encoding="utf-8") as fh:
        json.dump(command, fh)
    run_harness(command, os.path.join(work_dir, "harness.log"), timeout_s, cwd=work_dir)
    return read_samples(work_dir, ids)
