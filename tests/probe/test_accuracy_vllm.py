"""The accuracy harnesses against real vLLM (CPU build, `make test-vllm`): the `vllm` tier.

The test makes its own dataset: questions answered greedily by a vLLM server that honours
`--override-generation-config '{"presence_penalty": 1.5}'` (the good side), the answers as the
targets. The bad side is the same server with the regression put back
(tests/helpers/vllm_server_dropping_penalties.py: the default never arrives). Real lm-eval and real
AISBench then score both through the probe, sample by sample: every answer right on the good
side, and on the bad side wrong exactly where greedy decoding without the penalty differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.tiny_qwen3 import write_tiny_qwen3
from tests.helpers.vllm_tier import REPO, VLLM_ENV, base_request, require_vllm, run_probe
from tests.probe.test_accuracy_harness import harness_executable
from tests.probe.test_probe_openai import BROKEN_LAUNCHER, CPU_LAUNCHER, OVERRIDE

DEMO_DATA = REPO / "bisect_npu" / "recipes" / "data" / "demo-accuracy"
MAX_TOKENS = 12
WORDS = ["river", "stone", "light", "window", "garden", "music", "paper", "silver", "orange", "winter", "forest",
         "candle", "bridge", "market", "planet", "shadow"]
pytestmark = pytest.mark.vllm


def _complete(port: int, prompt: str, **sampling: Any) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "stop": ["\n"],
            **sampling}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return str(json.loads(response.read())["choices"][0]["text"]).strip()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3-accuracy"))


@pytest.fixture(scope="module")
def dataset(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """The dataset (answers from the good server) and the ids a server without the penalty gets wrong."""
    python = require_vllm()
    port = 18461
    out = tmp_path_factory.mktemp("accuracy-vllm-data")
    argv = [part.format(python=python, model=tiny_model) for part in CPU_LAUNCHER]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny", "--dtype", "float32",
             "--max-model-len", "2048", "--enforce-eager", *OVERRIDE]
    with (out / "server.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **VLLM_ENV})
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (out / "server.log").read_text()[-3000:]
                time.sleep(1)
        rows, flips = [], set()
        for index, word in enumerate(WORDS):
            question = f"repeat the word {word} again and again: {word} {word} {word}"
            answer = _complete(port, question)
            if _complete(port, question, presence_penalty=0.0) != answer:
                flips.add(f"q-{index:02d}")
            rows.append({"id": f"q-{index:02d}", "question": question, "answer": answer})
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    path = out / "qa.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert flips, "the penalty changes no greedy answer: the tier's dataset cannot tell the sides apart"
    return path, flips


def _request(model: Path, harness: str, data: Path, launcher: list[str], port: int, out: Path) -> dict[str, Any]:
    task = out / "task.yaml"
    task.write_text((DEMO_DATA / "demo_qa.yaml").read_text().replace("max_gen_toks: 4", f"max_gen_toks: {MAX_TOKENS}"))
    sections = {"lm_eval": {"task": str(task), "model": "local-completions", "num_fewshot": None, "extra_args": []},
                "aisbench": {"request_conf": "vllm_api_general",
                             "dataset_conf": str(DEMO_DATA / "demo_qa_aisbench.py"), "batch_size": 1,
                             "extra_args": []}}
    request = base_request(model, "openai", {"temperature": 0.0, "max_tokens": MAX_TOKENS, "seed": 0})
    request["engine"].update(launcher=launcher, server_flags=[*OVERRIDE, "--served-model-name", "tiny"], port=port,
                             startup_timeout_s=600)
    request["accuracy"] = {"harness": harness, "dataset": str(data), "lm_eval": None, "aisbench": None,
                           "command": None, harness: sections[harness], "limit": None, "metric": "accuracy",
                           "repeats": 1, "sample_ids": None}
    return request


@pytest.mark.parametrize("harness", ["lm_eval", "aisbench"])
def test_real_harness_against_vllm_scores_the_dropped_default(tiny_model, dataset, harness, tmp_path):
    harness_executable(harness)
    data, flips = dataset
    good = run_probe(_request(tiny_model, harness, data, CPU_LAUNCHER, 18462, tmp_path), tmp_path / "good",
                     f"accuracy {harness}, override honoured")
    assert good.samples is not None and {s.correct for s in good.samples} == {1.0}
    bad = run_probe(_request(tiny_model, harness, data, BROKEN_LAUNCHER, 18463, tmp_path), tmp_path / "bad",
                    f"accuracy {harness}, override dropped")
    assert bad.samples is not None and len(bad.samples) == len(good.samples)
    wrong = {s.id for s in bad.samples if s.correct == 0.0}
    # lm-eval compares the whole answer; AISBench's `general` normalisation may hide a flip that only
    # changes punctuation or articles.
    assert wrong == flips if harness == "lm_eval" else (wrong and wrong <= flips)
