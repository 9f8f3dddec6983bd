"""The source changes of the demo history: regressions, fixes, build breaks and filler.

Each change is a list of text patches applied to one branch's files; `before` must occur exactly
once, so a plan that drifts from the templates fails loudly at generation time.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    path: str
    before: str | None  # None: create (or overwrite) the file with `after`
    after: str


@dataclass(frozen=True)
class Change:
    title: str
    patches: tuple[Patch, ...]
    body: str = ""


def apply_patches(files: dict[str, str], patches: tuple[Patch, ...]) -> list[str]:
    """Apply in place; return the changed paths."""
    changed = []
    for patch in patches:
        if patch.before is None:
            files[patch.path] = patch.after
        else:
            text = files[patch.path]
            count = text.count(patch.before)
            if count != 1:
                raise ValueError(f"demo patch on {patch.path}: expected text found {count} times:\n{patch.before}")
            files[patch.path] = text.replace(patch.before, patch.after)
        changed.append(patch.path)
    return changed


# 1. Async scheduling: the back-fill before sampling moves to the end of the request.
_BACKFILL_GOOD = """        for _ in range(params.max_tokens):
            if self.async_scheduling:
                self._backfill(request)
            token = sample(logits, params, request.prompt_token_ids, request.output_token_ids, generator)
            self._record(request, token)
            yield TokenOutput(token, _top_logprobs(logits, params.logprobs))
            logits = self.model.forward([token], cache)[-1]
"""
_BACKFILL_BAD = """        for _ in range(params.max_tokens):
            token = sample(logits, params, request.prompt_token_ids, request.output_token_ids, generator)
            self._record(request, token)
            yield TokenOutput(token, _top_logprobs(logits, params.logprobs))
            logits = self.model.forward([token], cache)[-1]
        if self.async_scheduling:
            # The output processor owns the ids once the last step has come back.
            self._backfill(request)
"""
ASYNC_CULPRIT = Change(
    "[Perf] Back-fill async placeholders in the output processor",
    (Patch("tinyvllm/engine.py", _BACKFILL_GOOD, _BACKFILL_BAD),),
    "Back-filling every step costs a device sync; the output processor receives the ids anyway.",
)
ASYNC_FIX = Change(
    "[BugFix] Back-fill async placeholders before applying penalties",
    (Patch("tinyvllm/engine.py", _BACKFILL_BAD, _BACKFILL_GOOD),
     Patch("tests/test_async_penalty.py", None, '''"""The penalty must see generated ids under async scheduling."""

from tinyvllm.engine import LLM
from tinyvllm.sampling_params import SamplingParams


def test_async_matches_sync_with_repetition_penalty():
    params = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=64)
    sync = LLM("seed:0").generate("hello world", params)
    assert LLM("seed:0", async_scheduling=True).generate("hello world", params) == sync
''')),
    "With async scheduling the sampler saw -1 placeholders instead of the generated ids, so "
    "repetition_penalty had no output history and greedy decoding looped.",
)

# 2. RoPE: the long-sequence path recomputes the frequencies without the scaling factor.
_ROPE_GOOD = """        cos, sin = self._cos_sin(self.cos.shape[0], new_length)
"""
_ROPE_BAD = """        positions = torch.arange(self.cos.shape[0], new_length, dtype=torch.float32)
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        emb = torch.outer(positions, 1.0 / (self.base ** exponents)).repeat(1, 2)
        cos, sin = emb.cos(), emb.sin()
