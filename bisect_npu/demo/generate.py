"""Write the demo upstream: a git history of `tinyvllm` with four seeded regressions.

`generate_upstream(dest, seed)` writes the repository with `git fast-import` (a few seconds for
150+ commits), fixed authors and dates so a seed always yields the same shas, and returns the
manifest of ground truth that `ensure_upstream` keeps next to the repository.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bisect_npu.demo import patches as P
from bisect_npu.demo.manifest import CaseTruth, CommitRef, CompiledTouch, Manifest
from bisect_npu.errors import InfrastructureError
from bisect_npu.paths import cache_root

GENERATOR_VERSION = "2"
TEMPLATE_DIR = Path(__file__).resolve().parent / "upstream"
BUILD_COMMAND = ["python", "tools/build_kernels.py"]
MAIN, RELEASE = "main", "v0.9.1-dev"
BRANCH_TAG = "[v0.9.1]"
_EPOCH = 1743494400  # 2025-04-01T08:00:00Z
_COMMITTER = "GitHub <noreply@github.com>"
_AUTHORS = ("Li Wei <liwei@example.com>", "Zhang Min <zhangmin@example.com>", "Wang Fang <wangfang@example.com>",
            "Chen Jie <chenjie@example.com>", "Liu Yang <liuyang@example.com>", "Huang Lei <huanglei@example.com>",
            "Zhao Xin <zhaoxin@example.com>", "Sun Hao <sunhao@example.com>", "Maria Rossi <mrossi@example.com>",
            "Sam Taylor <staylor@example.com>", "Priya Nair <pnair@example.com>", "Jonas Berg <jberg@example.com>")
_COMPILED_PREFIXES = ("csrc/", "setup.py", "requirements", "Dockerfile", "CMakeLists.txt", "cmake/")

# name -> (recipe, symptom, good ref, bad ref)
CASES = {
    "async-penalty": ("demo-async-penalty", "greedy + repetition_penalty 1.3 loops under async scheduling",
                      "v0.9.0", "v0.9.1"),
    "rope-longseq": ("demo-rope-longseq", "greedy output drifts once positions pass max_position_embeddings",
                     "v0.9.0", "v0.10.0rc1"),
    "spec-decode": ("demo-spec-decode", "speculative decoding accepts no draft token at temperature 0.6",
                    "v0.9.0", "v0.10.0rc1"),
    "presence-penalty": ("demo-presence-penalty",
                         "the server's presence_penalty default is dropped; sampled runs loop",
                         "v0.9.0", "v0.9.1"),
}
DEFAULT_CASE = "async-penalty"


@dataclass
class _Commit:
    mark: int
    branch: str
    parent: int | None
    title: str
    paths: list[str]
    role: str | None


@dataclass
class _State:
    rng: random.Random
    files: dict[str, dict[str, str]]
    tips: dict[str, int | None]
    stream: bytearray = field(default_factory=bytearray)
    commits: list[_Commit] = field(default_factory=list)
    tags: dict[str, int] = field(default_factory=dict)
    pr: int = 0
    clock: int = _EPOCH
    fork_from: dict[str, int] = field(default_factory=dict)


def _data(payload: str) -> bytes:
    raw = payload.encode("utf-8")
    return b"data %d\n" % len(raw) + raw + b"\n"


def _commit(state: _State, branch: str, change: P.Change, role: str | None = None, tag: str = "") -> _Commit:
    files = state.files[branch]
    before = dict(files)
    P.apply_patches(files, change.patches)
    changed = sorted(p for p in files if files[p] != before.get(p))
    if not changed:
        raise ValueError(f"demo change {change.title!r} changes nothing on {branch}")
    state.pr += state.rng.randint(1, 4)
    state.clock += state.rng.randint(2, 14) * 3600 + state.rng.randint(0, 3599)
    title = f"{tag}{change.title} (#{state.pr})"
    author = state.rng.choice(_AUTHORS)
    message = title + "\n\n" + (change.body + "\n\n" if change.body else "") + f"Signed-off-by: {author}\n"
    mark = len(state.commits) + 1
    out = state.stream
    out += f"commit refs/heads/{branch}\nmark :{mark}\n".encode()
    out += f"author {author} {state.clock} +0000\ncommitter {_COMMITTER} {state.clock} +0000\n".encode()
    out += _data(message)
    parent = state.tips[branch]
    if branch in state.fork_from:
        out += f"from :{state.fork_from.pop(branch)}\n".encode()
    for path in changed:
        out += f"M 100644 inline {path}\n".encode() + _data(files[path])
    out += b"\n"
    record = _Commit(mark, branch, parent, title, changed, role)
    state.commits.append(record)
    state.tips[branch] = mark
    return record


def _fillers(state: _State, branch: str, count: int, maker: P.FillerMaker) -> None:
    for _ in range(count):
        _commit(state, branch, maker.make(state.files[branch]), tag=BRANCH_TAG if branch == RELEASE else "")


def _tag(state: _State, branch: str, name: str) -> None:
    mark = state.tips[branch]
    assert mark is not None
    state.tags[name] = mark
    state.stream += f"reset refs/tags/{name}\nfrom :{mark}\n\n".encode()


def _templates() -> dict[str, str]:
    files = {}
    for path in sorted(TEMPLATE_DIR.rglob("*")):
        rel = path.relative_to(TEMPLATE_DIR).as_posix()
        if path.is_file() and "__pycache__" not in rel and not rel.endswith((".so", ".pyc")):
            files[rel] = path.read_text(encoding="utf-8")
    return files


def _version(old: str, new: str) -> P.Change:
    return P.Change(f"[Misc] Bump the version to {new}",
                    (P.Patch("tinyvllm/__init__.py", f'__version__ = "{old}"', f'__version__ = "{new}"'),
                     P.Patch("setup.py", f'version="{old}"', f'version="{new}"')))


def _plan(state: _State) -> None:
    """The history, in commit-date order. Roles name what the manifest must know."""
    maker = P.FillerMaker(state.rng)
    initial = P.Change("[Feature] tinyvllm: Qwen3 decoder, vLLM sampler, async scheduling, spec decode, server",
                       tuple(P.Patch(path, None, text) for path, text in _templates().items()))
    _commit(state, MAIN, initial)
    _fillers(state, MAIN, 30, maker)
    _commit(state, MAIN, P.Change("[Misc] Pin numpy below 3 in requirements",
                                  (P.Patch("requirements.txt", "numpy<3\n", "numpy>=1.26,<3\n"),)))
    _fillers(state, MAIN, 30, maker)
    _tag(state, MAIN, "v0.9.0")
    state.files[RELEASE] = dict(state.files[MAIN])
    state.tips[RELEASE] = state.tips[MAIN]
    fork_tip = state.tips[MAIN]
    assert fork_tip is not None
    state.fork_from[RELEASE] = fork_tip

    b, m = RELEASE, MAIN
    breaks = P.BUILD_BREAKS
    _fillers(state, b, 2, maker)
    _commit(state, b, P.Change("[Misc] Upgrade the paired vLLM to v0.9.1",
                               (P.Patch("Dockerfile", "ARG VLLM_TAG=v0.9.0", "ARG VLLM_TAG=v0.9.1"),)), tag=BRANCH_TAG)
    _fillers(state, m, 4, maker)
    _fillers(state, b, 3, maker)
    _commit(state, b, breaks["argmax-unroll"][0], "break", tag=BRANCH_TAG)
    _commit(state, b, breaks["argmax-unroll"][1], "break-fix", tag=BRANCH_TAG)
    _fillers(state, m, 4, maker)
    _commit(state, m, P.ASYNC_CULPRIT, "culprit-main:async-penalty")
    _fillers(state, b, 3, maker)
    _fillers(state, m, 4, maker)
    _commit(state, b, P.ASYNC_CULPRIT, "culprit:async-penalty", tag=BRANCH_TAG)
    _fillers(state, b, 4, maker)
    _commit(state, m, P.ROPE_CULPRIT, "culprit:rope-longseq")
    _fillers(state, m, 5, maker)
    _commit(state, b, breaks["version-symbol"][0], "break", tag=BRANCH_TAG)
    _commit(state, b, breaks["version-symbol"][1], "break-fix", tag=BRANCH_TAG)
    _fillers(state, b, 4, maker)
    _commit(state, m, breaks["bin-counts-type"][0], "break")
    _commit(state, m, breaks["bin-counts-type"][1], "break-fix")
    _fillers(state, m, 5, maker)
    _commit(state, b, P.OVERRIDE_CULPRIT, "culprit:presence-penalty", tag=BRANCH_TAG)
    _fillers(state, b, 5, maker)
    _commit(state, m, P.SPEC_CULPRIT, "culprit:spec-decode")
    _fillers(state, m, 7, maker)
    _commit(state, b, _version("0.9.0", "0.9.1"), tag=BRANCH_TAG)
    _tag(state, b, "v0.9.1")
    _fillers(state, m, 4, maker)
    _commit(state, m, _version("0.9.0", "0.10.0rc1"))
    _tag(state, m, "v0.10.0rc1")

    _fillers(state, b, 2, maker)
    _commit(state, m, P.UNRELATED_FIX, "unrelated")
    _fillers(state, m, 2, maker)
    _commit(state, m, P.ROPE_FIX, "fix:rope-longseq")
    _commit(state, b, P.ASYNC_FIX, "fix:async-penalty", tag=BRANCH_TAG)
    _fillers(state, m, 3, maker)
    _commit(state, m, P.ASYNC_FIX, "fix:async-penalty")
    _fillers(state, b, 2, maker)
    _commit(state, b, P.OVERRIDE_FIX, "fix:presence-penalty", tag=BRANCH_TAG)
    _fillers(state, m, 2, maker)
    _commit(state, m, P.SPEC_FIX, "fix:spec-decode")
    _fillers(state, m, 3, maker)
    _fillers(state, b, 2, maker)


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}
    result = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, env=env, check=False)
    if result.returncode != 0:
        raise InfrastructureError(f"git {' '.join(args[:2])} failed in {repo}: "
                                  f"{result.stderr.decode(errors='replace').strip()[-300:]}; is git installed?")
    return result.stdout.decode()


def generate_upstream(dest: Path, seed: int = 0) -> Manifest:
    """Write the demo repository at `dest` (must not exist or be empty) and return its manifest."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty; remove it or pick another directory")
    dest.mkdir(parents=True, exist_ok=True)
    state = _State(random.Random(seed), {MAIN: {}}, {MAIN: None})
    _plan(state)
    _git(dest, "init", "-q", "-b", MAIN)
    marks = dest / ".git" / "demo-marks"
    _git(dest, "fast-import", "--quiet", "--done", f"--export-marks={marks}", stdin=bytes(state.stream) + b"done\n")
    sha_of = {}
    for line in marks.read_text().splitlines():
        mark, sha = line.split()
        sha_of[int(mark[1:])] = sha
    marks.unlink()
    _git(dest, "checkout", "-q", "-f", MAIN)
    return _manifest(dest, seed, state, sha_of)


