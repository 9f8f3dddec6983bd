"""BuildKey: a content hash of everything an image's compiled part is made from.

Two commits with the same key can share one full image build: the second only needs its Python
tree laid over the first's image. The key is read from git objects (tree and blob ids of the
compiled inputs, the Dockerfile's facts) without a checkout, so keying a 200-commit range is a
fraction of a second.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import git

from bisect_npu.upstream.dockerfile import DockerfileReader

KEY_SCHEMA = 3
DIGEST_CHARS = 16
NO_DOCKERFILE = "(none)"  # the key input of a commit without the Dockerfile asked for

# Top-level paths whose content goes into the compiled part of a vllm-ascend image (.gitmodules:
# where csrc/'s submodules come from; their pinned commits are in csrc's tree already).
COMPILED_PATHS: tuple[str, ...] = ("csrc", "CMakeLists.txt", "cmake", "setup.py", ".gitmodules")
REQUIREMENTS_PATTERN = "requirements*.txt"
# A file setup.py loads by its path in the repository, `os.path.join(ROOT_DIR, "vllm_ascend", "envs.py")`:
# envs.py's build defaults (COMPILE_CUSTOM_KERNELS, SOC_VERSION, MAX_JOBS) and, on main,
# vllm_ascend/device/hardware.py (which chip the build targets).
_SETUP_READS = re.compile(r"os\.path\.join\(\s*ROOT_DIR\s*,\s*((?:[\"'][^\"'\n]+[\"']\s*,?\s*)+)\)")
_LITERAL = re.compile(r"[\"']([^\"'\n]+)[\"']")


def setup_reads(setup_py: str) -> list[str]:
    """Repository paths setup.py names with literal parts under ROOT_DIR (files and folders alike;
    the key keeps the files that exist)."""
    return sorted({"/".join(_LITERAL.findall(match.group(1))) for match in _SETUP_READS.finditer(setup_py)})


def is_compiled_input(path: str, dockerfile: str = "Dockerfile") -> bool:
    """True for a repository path that only the full build reads, so the overlay leaves it out
    (the files setup.py loads, such as vllm_ascend/envs.py, are in the key but are Python the
    candidate also imports: the overlay keeps them)."""
    top = path.split("/", 1)[0]
    return (top in COMPILED_PATHS or path == dockerfile
            or ("/" not in path and fnmatch.fnmatchcase(path, REQUIREMENTS_PATTERN)))


@dataclass(frozen=True)
class BuildKey:
    """`digest` names the image (`...:key-<digest>`); `inputs` says what went into it, for reports."""

    digest: str
    inputs: Mapping[str, str] = field(default_factory=dict)

    @property
    def has_dockerfile(self) -> bool:
        """Whether the commit holds the Dockerfile its image would be built from."""
        return self.inputs.get("dockerfile") != NO_DOCKERFILE


class BuildKeyReader:
    """Computes keys for many commits of one repository, parsing each Dockerfile blob once."""

    def __init__(self, repo: git.Repo, build_args: Mapping[str, str] | None = None,
                 dockerfile: str = "Dockerfile", base_images: Callable[[str], str] | None = None) -> None:
        self.repo = repo
        self.build_args = dict(build_args or {})
        self.dockerfile = dockerfile
        self.base_images = base_images  # the lab's mirror map (builders/registry.py), if any
        self._dockerfiles = DockerfileReader(repo, dockerfile)
        self._setup_reads: dict[str, list[str]] = {}  # setup.py blob -> the paths it names

    def _setup_inputs(self, tree: git.Tree) -> dict[str, str]:
        """{path: blob id} of the files the commit's setup.py loads (not folders: setup.py's own
        outputs and install targets are named the same way)."""
        try:
            setup = tree / "setup.py"
        except KeyError:
            return {}
        paths = self._setup_reads.get(setup.hexsha)
        if paths is None:
            paths = setup_reads(setup.data_stream.read().decode("utf-8", errors="replace"))
            self._setup_reads[setup.hexsha] = paths
        found = {}
        for path in paths:
            try:
                entry = tree / path
            except KeyError:
                continue
            if entry.type == "blob":
                found[path] = entry.hexsha
        return found

    def key(self, sha: str) -> BuildKey:
        tree = self.repo.commit(sha).tree
        inputs: dict[str, str] = {"schema": str(KEY_SCHEMA)}
        for entry in tree:
            # `path`, not `name`: GitPython cannot name a top-level submodule entry (a gitlink).
            path = str(entry.path)
            if path in COMPILED_PATHS or fnmatch.fnmatchcase(path, REQUIREMENTS_PATTERN):
                inputs[f"{entry.type}:{path}"] = entry.hexsha
        for path, blob_sha in self._setup_inputs(tree).items():
            inputs[f"setup:{path}"] = blob_sha
        if "pyproject.toml" in tree:
            # Only its build requirements (the torch-npu the kernels compile against under build
            # isolation): lint settings and metadata change far more often and compile nothing.
            inputs["pyproject:build-system"] = _build_system(tree / "pyproject.toml")
        try:
            blob = tree / self.dockerfile
        except KeyError:
            inputs["dockerfile"] = NO_DOCKERFILE
        else:
            # The whole Dockerfile counts (its RUN steps build the image); base image and VLLM_TAG
            # are listed separately because they are what a reader wants to see in the report.
            inputs["dockerfile"] = blob.hexsha
            facts = self._dockerfiles.facts_of_blob(blob.hexsha)
            inputs["base_image"] = facts.base_image or ""
            pulled = self.base_images(facts.base_image) if self.base_images and facts.base_image else None
            if pulled and pulled != facts.base_image:
                inputs["base_image_pulled"] = pulled  # where a mirror map fetches it from
            # A build arg counts only for an ARG the Dockerfile declares (docker ignores the others).
            inputs["vllm_tag"] = paired_vllm({**facts.args, **{name: value for name, value in self.build_args.items()
                                                               if name in facts.args}})
        for name, value in sorted(self.build_args.items()):
            inputs[f"arg:{name}"] = value
        canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
        return BuildKey(digest=hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS], inputs=inputs)


def paired_vllm(args: Mapping[str, str]) -> str:
    """The vLLM the image is built with, from the Dockerfile's ARGs as the build args set them:
    `VLLM_COMMIT` (vllm-ascend main's Dockerfile fetches it instead of the tag when set), else
    `VLLM_TAG`."""
    return args.get("VLLM_COMMIT") or args.get("VLLM_TAG") or ""


def _build_system(blob: git.Blob) -> str:
    """A digest of pyproject.toml's [build-system] table; of the whole file when it does not parse."""
    data = blob.data_stream.read()
    try:
        table = tomllib.loads(data.decode("utf-8")).get("build-system", {})
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:DIGEST_CHARS]


def build_key(repo: git.Repo, sha: str, build_args: Mapping[str, str] | None = None,
              dockerfile: str = "Dockerfile") -> BuildKey:
    """The key of one commit's image (see BuildKeyReader for many)."""
    return BuildKeyReader(repo, build_args, dockerfile).key(sha)


def distinct_keys(repo: git.Repo, shas: Iterable[str], build_args: Mapping[str, str] | None = None,
                  dockerfile: str = "Dockerfile") -> dict[str, list[str]]:
    """{digest: [shas with that key, in the order given]}: how many full builds a range can cost."""
    reader = BuildKeyReader(repo, build_args, dockerfile)
    groups: dict[str, list[str]] = {}
    for sha in shas:
        groups.setdefault(reader.key(sha).digest, []).append(sha)
    return groups
