"""A git history of vLLM made from its published source distributions (vLLM's own history is too
large to fetch here): v0.30.0, then the 0.30.0 -> 0.31.0 difference
split into commits by path, in which the two halves of the presence_penalty fix (vLLM PR #50769)
land apart, among unrelated changes; the last commit is tagged v0.31.0 and holds 0.31.0's tree.

- half b, the OpenAI protocol defaults (`presence_penalty: ... = None`, `_DEFAULT_SAMPLING_PARAMS`,
  user -> server default -> OpenAI default) in `vllm/entrypoints/openai/{chat_completion,completion}/protocol.py`;
- half a, `vllm/config/model.py` `get_diff_sampling_param()`'s `available_params` gaining
  "presence_penalty" and "frequency_penalty": the commit that completes the fix.
Until half a lands the rest of `vllm/` is 0.31.0's with those few lines held at 0.30.0's.

The sdists are fetched with pip (`pip download vllm==X --no-binary :all:` fails on the package's
own build, after printing the file's URL, which `pip download --no-deps URL` then fetches) and
cached under $BISECT_NPU_CACHE/sdists.
"""

from __future__ import annotations

import difflib
import filecmp
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from bisect_npu.paths import cache_root
from tests.helpers.gitrepo import git

OLD, NEW = "0.30.0", "0.31.0"
MODEL_PY = "vllm/config/model.py"
CHAT_PROTOCOL = "vllm/entrypoints/openai/chat_completion/protocol.py"
COMPLETION_PROTOCOL = "vllm/entrypoints/openai/completion/protocol.py"
GENERATED = ("PKG-INFO", "vllm.egg-info", "vllm/_version.py", "setup.cfg")  # made by the sdist build, not in git
FIX_A = "[Bugfix] Pass presence/frequency penalty overrides through the generation config"
FIX_B = "[Frontend] OpenAI sampling defaults: user -> server default -> OpenAI default"
COMPILED = ("csrc/", "CMakeLists.txt", "cmake/", "setup.py", "requirements/")


def sdist(version: str, cache: Path | None = None) -> Path:
    """vllm-VERSION.tar.gz from the package index, cached."""
    cache = cache or cache_root() / "sdists"
    path = cache / f"vllm-{version}.tar.gz"
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    listing = subprocess.run([*pip, "download", f"vllm=={version}", "--no-binary", ":all:", "--no-deps",
                              "--no-build-isolation", "-d", str(cache / "tmp"), "-vv"],
                             capture_output=True, text=True, timeout=900)
    urls = re.findall(rf"https://\S+/vllm-{re.escape(version)}\.tar\.gz", listing.stdout + listing.stderr)
    if not urls:
        raise RuntimeError(f"pip printed no URL of vllm-{version}.tar.gz:\n{listing.stdout[-2000:]}")
    subprocess.run([*pip, "download", "--no-deps", "-d", str(cache), urls[0]], check=True, capture_output=True,
                   timeout=1800)
    shutil.rmtree(cache / "tmp", ignore_errors=True)
    return path


def unpack(tarball: Path, into: Path) -> Path:
    with tarfile.open(tarball) as archive:
        archive.extractall(into, filter="data")
    (root,) = [p for p in into.iterdir() if p.is_dir()]
    for name in GENERATED:
        target = root / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    return root