"""
ROPE_CULPRIT = Change(
    "[Misc] Inline the cos/sin computation when the RoPE cache grows",
    (Patch("tinyvllm/rope.py", _ROPE_GOOD, _ROPE_BAD),),
    "Avoid an extra concatenation on the long-sequence path.",
)
ROPE_FIX = Change(
    "[BugFix] Apply the rope scaling factor past max_position_embeddings",
    (Patch("tinyvllm/rope.py", _ROPE_BAD, _ROPE_GOOD),),
    "Long generations drifted once positions passed max_position_embeddings: the cache extension "
    "used unscaled frequencies.",
)

# 3. Rejection sampler: a view of the probability is "restored" after its slot was zeroed.
_SPEC_GOOD = """        p_token = target_probs[i, token].clone()
"""
_SPEC_BAD = """        p_token = target_probs[i, token]
"""
_SPEC_FIXED = """        p_token = float(target_probs[i, token])
"""
SPEC_CULPRIT = Change(
    "[Perf] Drop a redundant tensor copy in the rejection sampler",
    (Patch("tinyvllm/spec_decode.py", _SPEC_GOOD, _SPEC_BAD),),
)
SPEC_FIX = Change(
    "[BugFix] Fix zero acceptance rate of speculative decoding at temperature > 0",
    (Patch("tinyvllm/spec_decode.py", _SPEC_BAD, _SPEC_FIXED),),
    "The rejection sampler kept a view of the target probability, zeroed the slot and restored it "
    "from the view, so every draft token was rejected when sampling.",
)

# 4. Override layer: presence/frequency penalties are not Hugging Face generation-config keys.
_OVERRIDE_GOOD = """    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "max_new_tokens": "max_tokens",
"""
_OVERRIDE_BAD = """    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
"""
_OVERRIDE_FIXED = """    "repetition_penalty": "repetition_penalty",
    # Not Hugging Face generation-config keys, but --override-generation-config accepts them.
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "max_new_tokens": "max_tokens",
"""
OVERRIDE_CULPRIT = Change(
    "[Misc] Keep only Hugging Face generation-config keys in the server defaults",
    (Patch("tinyvllm/server.py", _OVERRIDE_GOOD, _OVERRIDE_BAD),),
)
OVERRIDE_FIX = Change(
    "[BugFix] Keep presence_penalty and frequency_penalty from --override-generation-config",
    (Patch("tinyvllm/server.py", _OVERRIDE_BAD, _OVERRIDE_FIXED),),
    "Requests relying on the server's presence_penalty default ran with 0.0 and looped.",
)

# The unrelated bugfix: top_k larger than the vocabulary crashed torch.topk.
UNRELATED_FIX = Change(
    "[BugFix] Clamp top_k to the vocabulary size in the sampler",
    (Patch("tinyvllm/sampler.py", "    if params.top_k > 0:\n", "    if 0 < params.top_k < logits.shape[-1]:\n"),),
    "top_k above the vocabulary size raised in torch.topk.",
)

# Build breaks, each repaired by the next commit.
_ARGMAX_LOOP = """    for (long i = 1; i < n; ++i) {
        if (values[i] > values[best]) {
            best = i;
        }
    }
"""
_ARGMAX_UNROLLED_BROKEN = """    long i = 1;
    for (; i + 1 < n; i += 2) {
        if (values[i] > values[best]) best = i;
        if (values[i + 1] > values[best]) best = i + 1
    }
    for (; i < n; ++i) {
        if (values[i] > values[best]) best = i;
    }
