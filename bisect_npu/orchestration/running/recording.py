"""Record a reference: run a recipe's cases once each on this host, with the recipe's own backend,
and keep the observations, layer dumps and where they ran as a record (`bisect_npu.alignment.record`).

The probe runs as a session's does (`LocalExecutor`: its own process group, the timeout, the log),
in `tree` (a source checkout put on PYTHONPATH: the demo engine's, a vllm-ascend worktree) or in
the installed packages. The manifest is written before the first case and after each one, and marked
complete only at the end: an interrupted record is refused by `align` until the `record` command
that made it (the same recipe version, tree and commit) finishes it, running only the cases not yet
on disk; another recipe version, tree or commit is refused, naming both.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from bisect_npu.alignment.record import (
    FORMAT,
    MANIFEST,
    VERSION,
    Record,
    finish_command,
    is_record,
    made_by,
    made_by_words,
    read_manifest,
    read_record,
    relative_dumps,
)
from bisect_npu.builders.base import Environment
from bisect_npu.errors import InfrastructureError, UsageError
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.orchestration.running.probe_requests import probe_request
from bisect_npu.recipe.schema import Recipe

DEFAULT_TIMEOUT_S = 3600.0


def _prepare(out: Path, force: bool) -> None:
    """Refuse to overwrite anything without `force`, and anything but a record even with it."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot make the record directory {out} ({exc.strerror}); pass --out with a "
                             "writable place") from None
        return
    if not is_record(out):
        raise UsageError(f"{out} exists and is not a record; choose an empty or new --out")
    if not force:
        raise UsageError(f"{out} already holds a record; pass --force to overwrite it, or choose another --out")
    shutil.rmtree(out)
    out.mkdir(parents=True)


def _resumable(out: Path, recipe: Recipe, force: bool, tree: Path | None, commit: str) -> dict[str, Any] | None:
    """The manifest of an interrupted record at `out` (its finished cases are kept), or None: a
    fresh record is made. One made by another recipe version, tree or commit is refused, naming
    both: its cases would come from two runs under a manifest that names one."""
    if force or not is_record(out):
        return None
    manifest = read_manifest(out)
    if manifest.get("complete"):
        return None
    made, asked = made_by(manifest), made_by_words(recipe.name, recipe.digest(), tree, commit)
    if made != asked:
        raise UsageError(f"{out} is an interrupted record made by {made}; this command asks {asked}: finish it "
                         f"with {finish_command(out, manifest)}, pass --force to record it anew, or choose "
                         "another --out")
    manifest["cases"] = {case: file for case, file in (manifest.get("cases") or {}).items() if (out / file).exists()}
    return manifest


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    tmp = out / f".{MANIFEST}.tmp"
    try:
        tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        tmp.replace(out / MANIFEST)
    except OSError as exc:
        raise UsageError(f"cannot write the record's manifest in {out} ({exc.strerror}); pass --out with a "
                         "writable place") from None


def _where(observation: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    """Device, dtype, versions and model identity, as the probe reported them."""
    versions = observation.get("versions") or {}
    engine_args = observation.get("extra", {}).get("engine_args") or {}
    extra = observation.get("extra") or {}
    device = engine_args.get("device") or extra.get("device") or ("cpu" if recipe.engine.backend == "mini" else None)
    return {"device": device, "dtype": engine_args.get("dtype") or recipe.model.dtype, "versions": versions,
            "model_identity": extra.get("model_identity")}


def record(recipe: Recipe, out: Path, *, force: bool = False, tree: Path | None = None, commit: str = "",
           timeout_s: float = DEFAULT_TIMEOUT_S, python: str | None = None,
           env: dict[str, str] | None = None) -> Record:
    """Run each case of `recipe` once here (with `python`, another venv's interpreter, and `env` added
    to the environment) and write the record to `out`."""
    out = out.resolve()
    manifest = _resumable(out, recipe, force, tree, commit) or _new_manifest(out, recipe, force, tree, commit, python)
    _write_manifest(out, manifest)
    executor = LocalExecutor(env=env, python_paths=["."], python=python or sys.executable)
    where = Environment(kind="worktree", commit=commit, path=str((tree or Path.cwd()).resolve()))
    for case in recipe.cases:
        if case.id in manifest["cases"]:
            continue
        result = executor.run_probe(where, probe_request(recipe, case, commit, 0), out, timeout_s)
        if result.observation is None:
            why = "timed out" if result.timed_out else f"exit {result.returncode}"
            last = result.log_tail.strip().splitlines()[-1:] or ["no output"]
            raise InfrastructureError(f"the probe failed on case {case.id} ({why}: {last[0]}); see {result.log_path}, "
                                      "then run the same record command again (finished cases are kept)")
        path = Path(result.observation)
        observation = relative_dumps(json.loads(path.read_text(encoding="utf-8")), out)
        path.write_text(json.dumps(observation), encoding="utf-8")
        manifest["cases"][case.id] = path.name
        if "device" not in manifest:
            manifest.update(_where(observation, recipe))
        _write_manifest(out, manifest)
    manifest["complete"] = True
    _write_manifest(out, manifest)
    return read_record(out)


def _new_manifest(out: Path, recipe: Recipe, force: bool, tree: Path | None, commit: str,
                  python: str | None) -> dict[str, Any]:
    """An empty `out` and the manifest of a record not yet begun."""
    _prepare(out, force)
    return {
        "format": FORMAT, "version": VERSION, "complete": False,
        "recipe": {"name": recipe.name, "digest": recipe.digest(), "cases_digest": recipe.cases_digest(),
                   "source": recipe.source},
        "backend": recipe.engine.backend, "model": recipe.model.model_dump(mode="json", exclude={"host_path"}),
        "commit": commit, "tree": str(tree.resolve()) if tree else None, "python": python or sys.executable,
        "host": {"node": platform.node(), "machine": platform.machine(), "python": platform.python_version()},
        "case_ids": [case.id for case in recipe.cases], "cases": {}}
