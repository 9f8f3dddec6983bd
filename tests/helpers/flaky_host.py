"""A served accuracy bisection on a flaky host, for the tests and bench/flaky_host_bench.py: the demo
upstream's accuracy case with its server started through flaky_start.py (a seeded share of starts
fails "device busy") and scored by accuracy_command_harness.py (a seeded share of runs loses the
server). Each start and each harness run appends "ok" or "fail" to a count file, so a caller can
check that every failure was journaled."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_npu.demo.accuracy import DATASET
from tests.helpers.paths import HELPERS

CLI = [sys.executable, "-m", "bisect_npu"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flaky_recipe(where: Path, start_fails: float, harness_dies: float, seed: int, backoff_s: float = 1.0,
                 retries: int | None = None) -> Path:
    """The accuracy-session recipe with its server behind flaky_start.py and a dying harness
    (`where`/starts.txt and `where`/harness.txt count their draws); `retries`: the recipe's bound."""
    launcher = [sys.executable, str(HELPERS / "flaky_start.py"), "--fail-rate", str(start_fails), "--seed",
                str(seed), "--count", str(where / "starts.txt"), "--", "{python}", "-m", "{probe}.serve_mini",
                "{model}"]
    harness = [sys.executable, str(HELPERS / "accuracy_command_harness.py"), "{base_url}", "{model}", "{dataset}",
               "{output}", "--die-rate", str(harness_dies), "--seed", str(seed), "--count",
               str(where / "harness.txt")]
    trials: dict[str, Any] = {"retry_backoff_s": backoff_s, **({"retries": retries} if retries is not None else {})}
    recipe = {
        "name": "flaky-host", "model": {"path": "seed:0", "dtype": "float32"},
        "engine": {"backend": "openai", "launcher": launcher, "port": free_port(), "startup_timeout_s": 120},
        "accuracy": {"harness": "command", "dataset": str(DATASET), "command": {"argv": harness},
                     "sampling": {"temperature": 0.0, "max_tokens": 4, "seed": 0}},
        "oracle": {"kinds": ["accuracy"]},
        "trials": trials,
        "build": {"local_command": ["python", "tools/build_kernels.py"]},
    }
    where.mkdir(parents=True, exist_ok=True)
    path = where / "recipe.yaml"
    path.write_text(json.dumps(recipe))
    return path


def journal(session: Path) -> list[dict[str, Any]]:
    path = session / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def failures(path: Path) -> int:
    return path.read_text().splitlines().count("fail") if path.exists() else 0


@dataclass(frozen=True)
class FlakyRun:
    """What one served bisection on the flaky host did."""

    exit_code: int
    culprit: str | None
    retries: int  # journaled failed attempts
    start_failures: int  # what the launcher's draws failed
    harness_failures: int  # what the harness's draws failed
    kinds: dict[str, int]  # journaled attempts by kind
    steps_skipped: int
    output: str

    @property
    def every_failure_journaled(self) -> bool:
        return self.kinds == {k: v for k, v in {"card_busy": self.start_failures,
                                                 "transport": self.harness_failures}.items() if v}


def run_on_flaky_host(repo: Path, good: str, bad: str, where: Path, seed: int, start_fails: float = 0.3,
                      harness_dies: float = 0.1, timeout_s: float = 1800.0) -> FlakyRun:
    """`bisect-npu run` of `repo`'s accuracy case on the flaky host seeded `seed`."""
    recipe = flaky_recipe(where, start_fails, harness_dies, seed)
    session = where / "session"
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", good, "--bad", bad, "--recipe", str(recipe),
                           "--session", str(session), "--no-fix", "--no-verdict-store", "--json", "--quiet"],
                          cwd=where, capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = done.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    entries = journal(session)
    retries = [r for r in entries if r["type"] == "retry"]
    return FlakyRun(done.returncode, summary.get("culprit"), len(retries), failures(where / "starts.txt"),
                    failures(where / "harness.txt"), dict(Counter(r["kind"] for r in retries)),
                    sum(1 for s in entries if s["type"] == "step" and s["verdict"]["kind"] == "skip"),
                    done.stdout[-2000:] + done.stderr[-3000:])
