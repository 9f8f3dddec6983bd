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


def recipe_variant(dest: Path, layers: list[str] | None = None, model: dict[str, int] | None = None) -> Path:
    """The bundled demo-moe-router recipe with other capture layers or another MoE configuration."""
    body: dict[str, Any] = yaml.safe_load(bundled_recipes()["demo-moe-router"].read_text(encoding="utf-8"))
    if layers is not None:
        body["capture"]["layers"] = layers
    if model is not None:
        body["model"]["path"] = json.dumps(model)
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
    assert {sha for p in report["fix"]["proposals"][:1] for sha in p["shas"]} == {f.sha for f in truth.fixes}


@pytest.fixture(scope="module")
def records(demo_upstream: tuple[Path, Manifest], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Records of the MoE recipe at the good end and at the clean commit; at the culprit and the good end
    without the router in the capture; at the good end with six experts."""
    repo, manifest = demo_upstream
    truth = manifest.case("moe-router")
    base = tmp_path_factory.mktemp("moe")
    clean = git(repo, "log", "--format=%H", "--fixed-strings", f"--grep={CLEAN_TITLE}", truth.bad_ref).split()
    assert len(clean) == 1
    good_tree = checkout(repo, truth.good_sha, base / "tree-good")
    trees = {"good": good_tree, "clean": checkout(repo, clean[0], base / "tree-clean"),
             "culprit": checkout(repo, truth.culprit.sha, base / "tree-culprit")}
    full = recipe_variant(base / "full.yaml")
    no_router = recipe_variant(base / "no-router.yaml", layers=["model.layers.*.self_attn", "model.layers.*.mlp"])
    six = recipe_variant(base / "six.yaml", model={"num_experts": 6, "num_experts_per_tok": 2})
    made = {"good": (full, "good"), "clean": (full, "clean"), "good-no-router": (no_router, "good"),
            "culprit-no-router": (no_router, "culprit"), "six-experts": (six, "good")}
    for name, (recipe, tree) in made.items():
        api.record(recipe, base / name, tree=trees[tree])
    return {name: base / name for name in made}


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


def test_a_dump_without_the_router_is_judged_as_dense_and_says_routing_was_not_checked(
        records: dict[str, Path]) -> None:
    verdict = verdict_from_comparison(compare_dumps(_dump(records["culprit-no-router"]),
                                                    _dump(records["good-no-router"]), LogitsConfig()))
    assert "routing could not be checked at 2 MoE layers (model.layers.0.mlp (Qwen3MoeSparseMoeBlock)" in \
        verdict.reason
    # Judged as before: the flipped tokens' MoE output, compared element by element, is where it diverges.
    assert verdict.kind.value == "bad"
    assert verdict.figures["first_divergent"]["name"].startswith("Module.model.layers.0.mlp.Qwen3MoeSparseMoeBlock")


def test_records_of_another_expert_count_are_refused_in_one_line(records: dict[str, Path]) -> None:
    done = subprocess.run([*CLI, "align", str(records["good"]), str(records["six-experts"])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert re.search(r"model\.layers\.0\.mlp\.gate.* is \[96, 6\] in the candidate and \[96, 8\] in the reference "
                     r"\(another expert count or top-k\); compare dumps of one model config", last), last
