"""The demo's MoE variant: its router GEMM run in bf16 where it ran in fp32 is bisected with the dumps
oracle to its culprit and named at the router, the clean MoE commits are aligned, and dumps without
the router or of another MoE configuration are handled as the dump rules say.

Real parts: the generated demo upstream, its worktrees built, the probe's runs of the demo engine,
its layer dumps on disk, the command line in a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bisect_npu import api
from bisect_npu.demo.manifest import Manifest
from bisect_npu.demo.moe import MOE_MODEL
from bisect_npu.oracle.config import LogitsConfig
from bisect_npu.oracle.dumps.compare import compare_dumps, verdict_from_comparison
from bisect_npu.recipe.loader import bundled_recipes

pytestmark = pytest.mark.e2e  # the demo's model runs in probe subprocesses

CLI = [sys.executable, "-m", "bisect_npu"]
ROUTER = "Module.model.layers.0.mlp.gate.Qwen3MoeTopKRouter.forward.0.output.0"
CLEAN_TITLE = "[Perf] Apply the routing weight before the experts' down projection"
FINDING = re.compile(r"router: (?P<rate>[\d.]+)% of tokens route to another expert set; rounding explains at most "
                     r"(?P<explained>[\d.]+)%")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def checkout(repo: Path, sha: str, dest: Path) -> Path:
    if not dest.exists():
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(dest), sha], check=True)
        subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=dest, check=True, capture_output=True)
    return dest


def recipe_variant(dest: Path, layers: list[str] | None = None, model: dict[str, int] | Path | None = None,
                   engine: dict[str, Any] | None = None) -> Path:
    """The bundled demo-moe-router recipe with other capture layers, another MoE configuration (or a
    Hugging Face model directory) or another engine."""
    body: dict[str, Any] = yaml.safe_load(bundled_recipes()["demo-moe-router"].read_text(encoding="utf-8"))
    if layers is not None:
        body["capture"]["layers"] = layers
    if model is not None:
        body["model"]["path"] = str(model) if isinstance(model, Path) else json.dumps(model)
    if engine is not None:
        body["engine"] = engine
    dest.write_text(yaml.safe_dump(body), encoding="utf-8")
    return dest


def test_the_router_in_bf16_is_bisected_to_its_culprit_and_named_at_the_gate(
        demo_upstream: tuple[Path, Manifest], tmp_path: Path) -> None:
    repo, manifest = demo_upstream
    truth = manifest.case("moe-router")
    session = tmp_path / "session"
    done = subprocess.run([*CLI, "run", "--repo", str(repo), "--good", truth.good_ref, "--bad", truth.bad_ref,
                           "--recipe", truth.recipe, "--session", str(session), "--json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["culprit"] == truth.culprit.sha
    report = json.loads((session / "report.json").read_text())
    steps = {step["commit"]: step for step in report["steps"]}
    culprit = steps[truth.culprit.sha]
    assert culprit["verdict"] == "bad" and ROUTER in culprit["reason"]
    found = FINDING.search(culprit["reason"])
    assert found is not None, culprit["reason"]
    assert float(found["rate"]) > 2.0 and float(found["explained"]) == 0.0
    goods = [step for step in report["steps"] if step["verdict"] == "good"]
    assert goods and all("every token routed alike in 2 MoE layers" in step["reason"] for step in goods)
    # A good commit holds the clean change of the experts' arithmetic: judged good, not only the good end.
    (clean,) = git(repo, "log", "--format=%H", "--fixed-strings", f"--grep={CLEAN_TITLE}", truth.bad_ref).split()
    assert any(clean in git(repo, "rev-list", step["commit"]).split() for step in goods)
    assert {sha for p in report["fix"]["proposals"][:1] for sha in p["shas"]} == {f.sha for f in truth.fixes}


@pytest.fixture(scope="module")
def trees(demo_upstream: tuple[Path, Manifest], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Built worktrees of the MoE case's good end and its clean commit."""
    repo, manifest = demo_upstream
    truth = manifest.case("moe-router")
    base = tmp_path_factory.mktemp("moe-trees")
    clean = git(repo, "log", "--format=%H", "--fixed-strings", f"--grep={CLEAN_TITLE}", truth.bad_ref).split()
    assert len(clean) == 1
    return {"good": checkout(repo, truth.good_sha, base / "good"), "clean": checkout(repo, clean[0], base / "clean")}


