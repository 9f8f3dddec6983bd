"""The settings search on a real vLLM server (CPU build, `make test-vllm`): the server's
--override-generation-config sets presence_penalty and three other sampling defaults, and the
server drops presence_penalty's (regression 4 put back, tests/helpers/vllm_server_dropping_penalties.py).
The bad case leaves all four to the server; the good variant sends all four itself. The search
must name presence_penalty, the one default that never arrives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_npu.builders.base import Environment
from bisect_npu.execute.local import LocalExecutor
from bisect_npu.orchestration.settings_search import SettingsQuestion, settings_request
from bisect_npu.orchestration.settings_session import SettingsSearch
from tests.helpers.gitrepo import make_linear_repo
from tests.helpers.paths import HELPERS
from tests.helpers.tiny_qwen3 import write_tiny_qwen3
from tests.helpers.vllm_tier import REPO, VLLM_ENV, require_vllm

DROPPING_LAUNCHER = ["{python}", str(HELPERS / "vllm_server_dropping_penalties.py"),
                     "--model", "{model}"]
DEFAULTS = {"presence_penalty": 1.5, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.0}


class CheckoutBuilder:
    """Every commit runs on this checkout (the probe with vLLM's venv): nothing to build for vLLM's CPU
    wheel, and the settings search's one build per commit is the point, not the build."""

    def acquire(self, commit: str, log_dir: Path) -> Environment:
        return Environment(kind="worktree", commit=commit, path=str(REPO), how="reused")

    def release(self, env: Environment) -> None:
        pass

    def close(self) -> None:
        pass

    def build_key(self, commit: str) -> str | None:
        return None

    def built_keys(self) -> frozenset[str]:
        return frozenset()


def recipe_text(model: Path) -> str:
    return json.dumps({
        "name": "vllm-dropped-presence-penalty",
        "model": {"path": str(model), "dtype": "float32"},
        "engine": {"backend": "openai", "launcher": DROPPING_LAUNCHER, "port": 18451, "startup_timeout_s": 600,
                   "args": {"max_model_len": 2048, "enforce_eager": True},
                   "server_flags": ["--override-generation-config", json.dumps(DEFAULTS)]},
        "cases": [{"id": "server-defaults", "messages": [{"role": "user",
                                                          "content": "repeat the quick brown fox fifty times"}],
                   "sampling": {"temperature": 0.0, "max_tokens": 64, "seed": 0}}],
        "oracle": {"kinds": ["penalty"], "penalty": {"expected": {"presence_penalty": 1.5}}},
    })


@pytest.mark.vllm
def test_the_search_names_the_default_the_server_drops(tmp_path: Path) -> None:
    python = require_vllm()
    model = write_tiny_qwen3(tmp_path / "tiny-qwen3")
    repo = tmp_path / "repo"
    make_linear_repo(repo, 1)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text(model))  # JSON is YAML
    question, request = settings_request(SettingsQuestion(
        ref="HEAD", good_set=[f"cases[*].sampling.{key}={value}" for key, value in DEFAULTS.items()]),
        {"repo": str(repo), "recipe": str(recipe)})
    search = SettingsSearch.start(question, request, tmp_path / "session", builder=CheckoutBuilder(),
                                  executor=LocalExecutor(env=VLLM_ENV, python=str(python)))
    try:
        result = search.run()
    finally:
        search.close()
    assert result.exit_code == 0, result.message
    assert [d.key for d in result.trigger] == ["cases[*].sampling.presence_penalty"]
    assert result.trigger[0].bad is None and result.trigger[0].good == 1.5
