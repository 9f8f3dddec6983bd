"""UnitTestBuilder: a vllm-ascend commit as its worktree plus the cached venv of its vLLM pin, for
`run --unit-test` (vllm-ascend's own CPU unit tests as the oracle).

Nothing is compiled: the worktree (LocalBuilder's) goes on PYTHONPATH with the file `pip install -e`
would have generated (`vllm_ascend/_build_info.py`) and a metadata-only package record, so vLLM
finds vllm-ascend's plugin entry points. The venv is the one of the commit's vLLM pin and
transformers pin (builders/pin_venv.py), built the first time a pin is met.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import git

from bisect_npu.builders.base import Builder, BuildFailed, Environment
from bisect_npu.builders.dated import made_text
from bisect_npu.builders.pin_venv import (
    REQUIREMENT_FILES,
    PinKey,
    PinVenvs,
    commit_pin_refusal,
    missing_commits,
    requirement_lines,
    transformers_line,
)
from bisect_npu.errors import UsageError
from bisect_npu.probe.unit_tests import RULES, UNNAMED_RULES
from bisect_npu.upstream import dockerfile, history

SITE_DIR = ".bisect-npu-site"  # in each worktree: the package record, first on PYTHONPATH
BUILD_INFO = "vllm_ascend/_build_info.py"
BUILD_INFO_TEXT = "# Auto-generated file\n__device_type__ = 'A2'\n"  # what setup.py writes for ascend910b1
PLATFORM_ENTRY = {"vllm.platform_plugins": ["ascend = vllm_ascend:register"]}
# Directories of tests/ut whose tests need NPU cards (vllm-ascend's routing, select_tests.py).
NPU_DIRS = re.compile(r"^(a2|a2_\d+|a3|a3_\d+|310p|310p_\d+)$")
RUNNER = "bisect_npu.probe.unit_tests"
_FULL_SHA = re.compile(r"[0-9a-f]{40}")
_RELEASE_TAG = re.compile(r"v\d+(\.\d+)+\w*")


def npu_refusal(node_id: str) -> str | None:
    """Why a named test cannot run on a CPU, or None: vllm-ascend routes `tests/ut/<module>/a2/...`
    (and a2_2, a3_2, a3_4, 310p) and every `tests/e2e` test to NPU runners. The module
    `tests/ut/_310p/` is not one of those directories: vllm-ascend's CPU job runs it."""
    path = node_id.split("::", 1)[0]
    parts = Path(path).parts
    if parts[:2] == ("tests", "e2e"):
        return f"{node_id}: tests/e2e needs NPU cards (vllm-ascend runs it on NPU runners only)"
    npu = next((part for part in parts[:-1] if NPU_DIRS.match(part)), None)
    if npu is not None:
        return (f"{node_id}: tests under {npu}/ need NPU cards (vllm-ascend routes them to its {npu} runners); "
                "name a test of tests/ut outside a2/, a2_2/, a3_2/, a3_4/, 310p/")
    return None


def unit_test_command(node_ids: list[str], present_at_good: list[str], tests_from: str | None = None) -> list[str]:
    """The command each candidate runs: our runner in the candidate's venv (`python` is the venv's:
    the executor puts its bin/ first on PATH). `--tests-from` only names the files' commit, so a
    verdict kept in the store is one of the same test code."""
    return ["python", "-m", RUNNER, "--rules", str(RULES),
            *(arg for path in present_at_good for arg in ("--present-at-good", path)),
            *(["--tests-from", tests_from] if tests_from else []), *node_ids]


def rules_refusal(command: list[str]) -> str | None:
    """Why a session whose runner command is `command` cannot go on under this bisect-npu's verdict
    rules (its verdicts would mix two rules), or None."""
    rules = next((int(value) for flag, value in itertools.pairwise(command) if flag == "--rules" and value.isdigit()),
                 UNNAMED_RULES)
    if rules == RULES:
        return None
    return (f"this session's unit tests were judged by the verdict rules {rules} and this bisect-npu judges by "
            f"rules {RULES}; start a new session with `bisect-npu run` and the same arguments (results would mix "
            "two rules)")


