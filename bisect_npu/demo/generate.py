"""Write the demo upstream: a git history of `tinyvllm` with six seeded regressions, the fifth
brought in by moving the pin of its dependency `minivllm` (bisect_npu.demo.dependency), the sixth
in the MoE variant's router (bisect_npu.demo.moe).

`generate_upstream(dest, seed)` writes both repositories with `git fast-import` (a few seconds for
200 commits), fixed authors and dates so a seed always yields the same shas, and returns the
manifest of ground truth that `ensure_upstream` keeps next to the repository.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

from bisect_npu.demo import dependency as D
from bisect_npu.demo import moe as MOE
from bisect_npu.demo import nightly as N
from bisect_npu.demo import patches as P
from bisect_npu.demo.manifest import CaseTruth, CommitRef, CompiledTouch, DependencyTruth, Manifest, SettingsTruth
from bisect_npu.demo.writer import Commit, History, templates
from bisect_npu.paths import cache_root

GENERATOR_VERSION = "6"
TEMPLATE_DIR = Path(__file__).resolve().parent / "upstream"
BUILD_COMMAND = ["python", "tools/build_kernels.py"]
MAIN, RELEASE = "main", "v0.9.1-dev"
BRANCH_TAG = "[v0.9.1]"
_EPOCH = 1743494400  # 2025-04-01T08:00:00Z
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
    "dependency": ("demo-dependency",
                   "a minivllm upgrade drops the server's penalty defaults; greedy runs loop",
                   "v0.10.0rc2", "v0.10.0rc3"),
    "accuracy": ("demo-accuracy", "a QA set's accuracy falls from 100% to 60%: long prompts answered wrongly",
                 "v0.9.0", "v0.10.0rc1"),
    "moe-router": ("demo-moe-router", "the MoE model's layer dumps drift from the good end's: tokens go to other "
                   "experts", "v0.10.0rc4", "v0.10.0"),
}
# A case that shows another case's regression another way: its culprit and fixes are that case's
# commits (the history is not changed for it, so no sha moves).
SAME_REGRESSION = {"accuracy": "rope-longseq"}
DEFAULT_CASE = "async-penalty"
# name -> (the good variant at the bad end, as --good-set takes it, the keys that trigger the symptom).
# Besides the trigger each holds differences that change nothing there: the loop guard's tokens, a
# logging variable the engine reads, its thread count at the default, a sampling knob greedy ignores.
# rope-longseq's trigger is the output length: its tokens are judged against the good end's output,
# so the search needs a reference commit (SETTINGS_REFERENCE), where each configuration's own
# output is its reference (a longer output would mismatch the good variant's by length at any commit).
SETTINGS: dict[str, tuple[dict[str, object], list[str]]] = {
    "async-penalty": ({"cases[*].sampling.logprobs": 3, "engine.args.async_scheduling": False,
                       "environment.TINYVLLM_LOGGING_LEVEL": "WARNING", "cases[*].sampling.top_p": 0.9},
                      ["engine.args.async_scheduling"]),
    "spec-decode": ({"cases[*].sampling.temperature": 0.0, "cases[*].sampling.logprobs": 3,
                     "engine.args.num_threads": 1, "environment.TINYVLLM_LOGGING_LEVEL": "WARNING"},
                    ["cases[*].sampling.temperature"]),
    "presence-penalty": ({"cases[*].sampling.presence_penalty": 1.5, "cases[*].sampling.logprobs": 3,
                          "environment.TINYVLLM_LOGGING_LEVEL": "WARNING", "engine.args.num_threads": 1},
                         ["cases[*].sampling.presence_penalty"]),
    # Both server defaults are dropped, but the loop needs only one of them missing: sending
    # presence_penalty alone still loops (from token 47), sending frequency_penalty alone does not.
    "dependency": ({"cases[*].sampling.presence_penalty": 1.5, "cases[*].sampling.frequency_penalty": 1.0,
                    "cases[*].sampling.logprobs": 3, "environment.TINYVLLM_LOGGING_LEVEL": "WARNING"},
                   ["cases[*].sampling.frequency_penalty"]),
    # The drift starts once positions pass 128: 200 tokens show it, 100 end before it.
    "rope-longseq": ({"cases[*].sampling.max_tokens": 100, "cases[*].sampling.logprobs": 3,
                      "environment.TINYVLLM_LOGGING_LEVEL": "WARNING", "engine.args.num_threads": 1},
                     ["cases[*].sampling.max_tokens"]),
}
# name -> the reference commit its settings search needs (`--reference-at`): the case's good end.
SETTINGS_REFERENCE = {"rope-longseq": "v0.9.0"}


def _fillers(state: History, branch: str, count: int, maker: P.FillerMaker) -> None:
    for _ in range(count):
        state.commit(branch, maker.make(state.files[branch]), tag=BRANCH_TAG if branch == RELEASE else "")


def _version(old: str, new: str) -> P.Change:
    return P.Change(f"[Misc] Bump the version to {new}",
                    (P.Patch("tinyvllm/__init__.py", f'__version__ = "{old}"', f'__version__ = "{new}"'),
                     P.Patch("setup.py", f'version="{old}"', f'version="{new}"')))


def _plan(state: History) -> None:
    """The history, in commit-date order. Roles name what the manifest must know."""
    maker = P.FillerMaker(state.rng)
    initial = P.Change("[Feature] tinyvllm: Qwen3 decoder, vLLM sampler, async scheduling, spec decode, server",
                       tuple(P.Patch(path, None, text) for path, text in templates(TEMPLATE_DIR).items()))
    state.commit(MAIN, initial)
    _fillers(state, MAIN, 30, maker)
    state.commit(MAIN, P.Change("[Misc] Pin numpy below 3 in requirements",
                                  (P.Patch("requirements.txt", "numpy<3\n", "numpy>=1.26,<3\n"),)))
    _fillers(state, MAIN, 30, maker)
    state.tag(MAIN, "v0.9.0")
    state.fork(RELEASE, MAIN)

    b, m = RELEASE, MAIN
    breaks = P.BUILD_BREAKS
    _fillers(state, b, 2, maker)
    state.commit(b, P.Change("[Misc] Upgrade the paired vLLM to v0.9.1",
                               (P.Patch("Dockerfile", "ARG VLLM_TAG=v0.9.0", "ARG VLLM_TAG=v0.9.1"),)), tag=BRANCH_TAG)
    _fillers(state, m, 4, maker)
    _fillers(state, b, 3, maker)
    state.commit(b, breaks["argmax-unroll"][0], "break", tag=BRANCH_TAG)
    state.commit(b, breaks["argmax-unroll"][1], "break-fix", tag=BRANCH_TAG)
    _fillers(state, m, 4, maker)
    state.commit(m, P.ASYNC_CULPRIT, "culprit-main:async-penalty")
    _fillers(state, b, 3, maker)
    _fillers(state, m, 4, maker)
    state.commit(b, P.ASYNC_CULPRIT, "culprit:async-penalty", tag=BRANCH_TAG)
    _fillers(state, b, 4, maker)
    state.commit(m, P.ROPE_CULPRIT, "culprit:rope-longseq")
    _fillers(state, m, 5, maker)
    state.commit(b, breaks["version-symbol"][0], "break", tag=BRANCH_TAG)
    state.commit(b, breaks["version-symbol"][1], "break-fix", tag=BRANCH_TAG)
    _fillers(state, b, 4, maker)
    state.commit(m, breaks["bin-counts-type"][0], "break")
    state.commit(m, breaks["bin-counts-type"][1], "break-fix")
    _fillers(state, m, 5, maker)
    state.commit(b, P.OVERRIDE_CULPRIT, "culprit:presence-penalty", tag=BRANCH_TAG)
    _fillers(state, b, 5, maker)
    state.commit(m, P.SPEC_CULPRIT, "culprit:spec-decode")
    _fillers(state, m, 7, maker)
    state.commit(b, _version("0.9.0", "0.9.1"), tag=BRANCH_TAG)
    state.tag(b, "v0.9.1")
    _fillers(state, m, 4, maker)
    state.commit(m, _version("0.9.0", "0.10.0rc1"))
    state.tag(m, "v0.10.0rc1")

    _fillers(state, b, 2, maker)
    state.commit(m, P.UNRELATED_FIX, "unrelated")
    _fillers(state, m, 2, maker)
    state.commit(m, P.ROPE_FIX, "fix:rope-longseq")
    state.commit(b, P.ASYNC_FIX, "fix:async-penalty", tag=BRANCH_TAG)
    _fillers(state, m, 3, maker)
    state.commit(m, P.ASYNC_FIX, "fix:async-penalty")
    _fillers(state, b, 2, maker)
    state.commit(b, P.OVERRIDE_FIX, "fix:presence-penalty", tag=BRANCH_TAG)
    _fillers(state, m, 2, maker)
    state.commit(m, P.SPEC_FIX, "fix:spec-decode")
    _fillers(state, m, 3, maker)
    _fillers(state, b, 2, maker)

    # Late on main, after every other case's range and fix: the server starts taking its defaults
    # from minivllm, then a pin-only commit moves minivllm to a release with its own regression.
    state.commit(m, P.minivllm_adoption(D.OLD_PIN), "adoption:dependency")
    _fillers(state, m, 3, maker)
    state.commit(m, _version("0.10.0rc1", "0.10.0rc2"))
    state.tag(m, "v0.10.0rc2")
    _fillers(state, m, 3, maker)
    state.commit(m, P.minivllm_pin_move(D.OLD_PIN, D.NEW_PIN), "culprit:dependency")
    _fillers(state, m, 3, maker)
    state.commit(m, _version("0.10.0rc2", "0.10.0rc3"))
    state.tag(m, "v0.10.0rc3")

    # After every range above (no existing commit changes): the demo model's nightly case file, as
    # the nightly's case files come after the regressions they catch (bisect_npu/demo/nightly.py).
    _fillers(state, m, 1, maker)
    state.commit(m, N.ADD_CASE, "nightly-case")

    # After that too: the MoE model option, a clean change of its arithmetic, the router GEMM in
    # bf16 and its fix (bisect_npu/demo/moe.py).
    _fillers(state, m, 2, maker)
    state.commit(m, MOE.FEATURE, "feature:moe-router")
    _fillers(state, m, 2, maker)
    state.commit(m, _version("0.10.0rc3", "0.10.0rc4"))
    state.tag(m, "v0.10.0rc4")
    _fillers(state, m, 1, maker)
    state.commit(m, MOE.WEIGHT_BEFORE_DOWN, "clean:moe-router")
    _fillers(state, m, 1, maker)
    state.commit(m, MOE.CULPRIT, "culprit:moe-router")
    _fillers(state, m, 2, maker)
    state.commit(m, _version("0.10.0rc4", "0.10.0"))
    state.tag(m, "v0.10.0")
    _fillers(state, m, 2, maker)
    state.commit(m, MOE.FIX, "fix:moe-router")


def generate_upstream(dest: Path, seed: int = 0, dependency_dest: Path | None = None) -> Manifest:
    """Write the demo repository at `dest` and its dependency's at `dependency_dest` (default: beside
    it, `<dest>-minivllm`); both must not exist or be empty. Returns the manifest of both."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty; remove it or pick another directory")
    dependency, dependency_truth = D.generate_dependency(
        Path(dependency_dest) if dependency_dest is not None else dest.with_name(f"{dest.name}-{D.NAME}"), seed)
    state = History(random.Random(seed), {MAIN: {}}, {MAIN: None}, clock=_EPOCH, authors=_AUTHORS)
    _plan(state)
    sha_of = state.write(dest, MAIN)
    manifest = _manifest(dest, seed, state, sha_of, {"dependency": dependency_truth})
    manifest.dependencies = [dependency]
    return manifest


