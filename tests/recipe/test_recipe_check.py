"""`recipes check` and `supports`: a recipe the candidate would refuse at start is an error before
the first build. The fast tests run on a small history written here with the *shape* of
vllm-ascend's refusing code; the slow one runs on a real clone (BISECT_NPU_VLLM_ASCEND)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import git
import pytest
import yaml

from bisect_npu.cli import main
from bisect_npu.errors import UsageError
from bisect_npu.orchestration.opening.preflight import check_run
from bisect_npu.orchestration.opening.session_spec import SessionSpec
from bisect_npu.recipe.check import (
    RULES,
    candidate_version,
    check_recipe,
    check_recipe_at_ends,
    check_support,
    tags_within,
)
from bisect_npu.recipe.loader import bundled_recipes, parse_recipe
from bisect_npu.recipe.schema import Recipe
from tests.helpers.asked import spec_of
from tests.helpers.gitrepo import add_commit, make_linear_repo
from tests.helpers.gitrepo import git as run_git

# The shapes of vllm-ascend's checks (what each rule looks for), not its code.
ASCEND_CONFIG = '''class AscendConfig:
    def __init__(self, additional_config):
        self.torchair = additional_config.get("torchair_graph_config", {})
        self.scheduler = additional_config.get("ascend_scheduler_config", {})
'''
ACL_GRAPH_RAISE = '''

def check(model_type, enforce_eager, torchair):
    if not enforce_eager and not torchair and "deepseek" in model_type:
        raise NotImplementedError("ACL Graph does not support deepseek. Set enforce_eager.")
'''
SCHEDULE_CONFIG = '''class AscendSchedulerConfig:
    def __post_init__(self):
        if (self.max_num_batched_tokens < self.max_model_len
                and not self.chunked_prefill_enabled):
            raise ValueError("max_num_batched_tokens is smaller than max_model_len")
'''
ATTENTION = "_ALLOWED_NUM_QUERIES_PER_KV = [32, 64, 128]\n"
MLA = '''from vllm_ascend.attention.attention import _ALLOWED_NUM_QUERIES_PER_KV


class MLAImpl:
    def __init__(self):
        if self.torchair_graph_enabled:
            assert self.num_queries_per_kv in _ALLOWED_NUM_QUERIES_PER_KV, "heads per rank"
'''
CONFIG_WITHOUT_SECTIONS = '''class AscendConfig:
    def __init__(self, additional_config):
        self.xlite = additional_config.get("xlite_graph_config", {})
'''
TAGS = ["v0.9.1", "v0.10.0rc1", "v0.11.0rc0", "v0.12.0rc1"]


def upstream_files(i: int) -> dict[str, str | None]:
    """v0.9.1 has every check; v0.10.0rc1 drops the heads assertion; v0.11.0rc0 the ACL graph
    raise; v0.12.0rc1 the torchair and Ascend scheduler sections."""
    files: dict[str, str | None] = {
        "vllm_ascend/ascend_config.py": ASCEND_CONFIG + (ACL_GRAPH_RAISE if i < 2 else ""),
        "vllm_ascend/core/schedule_config.py": SCHEDULE_CONFIG,
        "vllm_ascend/attention/attention.py": ATTENTION,
        "vllm_ascend/attention/mla_v1.py": MLA if i < 1 else "class MLAImpl:\n    pass\n",
    }
    if i >= 3:
        files.update({"vllm_ascend/ascend_config.py": CONFIG_WITHOUT_SECTIONS,
                      "vllm_ascend/core/schedule_config.py": None})
    return files


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> git.Repo:
    path = tmp_path_factory.mktemp("up") / "vllm-ascend"
    make_linear_repo(path, len(TAGS), files=upstream_files, tags=dict(enumerate(TAGS)))
    return git.Repo(path)


def bundled(name: str) -> dict[str, Any]:
    return yaml.safe_load(bundled_recipes()[name].read_text())


def as_recipe(raw: dict[str, Any]) -> Recipe:
    return parse_recipe(yaml.safe_dump(raw), source="<test>")


def mtp_as_it_was() -> dict[str, Any]:
    """deepseek-r1-mtp-temperature as it was before its fix: graph mode, the Ascend scheduler on."""
    raw = bundled("deepseek-r1-mtp-temperature")
    del raw["engine"]["args"]["enforce_eager"]
    raw["engine"]["args"]["additional_config"] = {"ascend_scheduler_config": {"enabled": True}}
    return raw


def longseq_as_it_was() -> dict[str, Any]:
    """deepseek-r1-longseq-rope before the mend: 8192 batched tokens against 36864."""
    raw = bundled("deepseek-r1-longseq-rope")
    raw["engine"]["args"]["max_num_batched_tokens"] = 8192
    return raw


def rules_at(recipe: Recipe, repo: git.Repo, tag: str) -> list[str]:
    return [finding.rule for finding in check_recipe(recipe, repo, repo.commit(tag).hexsha)]


def test_the_mtp_recipe_as_it_was_fails_where_the_acl_graph_raise_is(upstream: git.Repo) -> None:
    recipe = as_recipe(mtp_as_it_was())
    [finding] = check_recipe(recipe, upstream, upstream.commit("v0.9.1").hexsha)
    assert finding.rule == "deepseek-acl-graph"
    assert finding.field == "engine.args.enforce_eager"
    assert finding.upstream == "vllm_ascend/ascend_config.py"
    assert "ACL Graph does not support deepseek" in finding.constraint
    assert "enforce_eager: true" in finding.fix
    assert rules_at(recipe, upstream, "v0.10.0rc1") == ["deepseek-acl-graph"]
    assert rules_at(recipe, upstream, "v0.11.0rc0") == []
    assert rules_at(recipe, upstream, "v0.12.0rc1") == ["ignored-additional-config"]


def test_the_longseq_recipe_as_it_was_fails_on_tokens_heads_and_dropped_sections(upstream: git.Repo) -> None:
    recipe = as_recipe(longseq_as_it_was())
    assert rules_at(recipe, upstream, "v0.9.1") == ["ascend-scheduler-batched-tokens", "mla-graph-heads-per-rank"]
    assert rules_at(recipe, upstream, "v0.10.0rc1") == ["ascend-scheduler-batched-tokens"]
    findings = check_recipe(recipe, upstream, upstream.commit("v0.9.1").hexsha)
    tokens, heads = findings
    assert (tokens.field, tokens.upstream) == ("engine.args.max_num_batched_tokens",
                                               "vllm_ascend/core/schedule_config.py")
    assert "8192" in tokens.constraint and "36864" in tokens.fix
    assert (heads.field, heads.upstream) == ("engine.args.tensor_parallel_size", "vllm_ascend/attention/mla_v1.py")
    assert "[32, 64, 128]" in heads.constraint and "leave 8" in heads.constraint
    assert "tensor_parallel_size 1 or 2 or 4" in heads.fix
    [dropped] = check_recipe(recipe, upstream, upstream.commit("v0.12.0rc1").hexsha)
    assert dropped.rule == "ignored-additional-config"
    assert "torchair_graph_config" in dropped.constraint and "ascend_scheduler_config" in dropped.constraint


@pytest.mark.parametrize("name", ["deepseek-r1-mtp-temperature", "deepseek-r1-longseq-rope"])
def test_the_mended_recipes_pass_inside_their_supported_range(upstream: git.Repo, name: str) -> None:
    recipe = as_recipe(bundled(name))
    within = tags_within(upstream, [spec for _, spec in recipe.supports.requirements()])
    assert within and within[0] == "v0.10.0rc1"
    for tag in within:
        assert rules_at(recipe, upstream, tag) == [], tag


def test_a_rule_follows_the_code_not_the_version(upstream: git.Repo, tmp_path: Path) -> None:
    """A release branch that removed the assertion (as #1404 did on v0.9.1's) passes although its
    version predates the removal on main."""
    clone = tmp_path / "clone"
    run_git(tmp_path, "clone", "-q", upstream.git_dir, str(clone))
    run_git(clone, "checkout", "-q", "-b", "releases/v0.9.1", "v0.9.1")
    sha = add_commit(clone, "Fix torchair with tp > 4 (#1404)",
                     {"vllm_ascend/attention/mla_v1.py": "class MLAImpl:\n    pass\n"})
    run_git(clone, "tag", "v0.9.1rc2", sha)
    repo = git.Repo(clone)
    assert "mla-graph-heads-per-rank" not in rules_at(as_recipe(longseq_as_it_was()), repo, "v0.9.1rc2")
    assert candidate_version(repo, sha) == ("v0.9.1rc2", candidate_version(repo, sha)[1])  # type: ignore[index]


def test_heads_come_from_the_models_config_when_it_is_on_this_host(upstream: git.Repo, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "num_attention_heads": 64}))
    raw = longseq_as_it_was()
    raw["model"]["host_path"] = str(tmp_path)
    raw["engine"]["args"]["tensor_parallel_size"] = 2  # 32 per rank: allowed
    assert "mla-graph-heads-per-rank" not in rules_at(as_recipe(raw), upstream, "v0.9.1")
    raw["engine"]["args"]["tensor_parallel_size"] = 4  # 16 per rank
    finding = check_recipe(as_recipe(raw), upstream, upstream.commit("v0.9.1").hexsha)[-1]
    assert finding.rule == "mla-graph-heads-per-rank" and str(tmp_path / "config.json") in finding.constraint


def test_a_tree_without_vllm_ascends_code_gives_no_finding(tmp_path: Path) -> None:
    path = tmp_path / "other"
    make_linear_repo(path, 1, files=lambda i: {"setup.py": "setup()\n"})
    repo = git.Repo(path)
    assert check_recipe(as_recipe(mtp_as_it_was()), repo, repo.head.commit.hexsha) == []
    assert len(RULES) == 4


def write(tmp_path: Path, raw: dict[str, Any], name: str = "case.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def test_recipes_check_exits_2_naming_field_constraint_file_and_fix(
        upstream: git.Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = write(tmp_path, mtp_as_it_was())
    with pytest.raises(SystemExit) as exit_info:
        main(["recipes", "check", str(recipe), "--repo", str(upstream.working_tree_dir), "--at", "v0.11.0rc0",
              "--at", "v0.9.1"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2
    assert "ok    deepseek-r1-mtp-temperature at v0.11.0rc0" in out
    assert "at v0.9.1" in err and "engine.args.enforce_eager" in err and "vllm_ascend/ascend_config.py" in err
    assert "ACL Graph does not support deepseek" in err and "set engine.args.enforce_eager: true" in err


def run_options(upstream: git.Repo, recipe: Path, good: str, bad: str) -> SessionSpec:
    return spec_of(good=good, bad=bad, repo=str(upstream.working_tree_dir), recipe=str(recipe))


def test_run_refuses_a_recipe_the_candidate_refuses_at_an_end(upstream: git.Repo, tmp_path: Path) -> None:
    raw = mtp_as_it_was()
    del raw["supports"]
    with pytest.raises(UsageError, match=r"at the good end v0\.10\.0rc1 \(\w+\): engine\.args\.enforce_eager"):
        check_run(run_options(upstream, write(tmp_path, raw), "v0.10.0rc1", "v0.11.0rc0"))
    check_run(run_options(upstream, write(tmp_path, bundled("deepseek-r1-mtp-temperature"), "ok.yaml"),
                          "v0.10.0rc1", "v0.11.0rc0"))


def test_run_and_plan_refuse_a_good_end_before_the_supported_range(
        upstream: git.Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = bundled("qwen3-repetition-penalty-async")
    recipe = write(tmp_path, raw)
    with pytest.raises(UsageError, match=r"supports vllm-ascend >=v0\.11\.0rc0 \(async_scheduling\), but the good "
                                         r"end v0\.10\.0rc1 \(\w+\) is v0\.10\.0rc1.*oldest tag that is: v0\.11\.0rc0"):
        check_run(run_options(upstream, recipe, "v0.10.0rc1", "v0.12.0rc1"))
    check_run(run_options(upstream, recipe, "v0.11.0rc0", "v0.12.0rc1"))
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--repo", str(upstream.working_tree_dir), "--good", "v0.9.1", "--bad", "v0.12.0rc1",
              "--recipe", str(recipe)])
    assert exit_info.value.code == 2
    assert "good end v0.9.1" in capsys.readouterr().err


def test_an_upper_bound_refuses_the_bad_end(upstream: git.Repo, tmp_path: Path) -> None:
    recipe = as_recipe(bundled("deepseek-r1-longseq-rope"))
    ends = {"bad end v0.12.0rc1": upstream.commit("v0.12.0rc1").hexsha}
    with pytest.raises(UsageError,
                       match=r"<v0\.12\.0rc1 \((torchair_graph|ascend_scheduler)_config\).*newest: v0\.11\.0rc0"):
        check_support(recipe, upstream, ends)
    check_recipe_at_ends(recipe, upstream, {"good end v0.10.0rc1": upstream.commit("v0.10.0rc1").hexsha})


@pytest.mark.parametrize("spec", ["0.11", ">=banana", "=>v0.11.0rc0"])
def test_supports_takes_version_specifiers_only(spec: str) -> None:
    raw = bundled("qwen3-repetition-penalty-async")
    raw["supports"] = {"vllm_ascend": spec}
    with pytest.raises(UsageError, match=r"field 'supports.vllm_ascend': .*is not a version specifier"):
        as_recipe(raw)


def test_supports_does_not_change_the_recipe_digest() -> None:
    raw = bundled("qwen3-repetition-penalty-async")
    with_supports = as_recipe(raw)
    del raw["supports"]
    assert as_recipe(raw).digest() == with_supports.digest()


REAL_CLONE = os.environ.get("BISECT_NPU_VLLM_ASCEND")
# The failures the bundled recipes had before their fix, on the recipes as they were: (recipe, tag, rule).
ISSUE_FAILURES = [
    ("mtp", "v0.9.1rc1", "deepseek-acl-graph"), ("mtp", "v0.9.1", "deepseek-acl-graph"),
    ("mtp", "v0.10.2rc1", "deepseek-acl-graph"), ("mtp", "v0.12.0rc1", "ignored-additional-config"),
    *[("longseq", tag, "ascend-scheduler-batched-tokens")
      for tag in ("v0.9.1rc3", "v0.9.1", "v0.10.1rc1", "v0.10.2rc1", "v0.11.0rc0", "v0.11.0")],
    ("longseq", "v0.9.0rc2", "mla-graph-heads-per-rank"), ("longseq", "v0.9.1rc1", "mla-graph-heads-per-rank"),
    ("longseq", "v0.9.2rc1", "mla-graph-heads-per-rank"), ("longseq", "v0.12.0rc1", "ignored-additional-config"),
]


@pytest.mark.slow
@pytest.mark.skipif(not REAL_CLONE, reason="BISECT_NPU_VLLM_ASCEND names no vllm-ascend clone")
def test_on_the_real_history() -> None:
    """Each real recipe passes at both ends of its supported range, and the recipes as they were
    fail where the issue says (run by hand: BISECT_NPU_VLLM_ASCEND=CLONE pytest -m slow ...)."""
    from bisect_npu.upstream import history

    repo = history.open_repo(str(REAL_CLONE))
    for path in bundled_recipes().values():
        recipe = as_recipe(yaml.safe_load(path.read_text()))
        if recipe.engine.backend == "mini":
            continue
        within = tags_within(repo, [spec for _, spec in recipe.supports.requirements()])
        for tag in (within[0], within[-1]):
            assert rules_at(recipe, repo, tag) == [], (recipe.name, tag)
    as_it_was = {"mtp": as_recipe(mtp_as_it_was()), "longseq": as_recipe(longseq_as_it_was())}
    for which, tag, rule in ISSUE_FAILURES:
        assert rule in rules_at(as_it_was[which], repo, tag), (which, tag, rule)
    for tag in ("v0.9.1rc2", "v0.10.0rc1"):
        assert "mla-graph-heads-per-rank" not in rules_at(as_it_was["longseq"], repo, tag)
    for tag in ("v0.9.2rc1", "v0.10.0rc1"):
        assert "ascend-scheduler-batched-tokens" not in rules_at(as_it_was["longseq"], repo, tag)
    assert rules_at(as_it_was["mtp"], repo, "v0.11.0rc0") == []
