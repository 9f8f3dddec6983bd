"""A throughput benchmark on an NPU host, which cannot run here, stood in for at the executor: a
probe run at a commit writes the observation such a run writes (its output token throughput),
drawn about the commit's level with a seeded run-to-run spread, and a run picked to crash ends as
an engine that never started does (an infrastructure failure the evaluator retries). Everything
else is real: the git history, the worktrees the builder makes, the journal, the search.

The level of a commit is read from its worktree's `state` file (tests/helpers/gitrepo.py writes
"good" before the culprit and "bad" from it on), so the culprit is where the history puts it; the
draws depend only on the seed, the commit and the trial, so a resumed session draws what the
interrupted one would have."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bisect_npu.builders.base import Environment
from bisect_npu.execute.base import RunResult, observation_path, probe_log_path, probe_stem
from bisect_npu.observations import Observation
from bisect_npu.oracle.throughput import EarlierThroughput

PERF_CASE = """\
test_cases:
  - name: "speed-a2"
    model: "tiny"
    launcher: ["serve"]
    benchmarks:
      perf:
        case_type: performance
        dataset_path: vllm-ascend/GSM8K-in3500-bs400
        request_conf: vllm_api_stream_chat
        dataset_conf: gsm8k/gsm8k_gen_0_shot_cot_str_perf
        baseline: 1000
        threshold: 0.97
"""
CASE_PATH = "tests/e2e/nightly/single_node/models/configs/Speed-A2.yaml"
ENGINE_NEVER_STARTED = "server exited with -9 before /health answered"


def perf_recipe(where: Path, search: str = "levels", baseline: float | None = None,
                earlier_runs: dict[str, Any] | None = None, **trials: Any) -> Path:
    """The recipe `run --nightly-case` makes of the performance benchmark above (threshold 0.97,
    the line drawn from the good end), written to `where`, with `oracle.throughput.search`, the
    published `baseline` in tokens/s (None: the case's, 1000), its `earlier_runs` and `trials`
    fields (no wait between a crashed run's attempts)."""
    from bisect_npu.nightly.at_commit import recipe_dump
    from bisect_npu.nightly.cases import import_case, read_case_file

    recipe = import_case(read_case_file(PERF_CASE, CASE_PATH), CASE_PATH, "speed-a2", "perf")
    assert recipe.oracle.throughput is not None
    recipe = recipe.model_copy(update={
        "oracle": recipe.oracle.model_copy(update={
            "throughput": recipe.oracle.throughput.model_copy(update={
                "search": search, "baseline": baseline or recipe.oracle.throughput.baseline,
                "earlier_runs": EarlierThroughput.model_validate(earlier_runs) if earlier_runs else None})}),
        "trials": recipe.trials.model_copy(update={"retry_backoff_s": 0.0, **trials})})
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(recipe_dump(recipe))
    return where


def _rng(*key: object) -> np.random.Generator:
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _draw(seed: int, commit: str, trial: int) -> float:
    """A standard normal draw fixed by the seed, the commit and the trial."""
    return float(_rng(seed, commit, trial).standard_normal())


def crashing_at(rate: float, seed: int) -> Callable[[str, int, int], bool]:
    """Each attempt crashes with probability `rate`, drawn from the seed, the commit, the trial and
    the attempt (so a resumed session draws the same)."""
    return lambda commit, trial, attempt: bool(_rng("crash", seed, commit, trial, attempt).random() < rate)


class NpuThroughputStandIn:
    """Stands in for the executor of an NPU host running a throughput benchmark (see the module's
    docstring): `good` tokens/s before the culprit, `good` x (1 - `drop`) from it on, each run's
    spread `spread` x `good`; `crashes(commit, trial, attempt)` says which attempts crash. Counts
    every attempt (`attempts`: each trial of a batch, one benchmark run each), crashed ones too."""

    def __init__(self, drop: float, spread: float, seed: int, good: float = 1000.0,
                 crashes: Callable[[str, int, int], bool] = lambda _commit, _trial, _attempt: False,
                 level_of: Callable[[Environment], bool] | None = None) -> None:
        self.drop, self.spread, self.seed, self.good = drop, spread, seed, good
        self.crashes = crashes
        self.level_of = level_of or _bad_by_state
        self.attempts: Counter[tuple[str, int]] = Counter()

    def run_probe(self, env: Environment, request: dict[str, Any], out_dir: Path, timeout_s: float) -> RunResult:
        """One probe run: its trial, or each trial of its batch in turn (one benchmark run each)."""
        case, first = str(request["case_id"]), int(request["trial"])
        out_dir.mkdir(parents=True, exist_ok=True)
        log = probe_log_path(out_dir, probe_stem(case, first))
        lines, path = [], None
        for trial in [int(b["trial"]) for b in request.get("batch") or [{"trial": first}]]:
            self.attempts[(env.commit, trial)] += 1
            if self.crashes(env.commit, trial, self.attempts[(env.commit, trial)]):
                log.write_text("".join(lines) + f"{ENGINE_NEVER_STARTED}\n")
                return RunResult(returncode=1, seconds=0.01, log_path=str(log), log_tail=ENGINE_NEVER_STARTED)
            mean = self.good * (1 - self.drop) if self.level_of(env) else self.good
            value = mean + self.spread * self.good * _draw(self.seed, env.commit, trial)
            path = observation_path(out_dir, case, trial)
            path.write_text(Observation(case_id=case, trial=trial, seed=request.get("seed"),
                                        extra={"output_token_throughput": value}).model_dump_json())
            lines.append(json.dumps({"commit": env.commit, "trial": trial, "tokens_per_s": value}) + "\n")
        log.write_text("".join(lines))
        return RunResult(returncode=0, seconds=0.01, log_path=str(log), observation=str(path))

    def run_command(self, env: Environment, argv: list[str], log_path: Path, timeout_s: float,
                    extra_env: dict[str, str] | None = None) -> RunResult:
        raise AssertionError("a throughput recipe runs no command")

    def close(self) -> None:
        """Nothing runs between calls."""

    def sweep(self) -> int:
        return 0

    @property
    def runs(self) -> int:
        """Every attempt made, crashed ones included."""
        return sum(self.attempts.values())


def _bad_by_state(env: Environment) -> bool:
    path = Path(env.path or ".") / "state"
    return path.read_text().strip() == "bad"


def slow_before_culprit(env: Environment) -> bool:
    """A fix's history: the slow level before the history's culprit (the fix), restored from it on."""
    return not _bad_by_state(env)