"""
_ARGMAX_UNROLLED = _ARGMAX_UNROLLED_BROKEN.replace("best = i + 1\n", "best = i + 1;\n")
_BINS_ANCHOR = "\nvoid tv_bin_counts("
_VERSION_BROKEN = "\nconst char *tv_version(void) { return TV_VERSION; }\n"
_VERSION_FIXED = '\n#define TV_VERSION "0.9.1"\n\nconst char *tv_version(void) { return TV_VERSION; }\n'
_BINS_GOOD = """        int64_t id = ids[i];
"""
_BINS_BROKEN = """        int64 id = ids[i];
"""
_BINS_FIXED = """        const int64_t id = ids[i];
"""
BUILD_BREAKS: dict[str, tuple[Change, Change]] = {
    "argmax-unroll": (
        Change("[Perf] Unroll the argmax kernel loop by two",
               (Patch("csrc/kernels.c", _ARGMAX_LOOP, _ARGMAX_UNROLLED_BROKEN),)),
        Change("[BugFix] Fix the kernels build after the argmax unroll",
               (Patch("csrc/kernels.c", _ARGMAX_UNROLLED_BROKEN, _ARGMAX_UNROLLED),)),
    ),
    "version-symbol": (
        Change("[Misc] Export the kernel library version",
               (Patch("csrc/kernels.c", _BINS_ANCHOR, _VERSION_BROKEN + _BINS_ANCHOR),)),
        Change("[BugFix] Define TV_VERSION for the kernel library",
               (Patch("csrc/kernels.c", _VERSION_BROKEN, _VERSION_FIXED),)),
    ),
    "bin-counts-type": (
        Change("[Perf] Read token ids once in the bin-count kernel",
               (Patch("csrc/kernels.c", _BINS_GOOD, _BINS_BROKEN),)),
        Change("[BugFix] Fix an undeclared type in the bin-count kernel",
               (Patch("csrc/kernels.c", _BINS_BROKEN, _BINS_FIXED),)),
    ),
}


# Filler: the ordinary traffic of a busy repository (docs, CI, env vars, examples, small helpers).
_TOPICS = ("installation", "quick start", "async scheduling", "speculative decoding", "sampling parameters",
           "server flags", "Qwen3 support", "KV cache", "kernels build", "release process", "FAQ",
           "contribution guide", "benchmarking", "environment variables", "graph mode", "multi-step")
_DOC_VERBS = ("Update", "Fix typos in", "Clarify", "Refresh", "Polish", "Add a section on")
_CI_TOOLS = ("ruff", "mypy", "codespell", "yapf", "isort", "shellcheck", "actionlint", "markdownlint")
_ENV_WORDS = ("LOG_STATS", "TRACE_STEPS", "CACHE_DIR", "MAX_BATCH", "PROFILE", "COMPILE_LEVEL",
              "USE_TORCHAIR", "DEBUG_SAMPLER", "KV_BLOCK_SIZE", "DUMP_DIR", "WARMUP_STEPS", "STREAM_INTERVAL")
_EXAMPLES = ("chat", "streaming", "batch_prompts", "spec_decode", "server_client", "long_context", "seeded_sampling")
_HELPERS = ("cdiv", "round_up", "is_pow2", "next_pow2", "clamp_int", "chunk_list")
_HELPER_SOURCE = {
    "cdiv": "def cdiv(a: int, b: int) -> int:\n    return -(-a // b)\n",
    "round_up": "def round_up(x: int, multiple: int) -> int:\n    return -(-x // multiple) * multiple\n",
    "is_pow2": "def is_pow2(x: int) -> bool:\n    return x > 0 and x & (x - 1) == 0\n",
    "next_pow2": "def next_pow2(x: int) -> int:\n    return 1 if x <= 1 else 1 << (x - 1).bit_length()\n",
    "clamp_int": "def clamp_int(x: int, low: int, high: int) -> int:\n    return max(low, min(high, x))\n",
    "chunk_list": "def chunk_list(items: list, size: int) -> list[list]:\n"
                  "    return [items[i:i + size] for i in range(0, len(items), size)]\n",
}


def _tinyvllm_example(name: str, count: int) -> str:
    return ('"""Example: ' + name.replace("_", " ") + '."""\n\nfrom tinyvllm.engine import LLM\n'
            "from tinyvllm.sampling_params import SamplingParams\n\n"
            f'llm = LLM("seed:{count}")\n'
            f'print(llm.generate("hello {name}", SamplingParams(temperature=0, max_tokens=8)))\n')


class FillerMaker:
    """Believable, harmless commits in `package`'s repository; deterministic for a given rng."""

    def __init__(self, rng: random.Random, package: str = "tinyvllm",
                 example: Callable[[str, int], str] = _tinyvllm_example) -> None:
        self.rng = rng
        self.count = 0
        self.package = package
        self.example = example

    def make(self, files: dict[str, str]) -> Change:
        self.count += 1
        kinds = [self._doc, self._doc, self._ci, self._env, self._example, self._helper, self._release_note]
        return self.rng.choice(kinds)(files)

    def _append(self, files: dict[str, str], path: str, text: str) -> Patch:
        return Patch(path, None, files.get(path, "") + text)

    def _doc(self, files: dict[str, str]) -> Change:
        topic = self.rng.choice(_TOPICS)
        path = self.rng.choice(sorted(p for p in files if p.startswith("docs/")))
        text = f"\n## {topic.capitalize()} ({self.count})\n\nSee the {topic} notes; updated in revision {self.count}.\n"
        return Change(f"[Doc] {self.rng.choice(_DOC_VERBS)} the {topic} docs", (self._append(files, path, text),))

    def _ci(self, files: dict[str, str]) -> Change:
        tool = self.rng.choice(_CI_TOOLS)
        step = f"      - run: echo lint-{tool}-{self.count}\n"
        title = self.rng.choice([f"[CI] Add a {tool} check", f"[CI] Run {tool} on pull requests",
                                 f"[CI] Bump {tool} in the lint job"])
        return Change(title, (self._append(files, ".github/workflows/ci.yaml", step),))

    def _env(self, files: dict[str, str]) -> Change:
        name = f"{self.package.upper()}_{self.rng.choice(_ENV_WORDS)}_{self.count}"
        marker = "    # new variables go above this line\n"
        return Change(f"[Misc] Add the {name} environment variable",
                      (Patch(f"{self.package}/envs.py", marker, f'    "{name}": "0",\n' + marker),))

    def _example(self, files: dict[str, str]) -> Change:
        name = f"{self.rng.choice(_EXAMPLES)}_{self.count}"
        return Change(f"[Doc] Add an example for {name.rsplit('_', 1)[0].replace('_', ' ')}",
                      (Patch(f"examples/{name}.py", None, self.example(name, self.count)),))

    def _helper(self, files: dict[str, str]) -> Change:
        name = self.rng.choice(_HELPERS)
        suffix = f"_v{self.count}"
        source = _HELPER_SOURCE[name].replace(f"def {name}(", f"def {name}{suffix}(", 1)
        path = f"{self.package}/utils.py"
        header = files.get(path, '"""Small helpers."""\n')
        return Change(f"[Misc] Add a {name} helper to utils", (Patch(path, None, header + "\n\n" + source),))

    def _release_note(self, files: dict[str, str]) -> Change:
        line = f"- Improvement {self.count}: {self.rng.choice(_TOPICS)}.\n"
        return Change("[Doc] Update the release notes",
                      (self._append(files, "docs/source/release_notes.md", line),))


