"""Static checks of a recipe's engine args against a candidate's own source at one commit.

A recipe that vllm-ascend refuses at engine start makes every candidate of a range a skip, found
only after the builds. Each rule here looks for the refusing code itself in the candidate's
source (not for a version number, so it holds on release branches and backports) and, where it
is there and the recipe meets it, names the recipe field, the constraint, the upstream file and
the fix. Rules read git objects only: no checkout, no build, no NPU.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import git
from packaging.version import InvalidVersion, Version

from bisect_npu.errors import UsageError
from bisect_npu.recipe.schema import Recipe, version_specifier

PACKAGE_DIR = "vllm_ascend"


@dataclass(frozen=True)
class Finding:
    """One constraint of the candidate that the recipe breaks."""

    rule: str
    field: str  # the recipe field to change, e.g. engine.args.enforce_eager
    constraint: str  # what the candidate does with the recipe as it is
    upstream: str  # the candidate's file that holds the refusing code
    fix: str

    def describe(self) -> str:
        return f"{self.field}: {self.constraint} ({self.upstream}); {self.fix}"


class CandidateSource:
    """The candidate's files at one commit, read from git objects."""

    def __init__(self, repo: git.Repo, sha: str) -> None:
        self.repo = repo
        self.sha = sha

    def files_matching(self, pattern: str, under: str = PACKAGE_DIR) -> list[str]:
        """Python files under `under` with a line matching the extended regex `pattern`."""
        try:
            out = self.repo.git.grep("-l", "-E", "-e", pattern, self.sha, "--", f"{under}/*.py")
        except git.GitCommandError as exc:
            if exc.status == 1:  # no match
                return []
            raise
        return [line.split(":", 1)[1] for line in out.splitlines()]

    def read(self, path: str) -> str | None:
        try:
            blob = self.repo.commit(self.sha).tree / path
        except KeyError:
            return None
        return str(blob.data_stream.read().decode("utf-8", errors="replace"))


@dataclass(frozen=True)
class ModelFacts:
    """What the rules need of the model: its `model_type` and attention heads (config.json)."""

    model_type: str | None
    attention_heads: int | None
    source: str


# Model families whose config.json facts the check needs when the weights are not on this host
# (Hugging Face config.json of each: deepseek-ai/DeepSeek-R1 and DeepSeek-V3 have model_type
# deepseek_v3 and num_attention_heads 128).
KNOWN_MODELS: tuple[tuple[str, str, int | None], ...] = (
    ("deepseek-r1", "deepseek_v3", 128),
    ("deepseek-v3", "deepseek_v3", 128),
    ("qwen3", "qwen3", None),
)


def model_facts(recipe: Recipe) -> ModelFacts:
    """The model's config.json at `model.host_path` when it is on this host, else what its name says."""
    if recipe.model.host_path:
        config = Path(recipe.model.host_path) / "config.json"
        try:
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
        else:
            heads = data.get("num_attention_heads")
            return ModelFacts(data.get("model_type"), heads if isinstance(heads, int) else None, str(config))
    name = Path(recipe.model.path).name.lower()
    for prefix, model_type, heads in KNOWN_MODELS:
        if name.startswith(prefix):
            return ModelFacts(model_type, heads, f"the model's name ({Path(recipe.model.path).name})")
    return ModelFacts(None, None, "nothing (no config.json on this host, an unknown name)")


@dataclass(frozen=True)
class EngineFacts:
    """The recipe's engine args as vllm-ascend reads them."""

    model: ModelFacts
    args: Mapping[str, Any]
    tensor_parallel: int

    @classmethod
    def of(cls, recipe: Recipe) -> EngineFacts:
        args = {str(key).replace("-", "_"): value for key, value in recipe.engine.args.items()}
        return cls(model_facts(recipe), args, recipe.engine.parallel_sizes().get("tensor_parallel_size", 1))

    @property
    def additional_config(self) -> Mapping[str, Any]:
        value = self.args.get("additional_config") or {}
        return value if isinstance(value, Mapping) else {}

    def _section_enabled(self, name: str) -> bool:
        section = self.additional_config.get(name) or {}
        return isinstance(section, Mapping) and section.get("enabled") is True

    @property
    def enforce_eager(self) -> bool:
        return self.args.get("enforce_eager") is True

    @property
    def torchair_graph(self) -> bool:
        return self._section_enabled("torchair_graph_config")

    @property
    def ascend_scheduler(self) -> bool:
        return self._section_enabled("ascend_scheduler_config")

    @property
    def ascend_scheduler_chunked_prefill(self) -> bool:
        """The Ascend scheduler turns chunked prefill off unless its own section turns it on."""
        section = self.additional_config.get("ascend_scheduler_config") or {}
        return isinstance(section, Mapping) and section.get("enable_chunked_prefill") is True

    @property
    def is_deepseek(self) -> bool:
        return "deepseek" in (self.model.model_type or "")


