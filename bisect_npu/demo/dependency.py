"""Write the demo upstream's dependency: `minivllm`, a pure-Python library shaped like vLLM's
sampling-defaults code, with its own history, tags, an import break, a regression and its later fix.

The upstream (`tinyvllm`) starts importing it late in its history, pinned by `ARG MINIVLLM_TAG`;
moving the pin from OLD_PIN to NEW_PIN brings in the regression: `get_diff_sampling_param` drops the
server's presence_penalty and frequency_penalty defaults, and greedy runs that relied on them loop.
FIX_TAG is the first release with the fix.
"""

from __future__ import annotations

import random
from pathlib import Path

from bisect_npu.demo import patches as P
from bisect_npu.demo.manifest import CommitRef, DependencyRepo, DependencyTruth
from bisect_npu.demo.writer import Commit, History, templates

NAME = "minivllm"
TEMPLATE_DIR = Path(__file__).resolve().parent / "minivllm"
MAIN = "main"
OLD_PIN, NEW_PIN, FIX_TAG = "v0.2.0", "v0.3.0", "v0.3.1"
_EPOCH = 1747353600  # 2025-05-16T00:00:00Z: v0.2.0 is out before the upstream adopts it, v0.3.0 before the
# pin move, v0.3.1 after it
_AUTHORS = ("Ana Souza <asouza@example.com>", "Tom Becker <tbecker@example.com>", "Kenji Sato <ksato@example.com>",
            "Olga Ivanova <oivanova@example.com>", "Ravi Kumar <rkumar@example.com>", "Emma Brown <ebrown@example.com>",
            "Lucas Martin <lmartin@example.com>", "Mei Lin <mlin@example.com>")


def _example(name: str, count: int) -> str:
    return ('"""Example: ' + name.replace("_", " ") + '."""\n\nfrom minivllm.config import get_diff_sampling_param\n\n'
            f'print(get_diff_sampling_param(None, {{"temperature": 0.{count % 10}, "max_new_tokens": {count}}}))\n')


def _version(old: str, new: str) -> P.Change:
    return P.Change(f"[Misc] Bump the version to {new}",
                    (P.Patch("minivllm/__init__.py", f'__version__ = "{old}"', f'__version__ = "{new}"'),
                     P.Patch("pyproject.toml", f'version = "{old}"', f'version = "{new}"')))


# An import break: the request resolution moves, and engines that import it from minivllm.protocol
# fail until the next commit re-exports it.
_PROTOCOL_DOC = '''"""OpenAI-style request fields and the sampling parameters they resolve to.
'''
_SAMPLING_DEFAULTS_DOC = '''"""The sampling parameters an OpenAI-style request resolves to.
'''
_PROTOCOL_FIELDS = '''"""OpenAI-style request fields (minivllm.sampling_defaults resolves them)."""

from __future__ import annotations

# The sampling fields an OpenAI request may send.
REQUEST_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                           "frequency_penalty", "max_tokens", "seed", "logprobs")
'''
_REEXPORT_BEFORE = "from __future__ import annotations\n\n# The sampling fields"
_REEXPORT_AFTER = ("from __future__ import annotations\n\nfrom minivllm.sampling_defaults import to_sampling_params\n\n"
                   '# Engines import to_sampling_params from here.\n__all__ = ["REQUEST_SAMPLING_FIELDS", '
                   '"to_sampling_params"]\n\n# The sampling fields')


def _import_break(protocol: str) -> tuple[P.Change, P.Change]:
    moved = protocol.replace(_PROTOCOL_DOC, _SAMPLING_DEFAULTS_DOC)
    return (
        P.Change("[Refactor] Move request resolution to minivllm.sampling_defaults",
                 (P.Patch("minivllm/sampling_defaults.py", None, moved),
                  P.Patch("minivllm/protocol.py", None, _PROTOCOL_FIELDS)),
                 "minivllm.protocol keeps the request fields only."),
        P.Change("[BugFix] Re-export to_sampling_params from minivllm.protocol",
                 (P.Patch("minivllm/protocol.py", _REEXPORT_BEFORE, _REEXPORT_AFTER),),
                 "Engines importing it from minivllm.protocol failed with ImportError since the move."),
    )


# The regression: the server's presence/frequency penalty defaults are dropped (vLLM issue #50767's
# shape: they are OpenAI request fields, not Hugging Face GenerationConfig keys).
_KEYS_INLINE = '''    available_params = [
        "repetition_penalty",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "max_new_tokens",
    ]
    diff = {p: config[p] for p in available_params if config.get(p) is not None}
'''
_KEYS_NAMED = '''    diff = {p: config[p] for p in _GENERATION_CONFIG_KEYS if config.get(p) is not None}
'''
_KEYS_ANCHOR = "\n\ndef get_diff_sampling_param("
_KEYS_BAD = '''

# The sampling keys of a Hugging Face GenerationConfig.
_GENERATION_CONFIG_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
'''
_KEYS_FIXED = '''

# The sampling keys of a Hugging Face GenerationConfig, and the OpenAI penalties that
# --override-generation-config sets as server defaults although no GenerationConfig has them.
_GENERATION_CONFIG_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens",
                           "presence_penalty", "frequency_penalty")
'''
CULPRIT = P.Change(
    "[Refactor] Take get_diff_sampling_param's keys from the GenerationConfig sampling keys",
    (P.Patch("minivllm/config.py", _KEYS_INLINE, _KEYS_NAMED),
     P.Patch("minivllm/config.py", _KEYS_ANCHOR, _KEYS_BAD + _KEYS_ANCHOR)),
    "One named list of Hugging Face GenerationConfig sampling keys instead of a literal in the function.",
)