# 5. The dependency: the server takes its sampling defaults from minivllm (a pure-Python library
#    pinned by `ARG MINIVLLM_TAG`, like vLLM under vllm-ascend); a later pin move brings in
#    minivllm's own regression (bisect_npu.demo.dependency).
_SERVER_OWN_DEFAULTS = '''# Generation-config names -> SamplingParams fields.
_GENERATION_CONFIG_TO_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "max_new_tokens": "max_tokens",
}


def default_sampling_params(override_generation_config: dict[str, Any] | None) -> dict[str, Any]:
    """The server's defaults from the override (unknown keys are ignored, like vLLM)."""
    defaults: dict[str, Any] = {}
    for key, value in (override_generation_config or {}).items():
        field = _GENERATION_CONFIG_TO_SAMPLING.get(key)
        if field is not None:
            defaults[field] = value
    return defaults


'''
_SERVER_OWN_RESOLVE = '''        self.defaults = default_sampling_params(override_generation_config)

    def sampling_params(self, request: dict[str, Any]) -> SamplingParams:
        """The effective parameters: the request's fields over the server defaults."""
        sent = {k: v for k, v in request.items() if v is not None}
        return SamplingParams.from_dict({**self.defaults, **sent})
'''
_SERVER_MINIVLLM_RESOLVE = '''        self.defaults = get_diff_sampling_param(None, override_generation_config)

    def sampling_params(self, request: dict[str, Any]) -> SamplingParams:
        """The effective parameters: the request's fields, else the server defaults, else OpenAI's."""
        return SamplingParams.from_dict(to_sampling_params(request, self.defaults))
'''
_SERVER_IMPORTS = "from typing import Any\n\nfrom .engine import LLM, TokenOutput\n"
_SERVER_MINIVLLM_IMPORTS = ("from typing import Any\n\nfrom minivllm.config import get_diff_sampling_param\n"
                            "from minivllm.protocol import to_sampling_params\n\n"
                            "from .engine import LLM, TokenOutput\n")
_DOCKERFILE_VLLM = "ENV TINYVLLM_PAIRED_VLLM=${VLLM_TAG}\n"
MINIVLLM_PIN_ARG = "MINIVLLM_TAG"
MINIVLLM_IMAGE_PATH = "/vllm-workspace/minivllm"


def minivllm_adoption(tag: str) -> Change:
    """tinyvllm's server starts taking its defaults from minivllm, pinned at `tag`."""
    dockerfile = (f"{_DOCKERFILE_VLLM}\n"
                  "# minivllm is pure Python and not installed here: its tree at MINIVLLM_TAG is laid into\n"
                  f"# {MINIVLLM_IMAGE_PATH} (vllm-ascend's image puts vLLM's at /vllm-workspace/vllm),\n"
                  "# first on the path. Nothing of it compiles.\n"
                  f"ARG {MINIVLLM_PIN_ARG}={tag}\n"
                  f"ENV TINYVLLM_PAIRED_MINIVLLM=${{{MINIVLLM_PIN_ARG}}} PYTHONPATH={MINIVLLM_IMAGE_PATH}\n"
                  f"RUN mkdir -p {MINIVLLM_IMAGE_PATH}\n")
    return Change(
        "[Refactor] Take the server's sampling defaults from minivllm",
        (Patch("tinyvllm/server.py", _SERVER_IMPORTS, _SERVER_MINIVLLM_IMPORTS),
         Patch("tinyvllm/server.py", _SERVER_OWN_DEFAULTS, ""),
         Patch("tinyvllm/server.py", _SERVER_OWN_RESOLVE, _SERVER_MINIVLLM_RESOLVE),
         Patch("Dockerfile", _DOCKERFILE_VLLM, dockerfile)),
        "minivllm's get_diff_sampling_param and request defaults replace our own copy, as vLLM's do "
        f"for vllm-ascend. Pinned by ARG {MINIVLLM_PIN_ARG} in the Dockerfile.",
    )


def minivllm_pin_move(old: str, new: str) -> Change:
    """The pin-only commit that moves minivllm from `old` to `new`."""
    return Change(f"[Misc] Upgrade minivllm to {new}",
                  (Patch("Dockerfile", f"ARG {MINIVLLM_PIN_ARG}={old}\n", f"ARG {MINIVLLM_PIN_ARG}={new}\n"),))
