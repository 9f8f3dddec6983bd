"""The demo's accuracy dataset: a QA set the seeded model answers, where the RoPE drift costs points.

A question is a word sequence; its answer is the good end's greedy continuation (`ANSWER_TOKENS`
words, cut at EOS as the server cuts it), recorded once from the demo engine at `v0.9.0`. Short
questions keep every position below max_position_embeddings (128), where the culprit of case
`rope-longseq` changes nothing, so every commit answers them right; long ones (130+ words) are
read with the broken cos/sin past position 128 from the culprit on, and answered wrongly. The
good end scores 100%, the culprit's descendants the short share (60%): the accuracy case
bisects that drop with a real harness over HTTP.

The dataset is bundled (`bisect_npu/recipes/data/demo-accuracy/qa.jsonl`, beside the recipes
that name it); `tests/test_demo_accuracy.py` regenerates it from the good end and compares.
"""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

DATA_DIR = Path(__file__).resolve().parent.parent / "recipes" / "data" / "demo-accuracy"
DATASET = DATA_DIR / "qa.jsonl"
# `bisect-npu demo --case accuracy --harness NAME` runs the case with the recipe of that harness.
RECIPES = {"lm_eval": "demo-accuracy", "aisbench": "demo-accuracy-aisbench"}
SHORT, LONG = 18, 12
SHORT_WORDS, LONG_WORDS = (6, 40), (130, 170)
ANSWER_TOKENS = 4
_SPECIAL = 3  # <pad>, <eos>, <unk> lead the demo tokenizer's vocabulary

# Run in the good end's tree (tinyvllm on PYTHONPATH): the greedy answers, cut at EOS.
_ANSWER_SCRIPT = """
import json, sys
from tinyvllm.engine import LLM
from tinyvllm.sampling_params import SamplingParams
llm = LLM("seed:0")
answers = []
for prompt in json.loads(sys.stdin.read()):
    ids = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=int(sys.argv[1])))
    if llm.tokenizer.eos_token_id in ids:
        ids = ids[:ids.index(llm.tokenizer.eos_token_id)]
    answers.append(llm.tokenizer.decode(ids))
print(json.dumps(answers))
"""


def questions(seed: int = 0) -> list[tuple[str, str, str]]:
    """(id, kind, question) of every sample: SHORT short ones, LONG long ones, interleaved."""
    words = _template_tokenizer().WordTokenizer(1024).words[_SPECIAL:]
    rng = random.Random(seed)
    kinds = ["short"] * SHORT + ["long"] * LONG
    rng.shuffle(kinds)
    samples = []
    for index, kind in enumerate(kinds):
        low, high = SHORT_WORDS if kind == "short" else LONG_WORDS
        question = " ".join(rng.choice(words) for _ in range(rng.randint(low, high)))
        samples.append((f"qa-{index:02d}", kind, question))
    return samples


def _template_tokenizer() -> ModuleType:
    """The demo engine's tokenizer module as the template writes it (standard library only; the
    generated history never changes it)."""
    path = Path(__file__).resolve().parent / "upstream" / "tinyvllm" / "tokenizer.py"
    spec = importlib.util.spec_from_file_location("_demo_tokenizer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate_dataset(good_tree: Path, seed: int = 0, python: str = sys.executable) -> list[dict[str, str]]:
    """The dataset's rows, answered by the engine of `good_tree` (a built checkout of the good end)."""
    samples = questions(seed)
    done = subprocess.run([python, "-c", _ANSWER_SCRIPT, str(ANSWER_TOKENS)],
                          input=json.dumps([q for _, _, q in samples]), capture_output=True, text=True,
                          cwd=good_tree, env={"PYTHONPATH": str(good_tree), "PATH": "/usr/bin:/bin"}, check=True)
    answers = json.loads(done.stdout)
    return [{"id": sid, "kind": kind, "question": question, "answer": answer}
            for (sid, kind, question), answer in zip(samples, answers, strict=True)]


def dataset_text(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def read_dataset(path: Path = DATASET) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