def _manifest(dest: Path, seed: int, state: History, sha_of: dict[int, str],
              dependency_truths: dict[str, DependencyTruth]) -> Manifest:
    def ref(commit: Commit) -> CommitRef:
        return CommitRef(sha=sha_of[commit.mark], title=commit.title, branch=commit.branch)

    by_role: dict[str, list[Commit]] = {}
    for commit in state.commits:
        if commit.role:
            by_role.setdefault(commit.role, []).append(commit)
    tags = {name: sha_of[mark] for name, mark in state.tags.items()}
    cases = []
    for name, (recipe, symptom, good, bad) in CASES.items():
        role = SAME_REGRESSION.get(name, name)
        (culprit,) = by_role[f"culprit:{role}"]
        assert culprit.parent is not None
        cases.append(CaseTruth(name=name, recipe=recipe, symptom=symptom, good_ref=good, bad_ref=bad,
                               good_sha=tags[good], bad_sha=tags[bad], culprit=ref(culprit),
                               culprit_parent=sha_of[culprit.parent],
                               fixes=[ref(c) for c in by_role.get(f"fix:{role}", [])],
                               dependency=dependency_truths.get(name),
                               settings=SettingsTruth(good_set=SETTINGS[name][0], trigger=SETTINGS[name][1],
                                                      reference_at=SETTINGS_REFERENCE.get(name))
                               if name in SETTINGS else None))
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
    """The cached upstream repository and its manifest, generated on first use; the dependency's
    repository lies beside it (`<cache>/minivllm`)."""
    base = demo_cache_dir(seed)
    repo, dependency, manifest_path = base / "upstream", base / D.NAME, base / "manifest.json"
    if manifest_path.exists() and (repo / ".git").exists() and (dependency / ".git").exists():
        manifest = Manifest.load(manifest_path)
        if manifest.generator_version == GENERATOR_VERSION and manifest.repo == str(repo):
            return repo, manifest
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".upstream-", dir=base))
    try:
        manifest = generate_upstream(staging / "upstream", seed, dependency_dest=staging / D.NAME)
        for made, final in ((staging / "upstream", repo), (staging / D.NAME, dependency)):
            if final.exists():
                shutil.rmtree(final)
            made.rename(final)
        manifest.repo = str(repo)
        manifest.dependency(D.NAME).repo = str(dependency)
        manifest.save(manifest_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return repo, manifest
