"""Accuracy harnesses run against a candidate's OpenAI-compatible server, sample by sample.

Each runner (`lm_eval`, `aisbench`, `command`) starts its harness as a subprocess with an
argument list (never a shell), pointed at the server, and turns the harness's OWN per-sample
output (lm-eval's samples JSONL, AISBench's prediction and result files, the command's JSON
lines) into per-sample outcome dicts (`{"id", "correct", "runs", "prompt", "output", "target"}`,
the contract's `SampleOutcome`). An aggregate score is never read.

Part of the probe: standard library and relative imports only. A harness lives in a venv of its
own (its packages clash with the engine's), made by a make target under the harness home
(`$BISECT_NPU_HARNESS_HOME`, default `~/.cache/bisect-npu/harness`) with its dependencies held at
the tested versions by a committed lock (pip constraints); `$BISECT_NPU_LM_EVAL` and
`$BISECT_NPU_AIS_BENCH` name another executable. Nothing is downloaded at run time: the
harness runs with the Hugging Face hub and datasets offline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Exit status of `python -m bisect_npu.probe` when a harness failed: the harness, the dataset or
# its output is at fault, not the candidate, so the host stops the run (exit 5) instead of judging.
HARNESS_FAILED_EXIT = 4
# What every harness process sees: no hub, no dataset downloads, no telemetry.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}
EXCERPT_CHARS = 400


class HarnessError(RuntimeError):
    """The harness is missing, failed, wrote nothing or wrote what does not parse: infrastructure."""


def json_lines(path: str, broken: str, errors: str = "strict") -> Iterator[tuple[str, Any]]:
    """Each non-blank line of a JSONL file, parsed, with where it stands (`path:N`); a line that
    does not parse is a HarnessError naming it, ending with `broken` (what that says of the file)."""
    with open(path, encoding="utf-8", errors=errors) as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            where = f"{path}:{number}"
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise HarnessError(f"{where}: not a JSON line ({exc}); {broken}") from exc
            yield where, value


@dataclass(frozen=True)
class HarnessInstall:
    """Where a harness's executable is found and how to get it when it is not there."""

    name: str
    package: str
    version: str
    command: str
    env_var: str
    make_target: str

    @property
    def venv_name(self) -> str:
        return f"{self.package}-{self.version}"

    @property
    def lock(self) -> str:
        """The harness's lock in the repository: its venv's every package, as pip constraints."""
        return f"containers/harness-locks/{self.venv_name}.txt"


# The pinned harness versions; the Makefile's targets install exactly these, each under its lock
# (tests check).
INSTALLS = {
    "lm_eval": HarnessInstall("lm_eval", "lm-eval", "0.4.13", "lm_eval", "BISECT_NPU_LM_EVAL", "harness-lmeval"),
    "aisbench": HarnessInstall("aisbench", "ais-bench-benchmark", "3.1.20260630", "ais_bench", "BISECT_NPU_AIS_BENCH",
                               "harness-aisbench"),
}


def harness_home() -> str:
    """Where the make targets put the harness venvs (shared by every checkout on the host)."""
    return os.environ.get("BISECT_NPU_HARNESS_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "bisect-npu",
                                                                    "harness")


def in_candidate_container() -> bool:
    """Whether the probe runs as the copy `--executor docker` mounts into a candidate's container
    (package `bisect_npu_probe`), where the host's harness venvs are out of reach."""
    return not (__package__ or "").startswith("bisect_npu.")


def find_executable(name: str) -> str:
    """The harness's executable: `$<env var>`, else its venv under the harness home, else PATH."""
    install = INSTALLS[name]
    named = os.environ.get(install.env_var)
    if named:
        if not os.access(named, os.X_OK):
            raise HarnessError(f"${install.env_var}={named} is not an executable; point it at the {install.command} "
                               f"of a venv with {install.package}=={install.version}, or unset it")
        return named
    in_venv = os.path.join(harness_home(), install.venv_name, "bin", install.command)
    if os.access(in_venv, os.X_OK):
        return in_venv
    on_path = shutil.which(install.command)
    if on_path:
        return on_path
    if in_candidate_container():
        raise HarnessError(f"harness {name} is not installed in the candidate's container (not on its PATH): "
                           f"install {install.package}=={install.version} in the image (the Dockerfile, or the "
                           f"base image; `pip install -c {install.lock}` holds its dependencies at the "
                           f"tested versions), or set ${install.env_var} in the recipe's environment to its "
                           f"{install.command} there; a venv on the host does not reach the container")
    raise HarnessError(f"harness {name} is not installed: run `make {install.make_target}` (installs "
                       f"{install.package}=={install.version} into {os.path.dirname(os.path.dirname(in_venv))}), "
                       f"or set ${install.env_var} to its {install.command}")


def excerpt(text: Any) -> str | None:
    if text is None:
        return None
    value = text if isinstance(text, str) else json.dumps(text)
    return value if len(value) <= EXCERPT_CHARS else value[:EXCERPT_CHARS] + "..."


def run_harness(argv: list[str], log_path: str, timeout_s: float, env: dict[str, str] | None = None,
                cwd: str | None = None) -> None:
    """Run one harness process (an argument list, no shell) with its output in `log_path`;
    HarnessError when it cannot start, exits non-zero or outlives `timeout_s`."""
    environ = {**os.environ, **OFFLINE_ENV, **(env or {})}
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=cwd,
                                  timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise HarnessError(f"cannot start the harness {argv[0]}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"the harness {os.path.basename(argv[0])} ran past {timeout_s:.0f}s; "
                           f"log {log_path}") from exc
    if proc.returncode != 0:
        raise HarnessError(f"the harness {os.path.basename(argv[0])} exited {proc.returncode}; log {log_path}: "
                           f"{log_tail(log_path)}")


def log_tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])