def _manifest(dest: Path, seed: int, state: _State, sha_of: dict[int, str]) -> Manifest:
    def ref(commit: _Commit) -> CommitRef:
        return CommitRef(sha=sha_of[commit.mark], title=commit.title, branch=commit.branch)

    by_role: dict[str, list[_Commit]] = {}
    for commit in state.commits:
        if commit.role:
            by_role.setdefault(commit.role, []).append(commit)
    tags = {name: sha_of[mark] for name, mark in state.tags.items()}
    cases = []
    for name, (recipe, symptom, good, bad) in CASES.items():
        (culprit,) = by_role[f"culprit:{name}"]
        assert culprit.parent is not None
        cases.append(CaseTruth(name=name, recipe=recipe, symptom=symptom, good_ref=good, bad_ref=bad,
                               good_sha=tags[good], bad_sha=tags[bad], culprit=ref(culprit),
                               culprit_parent=sha_of[culprit.parent],
                               fixes=[ref(c) for c in by_role[f"fix:{name}"]]))
    compiled = [CompiledTouch(sha=sha_of[c.mark], paths=[p for p in c.paths if p.startswith(_COMPILED_PREFIXES)])
                for c in state.commits if any(p.startswith(_COMPILED_PREFIXES) for p in c.paths)]
    return Manifest(generator_version=GENERATOR_VERSION, seed=seed, repo=str(dest), commit_count=len(state.commits),
                    branches={b: sha_of[m] for b, m in state.tips.items() if m is not None}, tags=tags,
                    default_case=DEFAULT_CASE, cases=cases, unrelated_bugfix=ref(by_role["unrelated"][0]),
                    build_failing=[ref(c) for c in by_role["break"]], compiled_touching=compiled,
                    build_command=BUILD_COMMAND)


def demo_cache_dir(seed: int = 0) -> Path:
    """Where the generated upstream lives: `<cache root>/demo/v<generator>/seed-N`. The generator
    version is in the path so two checkouts with different generators never regenerate each other's."""
    return cache_root() / "demo" / f"v{GENERATOR_VERSION}" / f"seed-{seed}"


def ensure_upstream(seed: int = 0) -> tuple[Path, Manifest]:
    """The cached upstream repository and its manifest, generated on first use."""
    base = demo_cache_dir(seed)
    repo, manifest_path = base / "upstream", base / "manifest.json"
    if manifest_path.exists() and (repo / ".git").exists():
        manifest = Manifest.load(manifest_path)
        if manifest.generator_version == GENERATOR_VERSION and manifest.repo == str(repo):
            return repo, manifest
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".upstream-", dir=base))
    try:
        manifest = generate_upstream(staging / "upstream", seed)
        if repo.exists():
            shutil.rmtree(repo)
        (staging / "upstream").rename(repo)
        manifest.repo = str(repo)
        manifest.save(manifest_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return repo, manifest