class Rule(ABC):
    """One start-up constraint of vllm-ascend, found by the code that enforces it."""

    name: ClassVar[str]
    upstream: ClassVar[str]  # where the code lives in the releases that have it
    marker: ClassVar[str]  # extended regex of the enforcing line

    def located(self, source: CandidateSource) -> str | None:
        """The file holding the enforcing code at this commit (upstream's, or wherever it moved)."""
        found = source.files_matching(self.marker)
        if not found:
            return None
        return self.upstream if self.upstream in found else found[0]

    @abstractmethod
    def concerns(self, engine: EngineFacts) -> bool:
        """Whether the recipe uses what the rule is about (a DeepSeek model, the Ascend scheduler, ...)."""

    @abstractmethod
    def check(self, engine: EngineFacts, source: CandidateSource) -> Finding | None:
        """A finding when the candidate has the constraint and the recipe breaks it."""


class DeepseekAclGraph(Rule):
    """DeepSeek in ACL graph mode (no enforce_eager, no torchair) raises at config check."""

    name = "deepseek-acl-graph"
    upstream = "vllm_ascend/ascend_config.py"
    marker = r"ACL Graph does not support deepseek"

    def concerns(self, engine: EngineFacts) -> bool:
        return bool(engine.is_deepseek)

    def check(self, engine: EngineFacts, source: CandidateSource) -> Finding | None:
        if not engine.is_deepseek or engine.enforce_eager or engine.torchair_graph:
            return None
        where = self.located(source)
        if where is None:
            return None
        return Finding(self.name, "engine.args.enforce_eager",
                       f"DeepSeek ({engine.model.model_type}) in ACL graph mode (neither enforce_eager nor "
                       "additional_config.torchair_graph_config.enabled) raises NotImplementedError(\"ACL Graph "
                       "does not support deepseek\")", where,
                       "set engine.args.enforce_eager: true (as upstream's own DeepSeek MTP test does), or enable "
                       "additional_config.torchair_graph_config")


class AscendSchedulerBatchedTokens(Rule):
    """The Ascend scheduler without chunked prefill refuses max_num_batched_tokens < max_model_len."""

    name = "ascend-scheduler-batched-tokens"
    upstream = "vllm_ascend/core/schedule_config.py"
    marker = r"max_num_batched_tokens < self\.max_model_len"

    def concerns(self, engine: EngineFacts) -> bool:
        return bool(engine.ascend_scheduler)

    def check(self, engine: EngineFacts, source: CandidateSource) -> Finding | None:
        batched, model_len = engine.args.get("max_num_batched_tokens"), engine.args.get("max_model_len")
        if not (engine.ascend_scheduler and isinstance(batched, int) and isinstance(model_len, int)):
            return None
        if batched >= model_len or engine.ascend_scheduler_chunked_prefill:
            return None
        where = self.located(source)
        if where is None:
            return None
        return Finding(self.name, "engine.args.max_num_batched_tokens",
                       f"the Ascend scheduler (additional_config.ascend_scheduler_config.enabled) without chunked "
                       f"prefill raises ValueError when max_num_batched_tokens ({batched}) < max_model_len "
                       f"({model_len})", where,
                       f"set engine.args.max_num_batched_tokens to at least {model_len}, or enable_chunked_prefill: "
                       "true in ascend_scheduler_config")


_ALLOWED_HEADS = re.compile(r"_ALLOWED_NUM_QUERIES_PER_KV\s*=\s*\[([0-9,\s]+)\]")