def files_of(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def held_back_a(new_text: str) -> str:
    """0.31.0's model.py with half a undone: available_params without the two penalties."""
    out = re.sub(r'\n\s*"presence_penalty",\n\s*"frequency_penalty",(?=\n\s*"temperature")', "", new_text, count=1)
    assert out != new_text, "0.31.0's available_params no longer looks as VLLM_OVERLAY.md says"
    return out


def held_back_b(old_text: str, new_text: str) -> str:
    """0.30.0's chat protocol with 0.31.0's unrelated changes (the assistant-tokens mask that the rest
    of 0.31.0 no longer passes) but not half b: each changed block taken from 0.31.0 only when it
    is about that mask."""
    old, new = old_text.splitlines(keepends=True), new_text.splitlines(keepends=True)
    out: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        unrelated = op != "equal" and "return_assistant_tokens_mask" in "".join(old[i1:i2] + new[j1:j2])
        out += new[j1:j2] if unrelated else old[i1:i2]
    text = "".join(out)
    assert text not in (old_text, new_text) and "presence_penalty: float | None = 0.0" in text
    return text


def make_series(repo: Path, work: Path) -> dict[str, str]:
    """The repository at `repo`; returns {title: sha} in order (the first is v0.30.0's commit)."""
    old = unpack(sdist(OLD), work / "old")
    new = unpack(sdist(NEW), work / "new")
    old_files, new_files = files_of(old), files_of(new)
    changed = sorted(f for f in old_files | new_files
                     if f not in old_files or f not in new_files or not filecmp.cmp(old / f, new / f, shallow=False))
    shutil.copytree(old, repo, symlinks=True)
    git(repo, "init", "-q", "-b", "main")
    shas = {f"vLLM {OLD}": _commit(repo, f"vLLM {OLD} (from the source distribution)", tag=f"v{OLD}")}
    fixed = {MODEL_PY, CHAT_PROTOCOL, COMPLETION_PROTOCOL}
    taken: set[str] = set()

    def group(title: str, wanted: Callable[[str], bool], edits: dict[str, str] | None = None) -> None:
        paths = [f for f in changed if f not in taken and wanted(f)]
        taken.update(paths)
        for rel in paths:
            _take(new, repo, rel)
        for rel, text in (edits or {}).items():
            (repo / rel).write_text(text, encoding="utf-8")
        shas[title] = _commit(repo, title)

    text = {rel: ((old / rel).read_text(encoding="utf-8"), (new / rel).read_text(encoding="utf-8"))
            for rel in fixed}
    group("[Docs] Update the documentation", lambda f: f.startswith("docs/") or ("/" not in f and f.endswith(".md")))
    group("[Examples] Update the examples", lambda f: f.startswith("examples/"))
    group("[CI/Build] Kernels, CMake and requirements", lambda f: f.startswith(COMPILED) or f in COMPILED)
    group("[Core] Engine, models and entrypoints", lambda f: f.startswith("vllm/") and f not in fixed,
          {MODEL_PY: held_back_a(text[MODEL_PY][1]),
           CHAT_PROTOCOL: held_back_b(*text[CHAT_PROTOCOL])})
    group("[Tests] v1 engine tests", lambda f: f.startswith("tests/v1/"))
    group(FIX_B, lambda f: f in (CHAT_PROTOCOL, COMPLETION_PROTOCOL))
    group("[Benchmarks] Update the benchmarks", lambda f: f.startswith("benchmarks/"))
    group(FIX_A, lambda f: f == MODEL_PY)
    group("[Tests] Remaining tests", lambda f: f.startswith("tests/"))
    group("[Misc] Tools, CI configuration and the rest", lambda f: True)
    git(repo, "tag", f"v{NEW}")
    assert not git(repo, "status", "--porcelain"), "the series left files uncommitted"
    assert files_of(repo) - {".git"} >= new_files and _same_tree(repo, new, new_files)
    return shas


def _take(new: Path, repo: Path, rel: str) -> None:
    """Make `rel` in the repository what it is in 0.31.0 (removed where 0.31.0 has none)."""
    source, target = new / rel, repo / rel
    if source.exists() or source.is_symlink():
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()
        shutil.copy2(source, target, follow_symlinks=False)
    elif target.exists() or target.is_symlink():
        target.unlink()


def _commit(repo: Path, title: str, tag: str | None = None) -> str:
    git(repo, "add", "-A", "--force")  # all the sdist holds, whatever .gitignore says
    env_dates = {"GIT_AUTHOR_DATE": "2026-10-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-10-01T00:00:00Z"}
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=Series", "-c", "user.email=series@example.com",
                    "commit", "-q", "--no-verify", "-m", title], check=True, env={**os.environ, **env_dates})
    if tag:
        git(repo, "tag", tag)
    return git(repo, "rev-parse", "HEAD")


def _same_tree(repo: Path, new: Path, new_files: set[str]) -> bool:
    tracked = set(git(repo, "ls-files").splitlines())
    return tracked == new_files and all(filecmp.cmp(repo / f, new / f, shallow=False) for f in new_files
                                        if not (new / f).is_symlink())
