"""A record: one run of a recipe's cases kept as a reference, with where it ran.

Layout (``bisect-npu record --out DIR``):

    DIR/record.json                 the manifest below
    DIR/obs-<case>-t0.json          each case's observation (every alignment stage in extra.stages)
    DIR/obs-<case>-t0.dump/         its layer dumps, MindStudio Probe's layout (step{N}/rank0/...)

The manifest says which recipe (name, digest, and a digest of its cases alone, which a reference
recorded with another backend or model shares), the backend, model and dtype, the model identity
the probe read (sizes and a vocabulary digest), the host and device, the package versions, and
each case's observation file. It is written first with ``complete: false`` and rewritten with
``complete: true`` once every case is on disk, so an interrupted record is told apart (and the
`record` command that made it, the same recipe version, tree and commit, finishes it, keeping the
cases already on disk; another is refused). Dump paths
are kept relative to DIR, so a record copied from a GPU host reads the same here.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_npu.errors import UsageError
from bisect_npu.observations import Observation

FORMAT = "bisect-npu-record"
VERSION = 1
MANIFEST = "record.json"


def cases_digest(cases: list[dict[str, Any]]) -> str:
    """sha256 of the cases (ids, prompts or messages, sampling): what two records must share to be compared."""
    return hashlib.sha256(json.dumps(cases, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def is_record(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).exists()


def made_by_words(name: str, digest: str, tree: Path | None, commit: str) -> str:
    """What made a record, in words: its recipe version, tree and commit."""
    return (f"recipe {name} {digest}, tree {tree.resolve() if tree else 'the current directory'} at "
            f"{commit or 'an unnamed commit'}")


def made_by(manifest: dict[str, Any]) -> str:
    """What made the record a manifest describes (`made_by_words`)."""
    recipe = manifest.get("recipe") or {}
    tree = manifest.get("tree")
    return made_by_words(str(recipe.get("name")), str(recipe.get("digest")), Path(tree) if tree else None,
                    str(manifest.get("commit") or ""))


def finish_command(out: Path, manifest: dict[str, Any]) -> str:
    """The `record` command that made an interrupted record, which finishes it."""
    recipe = manifest.get("recipe") or {}
    tree = manifest.get("tree")
    return record_command(str(recipe.get("source") or recipe.get("name") or "RECIPE"), out,
                          Path(tree) if tree else None, str(manifest.get("commit") or ""))


def record_command(recipe: str, out: Path, tree: Path | None, commit: str) -> str:
    """`bisect-npu record` for a recipe, an --out, a --tree and a --commit, as it is typed."""
    words = ["bisect-npu", "record", "--recipe", recipe, "--out", str(out)]
    if tree:
        words += ["--tree", str(tree)]
    if commit:
        words += ["--commit", commit]
    return shlex.join(words)


def _next_step(path: Path, recipe: str | None) -> str:
    recipe_arg = recipe or "RECIPE"
    return f"bisect-npu record --recipe {recipe_arg} --out {path} --force"


@dataclass(frozen=True)
class Record:
    """A complete record read back: its manifest and each case's observation (dump paths resolved)."""

    path: Path
    manifest: dict[str, Any]
    observations: dict[str, Observation]

    @property
    def recipe(self) -> str:
        return str(self.manifest.get("recipe", {}).get("name", ""))

    @property
    def cases_digest(self) -> str:
        return str(self.manifest.get("recipe", {}).get("cases_digest", ""))

    @property
    def identity(self) -> dict[str, Any]:
        return dict(self.manifest.get("model_identity") or {})

    def where(self) -> str:
        """One line: backend, device, dtype, engine version."""
        versions = self.manifest.get("versions") or {}
        engine = next((f"{name} {versions[name]}" for name in ("vllm", "transformers", "tinyvllm") if name in versions),
                      "")
        parts = [self.manifest.get("backend"), self.manifest.get("device"), self.manifest.get("dtype"), engine]
        return ", ".join(str(p) for p in parts if p)


def relative_dumps(observation: dict[str, Any], root: Path) -> dict[str, Any]:
    """The observation with its dump paths made relative to the record's directory."""
    def rel(value: Any) -> Any:
        if isinstance(value, str) and Path(value).is_absolute() and Path(value).is_relative_to(root):
            return str(Path(value).relative_to(root))
        return value

    observation["logits_dump"] = rel(observation.get("logits_dump"))
    stages = observation.get("extra", {}).get("stages")
    if isinstance(stages, dict):
        stages["forward"] = rel(stages.get("forward"))
    return observation


def load_observation(path: Path) -> Observation:
    """An observation file, a relative dump path that lies beside it (a record's) resolved against its
    directory; any other path as written."""
    obs = Observation.load(path)

    def resolve(value: Any) -> Any:
        beside = path.parent / str(value)
        return str(beside) if not Path(str(value)).is_absolute() and beside.exists() else value

    if obs.logits_dump:
        obs.logits_dump = resolve(obs.logits_dump)
    stages = obs.extra.get("stages")
    if isinstance(stages, dict) and stages.get("forward"):
        stages["forward"] = resolve(stages["forward"])
    return obs


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the record at `path`; a missing or foreign one is a one-line UsageError."""
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        raise UsageError(f"{path} is not a record (no {MANIFEST}); make one with: bisect-npu record --recipe RECIPE "
                         f"--out {path}")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{manifest_path} is not valid JSON ({exc.__class__.__name__}); record it again: "
                         f"{_next_step(path, None)}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UsageError(f"{manifest_path} is not a {FORMAT} manifest; point at a directory `bisect-npu record` wrote")
    if manifest.get("version") != VERSION:
        raise UsageError(f"{manifest_path} is record version {manifest.get('version')!r}, this bisect-npu reads "
                         f"{VERSION}; record it again with this version")
    return manifest


def read_record(path: str | Path) -> Record:
    """A complete record; an interrupted one (or one missing a file) is refused with the command to redo it."""
    root = Path(path)
    manifest = read_manifest(root)
    recipe = manifest.get("recipe", {}).get("name")
    cases = manifest.get("cases") or {}
    if not manifest.get("complete"):
        done = [case for case, file in cases.items() if (root / file).exists()]
        raise UsageError(f"record {root} is incomplete (interrupted after {len(done)} of "
                         f"{len(manifest.get('case_ids') or cases)} cases); finish it with the command that made "
                         f"it: {finish_command(root, manifest)}")
    observations = {}
    for case, file in cases.items():
        if not (root / file).exists():
            raise UsageError(f"record {root} lacks {file} (case {case}); record it again: {_next_step(root, recipe)}")
        observations[case] = load_observation(root / file)
    return Record(root, manifest, observations)


def golden_observation_files(path: Path, recipe_name: str, digest_of_cases: str) -> list[Path]:
    """A recipe's golden reference given as a record: its observation files, once the record is complete
    and made from the same cases."""
    record = read_record(path)
    if record.cases_digest != digest_of_cases:
        raise UsageError(f"record {path} was made for other cases (recipe {record.recipe}, cases "
                         f"{record.cases_digest}) than recipe {recipe_name}'s ({digest_of_cases}); record "
                         f"the reference from this recipe's cases: {_next_step(path, recipe_name)}")
    return [path / file for file in record.manifest["cases"].values()]
