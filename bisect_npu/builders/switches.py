"""Run-time switches a candidate's own source offers, found at its commit and handed to its runs
through its Environment (`run_env`), so each step's journal line says which were on.

Batch invariance: vllm-ascend's NPU worker calls `init_batch_invariance()`
(vllm_ascend/batch_invariant.py, from #5517, first released in v0.13.0rc2), which under vLLM's
`VLLM_BATCH_INVARIANT=1` (vllm/envs.py) registers batch-invariant kernels and sets the strict HCCL
and LCCL determinism: a trial's tokens then no longer depend on what else shares its batch. Older
candidates have no such call, and the variable would change nothing there. vllm-ascend's feature
guide names Atlas A2 and A3 as the hardware it runs on, so a 310P host gets none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import git

from bisect_npu.builders.base import Builder, Environment
from bisect_npu.recipe.check import CandidateSource

BATCH_INVARIANT_ENV = {"VLLM_BATCH_INVARIANT": "1"}
# A call, indented in a method (the definition is `def init_batch_invariance():` at the left margin).
_CALLS_BATCH_INVARIANCE = r"^\s+init_batch_invariance\(\)"
_BATCH_INVARIANT_HOSTS = ("A2", "A3", None)  # None: --devices without npu-smi's word on the chip


def batch_invariance_caller(repo: git.Repo, sha: str) -> str | None:
    """The candidate's file that starts batch-invariant mode at worker start, or None."""
    files = CandidateSource(repo, sha).files_matching(_CALLS_BATCH_INVARIANCE)
    return files[0] if files else None


def candidate_switches(repo: git.Repo, sha: str, host: str | None) -> dict[str, str]:
    """The environment variables the candidate at `sha` offers for runs on a `host` type."""
    if host not in _BATCH_INVARIANT_HOSTS or batch_invariance_caller(repo, sha) is None:
        return {}
    return dict(BATCH_INVARIANT_ENV)


class SwitchingBuilder:
    """A builder whose environments carry their candidate's switches (`candidate_switches`),
    less those the recipe's environment sets itself (its word wins, and the journal says what ran)."""

    def __init__(self, builder: Builder, repo: git.Repo, host: str | None,
                 recipe_env: Mapping[str, str] | None = None) -> None:
        self.builder = builder
        self.repo = repo
        self.host = host
        self.recipe_env = dict(recipe_env or {})

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        env = self.builder.acquire(commit, log_dir)
        switches = {name: value for name, value in candidate_switches(self.repo, commit, self.host).items()
                    if name not in self.recipe_env}
        return env.model_copy(update={"run_env": {**env.run_env, **switches}}) if switches else env

    def release(self, env: Environment) -> None:
        self.builder.release(env)

    def close(self) -> None:
        self.builder.close()

    def build_key(self, commit: str) -> str | None:
        return self.builder.build_key(commit)

    def built_keys(self) -> frozenset[str]:
        return self.builder.built_keys()