def pinned_vllm(pin: dockerfile.VllmPin | None) -> str | None:
    """The vLLM a pin builds, as a venv is keyed on it: the commit where the pin names one (with a
    tag beside it the tag is only an approximation), else the release ("v0.23.0" -> "0.23.0"; a
    `VLLM_COMMIT=v0.19.0` is that release)."""
    if pin is None:
        return None
    if pin.commit and _FULL_SHA.fullmatch(pin.commit):
        return pin.commit
    if pin.commit and _RELEASE_TAG.fullmatch(pin.commit):
        return pin.commit.removeprefix("v")
    return pin.release


def commit_pins(repo: git.Repo, commits: list[str]) -> dict[str, list[str]]:
    """The vLLM commits the given vllm-ascend commits pin (no release named), each with the
    vllm-ascend commits that pin it, oldest first."""
    pins: dict[str, list[str]] = {}
    for sha in commits:
        vllm = pinned_vllm(dockerfile.vllm_pin(repo, sha))
        if vllm is not None and _FULL_SHA.fullmatch(vllm):
            pins.setdefault(vllm, []).append(sha)
    return pins


def file_of(node_id: str) -> str:
    return node_id.split("::", 1)[0]


def has_path(repo: git.Repo, sha: str, path: str) -> bool:
    try:
        kind = repo.git.cat_file("-t", f"{sha}:{path}")
    except git.GitCommandError:
        return False
    return bool(kind.strip() == "blob")


def check_unit_tests(repo: git.Repo, node_ids: list[str], good: str, bad: str, tests_from: str | None,
                     candidates: list[str] | None = None, vllm_repo: Path | None = None) -> list[str]:
    """Refuse what cannot be judged before a session starts: a test that needs an NPU, a test file
    at neither end (nor at --unit-test-from), an end without a vLLM pin, a commit of the range
    that pins a vLLM commit when no vLLM clone that has it is given. Returns the named files the
    good end has (their import errors count bad there)."""
    for node_id in node_ids:
        refusal = npu_refusal(node_id)
        if refusal:
            raise UsageError(refusal)
    for end, sha in (("good", good), ("bad", bad)):
        if pinned_vllm(dockerfile.vllm_pin(repo, sha)) is None:
            raise UsageError(f"the {end} end {sha[:12]} has neither {dockerfile.PIN_FILE} nor a Dockerfile with "
                             "ARG VLLM_TAG: its vLLM pin is unknown, so no venv can be made; pass a vllm-ascend "
                             "clone and ends that pin vLLM")
    pinned = commit_pins(repo, list(dict.fromkeys([good, *(candidates or []), bad])))
    if pinned and vllm_repo is None:
        commit, users = next(iter(pinned.items()))
        more = sum(len(shas) for shas in pinned.values()) - 1
        raise UsageError(commit_pin_refusal(commit, f" (pinned by {users[0][:12]}"
                                                    + (f", and {more} more commits of the range" if more else "")
                                                    + ")"))
    missing = missing_commits(vllm_repo, list(pinned)) if pinned and vllm_repo is not None else []
    if missing:
        raise UsageError(f"--vllm-repo {vllm_repo}: it does not have vLLM {missing[0][:12]}, which "
                         f"{pinned[missing[0]][0][:12]} pins" + (f" (and {len(missing) - 1} more pinned commits)"
                                                                 if len(missing) > 1 else "")
                         + f"; fetch it there (git -C {vllm_repo} fetch origin {missing[0]})")
    if tests_from:
        for node_id in node_ids:
            if not has_path(repo, tests_from, file_of(node_id)):
                raise UsageError(f"--unit-test-from {tests_from[:12]}: {file_of(node_id)} does not exist there; name a "
                                 "commit that has the test file")
    sources = {"good end": good, "bad end": bad, **({"--unit-test-from": tests_from} if tests_from else {})}
    for node_id in node_ids:
        if not any(has_path(repo, sha, file_of(node_id)) for sha in sources.values()):
            raise UsageError(f"--unit-test {node_id}: {file_of(node_id)} exists at neither the "
                             + " nor the ".join(f"{name} {sha[:12]}" for name, sha in sources.items())
                             + "; name a test file of the range (git ls-tree -r --name-only BAD tests/ut)")
    at_good = tests_from or good
    return sorted({file_of(n) for n in node_ids if has_path(repo, at_good, file_of(n))})


