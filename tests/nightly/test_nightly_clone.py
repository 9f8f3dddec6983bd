"""Every single-node nightly case file of a real vllm-ascend clone, imported benchmark by
benchmark: each recipe either passes `plan` building from the Dockerfile of the SoC the nightly's
schedule runs it on, or is refused in one line naming what is missing.

Slow (a `plan` per benchmark, minutes): run by hand with a clone,
`BISECT_NPU_VLLM_ASCEND=PATH pytest -m slow tests/nightly/test_nightly_clone.py -s` (it prints the figures).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu import api
from bisect_npu.errors import UsageError
from bisect_npu.nightly.cases import benchmark_names, case_names, read_case_file

CLONE = os.environ.get("BISECT_NPU_VLLM_ASCEND")
CONFIGS = "tests/e2e/nightly/single_node/models/configs"
SCHEDULE = ".github/workflows/configs/nightly_config.yaml"
DOCKERFILES = {"a2": "Dockerfile", "a3": "Dockerfile.a3", "310p": "Dockerfile.310p", "a5": "Dockerfile.a5"}


def scheduled_soc(schedule: str, name: str) -> str | None:
    """The top-level section of the schedule text whose entry names the file (read line by line,
    apart from the importer's YAML reading), else the SoC the file's name ends with."""
    section = None
    for line in schedule.splitlines():
        if re.match(r"^[A-Za-z0-9_]+:\s*$", line):
            section = line.rstrip(":").strip().lower()
        elif re.match(rf"^\s+config_file_path:\s*['\"]?{re.escape(name)}['\"]?\s*$", line):
            return section
    match = re.search(r"(?i)[-_](310p|a2|a3|a5)$", name.removesuffix(".yaml"))
    return match.group(1).lower() if match else None


@pytest.mark.slow
@pytest.mark.skipif(not CLONE, reason="BISECT_NPU_VLLM_ASCEND names no vllm-ascend clone")
def test_every_single_node_case_imports_and_plans_or_is_refused_naming_what_is_missing(tmp_path: Path) -> None:
    clone = Path(str(CLONE))
    schedule = (clone / SCHEDULE).read_text(encoding="utf-8") if (clone / SCHEDULE).is_file() else ""
    planned, refused, files = 0, 0, sorted((clone / CONFIGS).glob("*.yaml"))
    assert files
    for file in files:
        raw = read_case_file(file.read_text(encoding="utf-8"), file.name)
        soc = scheduled_soc(schedule, file.name)
        for case in case_names(raw) or [None]:
            for benchmark in benchmark_names(raw, case):
                try:
                    imported = api.import_nightly(file, case=case, benchmark=benchmark)
                except UsageError as exc:
                    assert "\n" not in str(exc) and str(exc).startswith(str(file)), exc
                    refused += 1
                    continue
                recipe = tmp_path / f"{imported.recipe.name}.yaml"
                recipe.write_text(imported.text, encoding="utf-8")
                assert imported.recipe.build.dockerfile == DOCKERFILES[soc or "a2"], (file.name, soc)
                done = subprocess.run([sys.executable, "-m", "bisect_npu", "plan", "--repo", str(clone), "--good",
                                       "HEAD~2", "--bad", "HEAD", "--recipe", str(recipe), "--executor", "docker"],
                                      capture_output=True, text=True, timeout=300, check=False)
                if done.returncode == 0:
                    assert f"of {imported.recipe.build.dockerfile} " in done.stdout, done.stdout
                    planned += 1
                else:  # refused before anything runs: one line naming the cause
                    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
                    refused += 1
    print(f"{len(files)} case files: {planned} benchmarks planned, {refused} refused with the missing piece named")
    assert planned > 0