@pytest.fixture(scope="module")
def records(trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Records of the MoE recipe at the good end and at the clean commit."""
    base = tmp_path_factory.mktemp("moe")
    full = recipe_variant(base / "full.yaml")
    for name in ("good", "clean"):
        api.record(full, base / name, tree=trees[name])
    return {name: base / name for name in ("good", "clean")}


@pytest.fixture(scope="module")
def variants(demo_upstream: tuple[Path, Manifest], trees: dict[str, Path], records: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The transformers golden of the good end's MoE model; the good end and the culprit without the
    router in the capture; the good end with six experts."""
    repo, manifest = demo_upstream
    base = tmp_path_factory.mktemp("moe-variants")
    trees = {**trees, "culprit": checkout(repo, manifest.case("moe-router").culprit.sha, base / "culprit")}
    hf = base / "hf-model"
    subprocess.run([sys.executable, "-m", "bisect_npu.probe.export_mini", MOE_MODEL, str(hf)], check=True,
                   capture_output=True, env={**_environ(), "PYTHONPATH": str(trees["good"])})
    golden = recipe_variant(base / "golden.yaml", engine={"backend": "transformers",
                                                          "args": {"device": "auto", "ignore_eos": True}}, model=hf)
    api.record(golden, base / "golden")
    no_router = recipe_variant(base / "no-router.yaml", layers=["model.layers.*.self_attn", "model.layers.*.mlp"])
    six = recipe_variant(base / "six.yaml", model={"num_experts": 6, "num_experts_per_tok": 2})
    made = {"good-no-router": (no_router, "good"), "culprit-no-router": (no_router, "culprit"),
            "six-experts": (six, "good")}
    for name, (recipe, tree) in made.items():
        api.record(recipe, base / name, tree=trees[tree])
    return {**records, "golden": base / "golden", **{name: base / name for name in made}}


def _environ() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _dump(record: Path) -> Path:
    return next(record.glob("*.dump"))


def test_the_clean_moe_commit_is_aligned_and_every_token_routes_alike(records: dict[str, Path]) -> None:
    result = api.align(records["good"], records["clean"])
    assert result.aligned, result.summary()
    comparison = compare_dumps(_dump(records["clean"]), _dump(records["good"]), LogitsConfig())
    assert [(r.module, r.tokens, r.experts, r.top_k, len(r.flips)) for r in comparison.routing] == [
        ("model.layers.0.mlp.gate", 96, 8, 2, 0), ("model.layers.1.mlp.gate", 96, 8, 2, 0)]
    # The clean commit moved the experts' fp32 rounding: not bit-identical, within the pass lines.
    block = next(row for row in comparison.rows if row.name.startswith("Module.model.layers.0.mlp.Qwen3MoeSparse"))
    assert 1.0 - 1e-9 < block.metrics["cosine"] < 1.0


@pytest.mark.heavy  # a variant: a transformers record beside the engine's
def test_the_demo_moe_engine_aligns_with_transformers_qwen3_moe_router_and_all(variants: dict[str, Path]) -> None:
    """Its model loaded into transformers' Qwen3MoeForCausalLM is the golden: the routers' dumps line up
    (logits, weights, expert ids under the same names) and route alike."""
    result = api.align(variants["golden"], variants["good"])
    assert result.aligned, result.summary()
    comparison = compare_dumps(_dump(variants["good"]), _dump(variants["golden"]), LogitsConfig())
    assert [(r.module, r.experts, r.top_k) for r in comparison.routing] == [
        ("model.layers.0.mlp.gate", 8, 2), ("model.layers.1.mlp.gate", 8, 2)]
    assert not comparison.routing_unchecked
    routers = [row for row in comparison.rows if ".mlp.gate." in row.name]
    assert len(routers) == 2 * 4  # per layer: the router's input, logits, weights and chosen ids


@pytest.mark.heavy  # bad input shown on the demo's dumps; tests/oracle/test_oracle_routing.py has it on HF's
def test_a_dump_without_the_router_is_judged_as_dense_and_says_routing_was_not_checked(
        variants: dict[str, Path]) -> None:
    verdict = verdict_from_comparison(compare_dumps(_dump(variants["culprit-no-router"]),
                                                    _dump(variants["good-no-router"]), LogitsConfig()))
    assert "routing could not be checked at 2 MoE layers (model.layers.0.mlp (Qwen3MoeSparseMoeBlock)" in \
        verdict.reason
    # Judged as before: the flipped tokens' MoE output, compared element by element, is where it diverges.
    assert verdict.kind.value == "bad"
    assert verdict.figures["first_divergent"]["name"].startswith("Module.model.layers.0.mlp.Qwen3MoeSparseMoeBlock")


@pytest.mark.heavy  # bad input shown on the demo's records; tests/oracle/test_oracle_routing.py has it on HF's
def test_records_of_another_expert_count_are_refused_in_one_line(variants: dict[str, Path]) -> None:
    done = subprocess.run([*CLI, "align", str(variants["good"]), str(variants["six-experts"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert re.search(r"model\.layers\.0\.mlp\.gate.* is \[96, 6\] in the candidate and \[96, 8\] in the reference "
                     r"\(another expert count or top-k\); compare dumps of one model config", last), last


DENSE_LOGITS = """
import sys, torch
from tinyvllm.config import load_model_config
from tinyvllm.model import Qwen3Model
model = Qwen3Model(load_model_config("seed:0"))
torch.save(model.forward(list(range(3, 99)), model.new_cache(128)), sys.argv[1])
"""


@pytest.mark.heavy  # two model runs in subprocesses, for a property no case's range crosses
def test_the_dense_model_is_bit_for_bit_what_it_was_before_the_moe_feature(
        demo_upstream: tuple[Path, Manifest], tmp_path: Path) -> None:
    import torch

    repo, manifest = demo_upstream
    feature = git(repo, "log", "--format=%H", "--fixed-strings", "--grep=[Feature] Qwen3-MoE", "main").split()
    assert len(feature) == 1
    logits = []
    for name, sha in (("before", f"{feature[0]}^"), ("good", manifest.case("moe-router").good_sha)):
        tree = tmp_path / name
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(tree), sha], check=True)
        subprocess.run([sys.executable, "-c", DENSE_LOGITS, str(tmp_path / f"{name}.pt")], check=True,
                       env={**_environ(), "PYTHONPATH": str(tree)}, timeout=120)
        logits.append(torch.load(tmp_path / f"{name}.pt"))
    assert torch.equal(logits[0], logits[1])