def fix_of(culprit_pr: int) -> P.Change:
    """The fix, citing the culprit's PR as vLLM's fixes do."""
    return P.Change(
        "[BugFix] Keep presence_penalty and frequency_penalty from --override-generation-config",
        (P.Patch("minivllm/config.py", _KEYS_BAD, _KEYS_FIXED),
         P.Patch("tests/test_config.py", None, '''"""The server's penalty defaults survive get_diff_sampling_param."""

from minivllm.config import get_diff_sampling_param


def test_override_keeps_the_openai_penalties():
    override = {"presence_penalty": 1.5, "frequency_penalty": 1.0, "max_new_tokens": 64}
    assert get_diff_sampling_param(None, override) == {"presence_penalty": 1.5, "frequency_penalty": 1.0,
                                                       "max_tokens": 64}
''')),
        f"Since #{culprit_pr} get_diff_sampling_param dropped the override's presence_penalty and "
        "frequency_penalty, so requests relying on the server defaults ran without them and greedy "
        f"decoding looped. Fixes a regression from #{culprit_pr}.",
    )


UNRELATED_FIX = P.Change(
    "[BugFix] Reject a max_tokens below 1 in to_sampling_params",
    (P.Patch("minivllm/sampling_defaults.py", "    return params\n",
             '    if params.get("max_tokens") is not None and params["max_tokens"] < 1:\n'
             '        raise ValueError(f"max_tokens must be at least 1, got {params[\'max_tokens\']}")\n'
             "    return params\n"),),
    "A request with max_tokens 0 reached the engine and generated nothing without an error.",
)


def _plan(history: History) -> None:
    """The history in commit-date order: v0.1.0, v0.2.0 (OLD_PIN), the import break and the culprit,
    v0.3.0 (NEW_PIN), an unrelated fix and the fix, v0.3.1 (FIX_TAG), more traffic."""
    maker = P.FillerMaker(history.rng, package=NAME, example=_example)
    files = templates(TEMPLATE_DIR)
    history.commit(MAIN, P.Change("[Core] minivllm: server sampling defaults and OpenAI request fields",
                                  tuple(P.Patch(path, None, text) for path, text in files.items())))

    def fillers(count: int) -> None:
        for _ in range(count):
            history.commit(MAIN, maker.make(history.files[MAIN]))

    fillers(8)
    history.commit(MAIN, _version("0.1.0.dev0", "0.1.0"))
    history.tag(MAIN, "v0.1.0")
    fillers(9)
    history.commit(MAIN, _version("0.1.0", "0.2.0"))
    history.tag(MAIN, OLD_PIN)
    fillers(2)
    broken, repaired = _import_break(files["minivllm/protocol.py"])
    history.commit(MAIN, broken, "import-break")
    history.commit(MAIN, repaired)
    fillers(4)
    culprit = history.commit(MAIN, CULPRIT, "culprit")
    fillers(5)
    history.commit(MAIN, _version("0.2.0", "0.3.0"))
    history.tag(MAIN, NEW_PIN)
    fillers(3)
    history.commit(MAIN, UNRELATED_FIX, "unrelated")
    fillers(2)
    history.commit(MAIN, fix_of(history.pr_of(culprit)), "fix")
    fillers(2)
    history.commit(MAIN, _version("0.3.0", "0.3.1"))
    history.tag(MAIN, FIX_TAG)
    fillers(3)


def generate_dependency(dest: Path, seed: int = 0) -> tuple[DependencyRepo, DependencyTruth]:
    """Write minivllm's repository at `dest` (must not exist or be empty); its manifest entry, and
    the truth of the pin move OLD_PIN -> NEW_PIN."""
    history = History(random.Random(f"{NAME}:{seed}"), {MAIN: {}}, {MAIN: None}, clock=_EPOCH, authors=_AUTHORS)
    _plan(history)
    sha_of = history.write(Path(dest), MAIN)
    roles = {c.role: c for c in history.commits if c.role}
    tags = {name: sha_of[mark] for name, mark in history.tags.items()}

    def ref(commit: Commit) -> CommitRef:
        return CommitRef(sha=sha_of[commit.mark], title=commit.title, branch=commit.branch)

    culprit = roles["culprit"]
    assert culprit.parent is not None
    repo = DependencyRepo(name=NAME, repo=str(dest), commit_count=len(history.commits),
                          branches={b: sha_of[m] for b, m in history.tips.items() if m is not None}, tags=tags,
                          import_failing=[ref(roles["import-break"])], unrelated_bugfix=ref(roles["unrelated"]))
    truth = DependencyTruth(name=NAME, pin_file="Dockerfile", pin_arg=P.MINIVLLM_PIN_ARG, old_pin=OLD_PIN,
                            new_pin=NEW_PIN, old_sha=tags[OLD_PIN], new_sha=tags[NEW_PIN], culprit=ref(culprit),
                            culprit_parent=sha_of[culprit.parent], fix=ref(roles["fix"]), fix_tag=FIX_TAG)
    return repo, truth