class MlaGraphHeadsPerRank(Rule):
    """MLA in torchair graph mode asserts the heads per tensor-parallel rank are in a fixed set."""

    name = "mla-graph-heads-per-rank"
    upstream = "vllm_ascend/attention/mla_v1.py"
    marker = r"assert self\.num_queries_per_kv in _ALLOWED_NUM_QUERIES_PER_KV"

    def concerns(self, engine: EngineFacts) -> bool:
        return bool(engine.is_deepseek and engine.torchair_graph)

    def check(self, engine: EngineFacts, source: CandidateSource) -> Finding | None:
        heads = engine.model.attention_heads
        if not (engine.is_deepseek and engine.torchair_graph and heads):
            return None
        where = self.located(source)
        if where is None:
            return None
        # The allowed set is a module constant, defined beside the assertion or imported from a sibling.
        defined = [where, *source.files_matching(r"_ALLOWED_NUM_QUERIES_PER_KV *= *\[")]
        allowed = next((m for path in defined if (m := _ALLOWED_HEADS.search(source.read(path) or ""))), None)
        if allowed is None:
            return None
        sizes = [int(word) for word in allowed.group(1).replace(",", " ").split()]
        per_rank = heads // engine.tensor_parallel  # MLA has one KV head: queries per KV = heads per rank
        if per_rank in sizes:
            return None
        fitting = [heads // size for size in sizes if heads % size == 0 and heads // size >= 1]
        return Finding(self.name, "engine.args.tensor_parallel_size",
                       f"MLA in torchair graph mode asserts the attention heads per rank are in {sizes}; "
                       f"{heads} heads (from {engine.model.source}) over tensor_parallel_size "
                       f"{engine.tensor_parallel} leave {per_rank}", where,
                       f"use tensor_parallel_size {' or '.join(map(str, sorted(fitting)))} (with data parallel "
                       "for more cards), or leave torchair graph mode off (enforce_eager) on this range")


class IgnoredAdditionalConfig(Rule):
    """An additional_config section that no code of the candidate reads is ignored in silence."""

    name = "ignored-additional-config"
    upstream = "vllm_ascend/ascend_config.py"
    marker = r"additional_config\.get\("  # AscendConfig reading its sections

    def concerns(self, engine: EngineFacts) -> bool:
        return bool(engine.additional_config)

    def check(self, engine: EngineFacts, source: CandidateSource) -> Finding | None:
        if not engine.additional_config or (reader := self.located(source)) is None:
            return None  # no sections asked for, or not a tree whose config reader this rule knows
        ignored = [key for key in engine.additional_config
                   if re.fullmatch(r"\w+", str(key)) and not source.files_matching(f"[\"']{key}[\"']")]
        if not ignored:
            return None
        names = ", ".join(ignored)
        return Finding(self.name, f"engine.args.additional_config.{ignored[0]}",
                       f"nothing under {PACKAGE_DIR}/ reads additional_config key(s) {names}: the candidate "
                       "ignores them, and the recipe no longer exercises what they turn on", reader,
                       "bisect a range where the candidate reads them (the recipe's supports field), or drop them")


RULES: tuple[Rule, ...] = (DeepseekAclGraph(), AscendSchedulerBatchedTokens(), MlaGraphHeadsPerRank(),
                           IgnoredAdditionalConfig())


def check_recipe(recipe: Recipe, repo: git.Repo, sha: str) -> list[Finding]:
    """Every rule's finding for the recipe at one commit of the candidate's history."""
    engine = EngineFacts.of(recipe)
    source = CandidateSource(repo, sha)
    return [finding for rule in RULES if (finding := rule.check(engine, source)) is not None]


def check_recipe_at_ends(recipe: Recipe, repo: git.Repo, ends: Mapping[str, str]) -> None:
    """Refuse a recipe the candidate refuses at either end ({"good end v0.9.1": sha, ...}): an
    error before the first build rather than a range of skips after it."""
    if recipe.engine.backend == "mini":
        return
    problems = [f"at the {end} ({sha[:12]}): {finding.describe()}"
                for end, sha in ends.items() for finding in check_recipe(recipe, repo, sha)]
    if problems:
        raise UsageError(f"recipe {recipe.name} would not start: " + "; ".join(problems)
                         + f" (`bisect-npu recipes check {recipe.source or recipe.name} --at REF` checks one commit)")



def range_ends(good_ref: str, bad_ref: str, good: str, base: str, bad: str) -> dict[str, str]:
    """The two commits a bisection of good_ref..bad_ref starts from, named for messages: the good
    end is the merge base when good_ref is not an ancestor of bad_ref."""
    first = (f"good end {good_ref}" if base == good
             else f"merge base of {good_ref} and {bad_ref} (the good end the bisection starts from)")
    return {first: base, f"bad end {bad_ref}": bad}


def candidate_version(repo: git.Repo, sha: str) -> tuple[str, Version] | None:
    """The release a commit belongs to: its nearest version tag (`git describe`), or None without one."""
    try:
        tag = repo.git.describe("--tags", "--abbrev=0", "--match", "v[0-9]*", sha)
    except git.GitCommandError:
        return None
    try:
        return tag, Version(tag)
    except InvalidVersion:
        return None


def check_support(recipe: Recipe, repo: git.Repo, ends: Mapping[str, str]) -> None:
    """Refuse ends outside the versions the recipe declares (`supports`): a good end that predates
    what the case exercises never ran it, and the bisection would compare two code paths."""
    requirements = recipe.supports.requirements()
    if not requirements:
        return
    for end, sha in ends.items():
        found = candidate_version(repo, sha)
        if found is None:
            continue  # no version tag below it: nothing to compare with
        tag, version = found
        for what, spec in requirements:
            if version_specifier(spec).contains(version, prereleases=True):
                continue
            fitting = tags_within(repo, [s for _, s in requirements])
            hint = (f"pick ends within it (the oldest tag that is: {fitting[0]}, the newest: {fitting[-1]})"
                    if fitting else "no tag of this repository is within it")
            raise UsageError(f"recipe {recipe.name} supports vllm-ascend {spec} ({what}), but the {end} "
                             f"({sha[:12]}) is {tag}: outside it the case does not exercise what it is named "
                             f"for; {hint}, or widen supports in the recipe if the case runs there")


def tags_within(repo: git.Repo, specs: list[str]) -> list[str]:
    """The repository's version tags within every specifier, oldest first."""
    versions = []
    for tag in repo.tags:
        try:
            version = Version(tag.name)
        except InvalidVersion:
            continue
        if all(version_specifier(spec).contains(version, prereleases=True) for spec in specs):
            versions.append((version, tag.name))
    return [name for _, name in sorted(versions)]
