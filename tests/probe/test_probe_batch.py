"""Several trials in one probe request: one engine start, each trial as a fresh start would see it.

The contract in `trial_requests`, then the real probe (`python -m bisect_npu.probe`) on the demo
engine tinyvllm: a batch must give, trial for trial, what single requests give.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bisect_npu.probe.__main__ import main
from bisect_npu.probe.request import trial_requests
from tests.helpers.paths import REPO_ROOT

# The probe runs the demo's model in a subprocess.
pytestmark = pytest.mark.e2e

REPO = REPO_ROOT
UPSTREAM = REPO / "bisect_npu" / "demo" / "upstream"
SEEDS = (7, 8, 9)


def _request(tmp_path: Path, seeds: tuple[int, ...] = SEEDS, sampling_seed: bool = True) -> dict[str, Any]:
    """A batch request as the host writes it: entries numbered from 0, seed = base + trial."""
    batch = [{"trial": n, "seed": seed, "output": str(tmp_path / f"obs-t{n}.json")} for n, seed in enumerate(seeds)]
    # 150 new tokens pass max_position_embeddings (128): the first trial grows the RoPE cache.
    sampling = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 150, "logprobs": 3,
                **({"seed": seeds[0]} if sampling_seed else {})}
    return {
        "schema_version": 1, "commit": "demo", "recipe": "batch", "case_id": "c", "trial": 0, "seed": seeds[0],
        "backend": "mini", "model": {"path": "seed:0", "dtype": "float32", "tokenizer": None},
        "engine": {"args": {"speculative_config": {"num_speculative_tokens": 3, "draft_layers": 1}},
                   "server_flags": []},
        "case": {"prompt": "please repeat the story of the old man and the sea", "sampling": sampling},
        "loop_guard": None, "logits": {"top_k": 3, "dump_dir": None}, "output": batch[0]["output"],
        "batch": batch,
    }


def test_trial_requests_substitute_trial_seed_and_output(tmp_path: Path) -> None:
    request = _request(tmp_path)
    trials = trial_requests(request)
    assert [(t["trial"], t["seed"], t["case"]["sampling"]["seed"]) for t in trials] == [(0, 7, 7), (1, 8, 8), (2, 9, 9)]
    assert [t["output"] for t in trials] == [entry["output"] for entry in request["batch"]]
    assert all("batch" not in t for t in trials)
    trials[1]["case"]["sampling"]["temperature"] = 0.0  # copies: one trial cannot change another
    assert trials[2]["case"]["sampling"]["temperature"] == request["case"]["sampling"]["temperature"] == 0.8
    rest = ("trial", "seed", "output", "case")
    assert all({k: v for k, v in t.items() if k not in rest} == {k: v for k, v in request.items()
                                                               if k not in (*rest, "batch")} for t in trials)


def test_trial_requests_leave_an_unsent_seed_unsent(tmp_path: Path) -> None:
    trials = trial_requests(_request(tmp_path, sampling_seed=False))
    assert [t["seed"] for t in trials] == [7, 8, 9]
    assert all("seed" not in t["case"]["sampling"] for t in trials)


def test_trial_requests_without_batch_is_the_request(tmp_path: Path) -> None:
    request = {k: v for k, v in _request(tmp_path).items() if k != "batch"}
    assert trial_requests(request) == [request] and trial_requests(request)[0] is request


@pytest.mark.parametrize("batch", [[], [{"seed": 1, "output": "x.json"}], [{"trial": 0, "seed": 1}], "t0"])
def test_malformed_batch_is_a_usage_error(tmp_path: Path, batch: Any) -> None:
    with pytest.raises(ValueError, match="batch"):
        trial_requests({"batch": batch})
    path = tmp_path / "request.json"
    path.write_text(json.dumps({**_request(tmp_path), "batch": batch}))
    assert main([str(path)]) == 2


# ------------------------------------------------------------------ the real probe on tinyvllm

@pytest.fixture(scope="module")
def engine_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo upstream with its kernels built, in a scratch copy (the template tree stays clean)."""
    root = tmp_path_factory.mktemp("engine") / "upstream"
    shutil.copytree(UPSTREAM, root, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=root, check=True, capture_output=True)
    return root


def _start_probe(engine_root: Path, request: dict[str, Any], path: Path) -> subprocess.Popen[str]:
    path.write_text(json.dumps(request), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(engine_root), str(REPO)])}
    return subprocess.Popen([sys.executable, "-m", "bisect_npu.probe", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def _load(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def test_batch_equals_single_requests_trial_for_trial(engine_root: Path, tmp_path: Path) -> None:
    batch_request = _request(tmp_path / "batch")
    singles = trial_requests(_request(tmp_path / "single"))
    # The engine runs one thread per probe: the four probes run side by side.
    procs = [_start_probe(engine_root, batch_request, tmp_path / "batch-request.json")]
    procs += [_start_probe(engine_root, single, tmp_path / f"single-{n}.json") for n, single in enumerate(singles)]
    for proc in procs:
        returncode, out = _finish(proc)
        assert returncode == 0, out

    batched = [_load(entry["output"]) for entry in batch_request["batch"]]
    alone = [_load(single["output"]) for single in singles]
    assert [obs["extra"].pop("batch") for obs in batched] == [{"index": n, "size": 3} for n in range(3)]
    assert all("batch" not in obs["extra"] for obs in alone)
    assert batched[0]["timings"]["load_s"] > 0 and [obs["timings"]["load_s"] for obs in batched[1:]] == [0.0, 0.0]
    assert all(obs["timings"]["load_s"] > 0 for obs in alone)
    for got, expected in zip(batched, alone, strict=True):
        got.pop("timings"), expected.pop("timings")
        assert got == expected  # tokens, logprobs, effective sampling, per-trial spec-decode counts
    assert [obs["sampling"]["seed"] for obs in batched] == list(SEEDS)
    assert len({tuple(obs["output_token_ids"]) for obs in batched}) == 3  # the seeds really differ
    assert all(len(obs["output_token_ids"]) == 150 and obs["extra"]["spec_decode"]["proposed"] > 0
               for obs in batched)


def test_a_failing_trial_stops_the_batch_and_keeps_what_was_written(engine_root: Path, tmp_path: Path) -> None:
    # torch.Generator.manual_seed rejects a seed past 2**64 - 1: trial 1 fails inside the engine.
    request = _request(tmp_path, seeds=(7, 2**64, 9))
    returncode, out = _finish(_start_probe(engine_root, request, tmp_path / "request.json"))
    assert returncode == 3
    assert "Overflow" in out.splitlines()[-1]  # the traceback the host turns into the skip reason
    first, second, third = (Path(entry["output"]) for entry in request["batch"])
    assert _load(str(first))["extra"]["batch"] == {"index": 0, "size": 3}
    assert not second.exists() and not third.exists()
    assert not list(tmp_path.glob(".obs-*"))  # no half-written file either
