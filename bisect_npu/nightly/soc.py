"""Which Atlas generation (SoC) a nightly case runs on, and so which of vllm-ascend's Dockerfiles
builds its image.

vllm-ascend's nightly lists each case file under its SoC in
`.github/workflows/configs/nightly_config.yaml` (and `weekly_config.yaml`): `a2`, `a3`, `310p`,
`a5`, each entry's `config_file_path` the file's name. Its image workflow
(`schedule_image_build_and_push.yaml`) builds the image of each SoC from its own Dockerfile:
`Dockerfile` (A2), `Dockerfile.a3`, `Dockerfile.310p`, `Dockerfile.a5`. A file those lists do not
name is placed by the SoC its name ends with (`-310p`, `-A3`, `_A3`), else left to the recipe's
default (`Dockerfile`, A2).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SOC_DOCKERFILES = {"a2": "Dockerfile", "a3": "Dockerfile.a3", "310p": "Dockerfile.310p", "a5": "Dockerfile.a5"}
SCHEDULE_CONFIGS = (".github/workflows/configs/nightly_config.yaml", ".github/workflows/configs/weekly_config.yaml")
_NAMED = re.compile(r"(?i)[-_](310p|a2|a3|a5)(?=[-_.]|$)")


@dataclass(frozen=True)
class Soc:
    name: str  # a2, a3, 310p, a5
    how: str  # where it was read: the schedule file, or the file's name

    @property
    def dockerfile(self) -> str:
        return SOC_DOCKERFILES[self.name]


def _listed(config: Any, file_name: str) -> Iterable[str]:
    """The SoC sections of a schedule config whose entries name `file_name`."""
    if not isinstance(config, dict):
        return
    for soc, section in config.items():
        if str(soc).lower() not in SOC_DOCKERFILES or not isinstance(section, dict):
            continue
        for part in section.values():
            entries = part.get("test_config") if isinstance(part, dict) else None
            if isinstance(entries, list) and any(isinstance(e, dict) and str(e.get("config_file_path", "")).rsplit(
                    "/", 1)[-1] == file_name for e in entries):
                yield str(soc).lower()


def soc_of(case_file: str, schedules: dict[str, str]) -> Soc | None:
    """The SoC of `case_file` from the schedule configs' texts (by their path), else its name."""
    name = case_file.rsplit("/", 1)[-1]
    for path, text in schedules.items():
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        found = sorted(set(_listed(config, name)))
        if len(found) == 1:
            return Soc(found[0], f"{path} lists it under {found[0]}")
    match = _NAMED.search(name.removesuffix(".yaml").removesuffix(".yml") + ".")
    return Soc(match.group(1).lower(), f"its name ends with {match.group(0)}") if match else None


def schedules_beside(case_file: Path) -> dict[str, str]:
    """The schedule configs of the checkout a case file lies in (by walking up to it), by path."""
    for folder in case_file.resolve().parents:
        found = {path: (folder / path).read_text(encoding="utf-8") for path in SCHEDULE_CONFIGS
                 if (folder / path).is_file()}
        if found or (folder / ".git").exists():
            return found
    return {}