def entry_points_of(setup_py: str) -> dict[str, list[str]]:
    """The `entry_points={...}` literal of a setup.py (vllm-ascend registers its vLLM plugins
    there); the platform plugin alone when it cannot be read."""
    try:
        tree = ast.parse(setup_py)
    except SyntaxError:
        return dict(PLATFORM_ENTRY)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                break
            if isinstance(value, dict):
                return {str(group): [str(entry) for entry in entries] for group, entries in value.items()}
    return dict(PLATFORM_ENTRY)


def write_package_record(worktree: Path, version: str) -> Path:
    """A `vllm_ascend-VERSION.dist-info` (METADATA, entry_points.txt) in the worktree's site
    directory: what `pip install -e .` registers, without its build of the C++ ops."""
    setup_py = worktree / "setup.py"
    entries = entry_points_of(setup_py.read_text(encoding="utf-8", errors="replace") if setup_py.is_file() else "")
    site = worktree / SITE_DIR
    record = site / f"vllm_ascend-{version}.dist-info"
    record.mkdir(parents=True, exist_ok=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm_ascend\nVersion: {version}\n",
                                     encoding="utf-8")
    (record / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{entry}\n" for entry in items) + "\n" for group, items in entries.items()),
        encoding="utf-8")
    (record / "top_level.txt").write_text("vllm_ascend\n", encoding="utf-8")
    return site


@dataclass(frozen=True)
class TestsFrom:
    """`--unit-test-from REF`: the named test files as they are at `commit`, laid into each candidate."""

    commit: str
    files: tuple[str, ...]


class UnitTestBuilder:
    """LocalBuilder's worktree of a commit, its pin's venv, the package record and build info."""

    def __init__(self, repo: git.Repo, worktrees: Builder, venvs: PinVenvs, tests_from: TestsFrom | None = None
                 ) -> None:
        self.repo = repo
        self.worktrees = worktrees
        self.venvs = venvs
        self.tests_from = tests_from

    def pin_key(self, commit: str) -> PinKey:
        """The venv key of `commit`: the vLLM it builds and its transformers requirement."""
        pin = dockerfile.vllm_pin(self.repo, commit)
        vllm = pinned_vllm(pin)
        if vllm is None:
            raise BuildFailed(f"{commit[:12]} has neither {dockerfile.PIN_FILE} nor a Dockerfile VLLM_TAG: no vLLM pin")
        return PinKey(vllm, transformers_line(requirement_lines(self.requirements(commit))))

    def requirements(self, commit: str) -> list[str]:
        texts = []
        for name in REQUIREMENT_FILES:
            try:
                texts.append(self.repo.git.show(f"{commit}:{name}"))
            except git.GitCommandError:
                continue
        return texts

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        key = self.pin_key(commit)
        venv = self.venvs.acquire(key, requirement_lines(self.requirements(commit)), log_dir,
                                  self.repo.commit(commit).committed_datetime)
        env = self.worktrees.acquire(commit, log_dir)
        worktree = Path(env.path or ".")
        build_info = worktree / BUILD_INFO
        if build_info.parent.is_dir() and not build_info.exists():
            build_info.write_text(BUILD_INFO_TEXT, encoding="utf-8")
        site = write_package_record(worktree, self._version(commit))
        if self.tests_from is not None:
            for path in self.tests_from.files:
                target = worktree / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(self.repo.git.show(f"{self.tests_from.commit}:{path}",
                                                      stdout_as_string=False) + b"\n")
        return env.model_copy(update={"python": str(venv.python), "build_key": key.name,
                                      "venv_made": made_text(venv.made, venv.cutoff),
                                      "python_paths_first": [str(site), *env.python_paths_first]})

    def _version(self, commit: str) -> str:
        """The commit's version as its nearest tag gives it (v0.23.0rc1 -> 0.23.0rc1), else 0.0.0."""
        tags = history.nearest_tags(self.repo, commit, limit=1)
        return tags[0].removeprefix("v") if tags and re.fullmatch(r"v?[\w.]+", tags[0]) else "0.0.0"

    def release(self, env: Environment) -> None:
        self.worktrees.release(env)

    def close(self) -> None:
        self.worktrees.close()

    def build_key(self, commit: str) -> str | None:
        return None  # nothing is compiled: no commit shares a build with another

    def built_keys(self) -> frozenset[str]:
        return frozenset()
