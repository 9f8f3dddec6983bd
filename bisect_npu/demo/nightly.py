"""The demo's nightly case and good table: vllm-ascend's nightly inputs, shaped as its own.

The demo upstream's last commit on main adds `CASE_PATH`, a case file shaped as vllm-ascend's
`tests/e2e/nightly/single_node/models/configs/*.yaml`: one case whose server is the demo engine's
HTTP server (the case's `launcher`, bisect-npu's one key of its own), an accuracy benchmark in
AISBench's terms with `baseline`/`threshold` on the demo's QA set (its `dataset_path` is relative
to `--nightly-datasets`, as the nightly's are to its dataset cache), and a performance benchmark.
It comes after every case's range (so no existing commit changes), which is what the nightly
sees too: most case files are written after the regression they catch, and a candidate older
than the file runs HEAD's. `good_table` writes the pipeline's `good_table.csv` for a case from
the manifest: the good end's success, the bad end's failure, and rows that must not match.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from bisect_npu.demo import patches as P
from bisect_npu.demo.manifest import Manifest

CASE_PATH = "tests/e2e/nightly/single_node/models/configs/Tiny-Qwen3-A2.yaml"
CASE_NAME = "tiny-qwen3-rope-a2"
DEMO_CASE = "rope-longseq"  # the manifest case whose range the nightly case bisects
SOC, SCENE = "a2", "single_node"
CASE_FILE = """\
# The demo model's nightly case, shaped as vllm-ascend's single-node model configs.
# ==========================================
# Shared Configurations
# ==========================================

_envs: &envs
  OMP_NUM_THREADS: "1"
  SERVER_PORT: "DEFAULT_PORT"

_server_cmd: &server_cmd
  - "--port"
  - "$SERVER_PORT"
  - "--max-model-len"
  - "2048"

# ==========================================
# ACTUAL TEST CASES
# ==========================================

test_cases:
  - name: "tiny-qwen3-rope-a2"
    model: "seed:0"
    envs:
      <<: *envs
    # bisect-npu's own keys: the server before its flags (the nightly starts `vllm serve MODEL`),
    # and the build of a worktree (the nightly runs in a built image)
    launcher: ["{python}", "-m", "{probe}.serve_mini", "{model}"]
    local_build: ["python", "tools/build_kernels.py"]
    server_cmd: *server_cmd
    benchmarks:
      acc:
        case_type: accuracy
        dataset_path: demo-accuracy/qa.jsonl
        request_conf: vllm_api_general
        dataset_conf: demo-accuracy/demo_qa_aisbench.py
        max_out_len: 4
        batch_size: 1
        temperature: 0
        seed: 0
        baseline: 100
        threshold: 10
      perf:
        case_type: performance
        dataset_path: vllm-ascend/GSM8K-in3500-bs400
        request_conf: vllm_api_stream_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_cot_str_perf
        num_prompts: 4
        max_out_len: 32
        batch_size: 1
        baseline: 100
        threshold: 0.5
"""
ADD_CASE = P.Change("[CI] Add the nightly case of the demo model",
                    (P.Patch(CASE_PATH, None, CASE_FILE),),
                    "Accuracy on the demo QA set (AISBench, baseline 100, threshold 10) and output "
                    "throughput, on one A2 card.")
COLUMNS = ["name", "yaml/path", "link", "status", "vLLM Git information", "vLLM-Ascend Git information", "soc",
           "scene", "time"]
LINK = "https://github.com/example/tinyvllm/actions/runs/{run}/job/{job}"


def good_table(manifest: Manifest, good: str | None = None, bad: str | None = None,
               vllm_commit: str = "0" * 40) -> str:
    """The nightly table for the demo case (CASE_NAME on SOC, SCENE): its newest success is `good`
    (default: the case's good end); `bad` (default: its bad end) failed later; a newer success on
    another SoC, a newer one of another case, and an older legacy row (no soc, no scene) must not
    be chosen."""
    truth = manifest.case(DEMO_CASE)
    good, bad = good or truth.good_sha, bad or truth.bad_sha

    def row(run: int, name: str, status: str, sha: str, soc: str, scene: str, day: int) -> list[str]:
        return [name, CASE_PATH, LINK.format(run=run, job=run), status, vllm_commit, sha, soc, scene,
                f"2026-06-{day:02d} 03:40:00 +08:00"]

    rows = [row(101, CASE_NAME, "success", truth.culprit_parent, "", "", 1),  # legacy: no soc, no scene
            row(102, CASE_NAME, "success", good, SOC, SCENE, 15),
            row(103, CASE_NAME, "failure", bad, SOC, SCENE, 16),
            row(104, CASE_NAME, "success", bad, "a3", SCENE, 17),
            row(105, "tiny-qwen3-eager-a2", "success", bad, SOC, SCENE, 18)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([COLUMNS, *rows])
    return out.getvalue()


def write_good_table(manifest: Manifest, folder: Path, good: str | None = None, bad: str | None = None) -> Path:
    """`<folder>/nightly/good_table.csv`, as the pipeline lays its tables out."""
    path = folder / "nightly" / "good_table.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(good_table(manifest, good, bad), encoding="utf-8")
    return path
