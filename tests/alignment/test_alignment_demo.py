"""The demo shows precision alignment: its model loaded into Hugging Face transformers is the golden,
and the demo engine aligns with it at a good commit and diverges at the RoPE drift's culprit, first
in layer 0's attention (the long prompt reaches past max_position_embeddings in the prefill).

Real parts: the generated demo upstream, its worktrees built, real probe runs of both engines,
records on disk, the command line in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bisect_npu import api
from bisect_npu.alignment.record import MANIFEST
from bisect_npu.errors import UsageError
from bisect_npu.recipe.loader import load_recipe
from tests.helpers.cli_exit import cli_in_process

pytestmark = pytest.mark.e2e  # the demo's model and transformers run

WORDS = ["the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with", "as",
         "i", "his", "they", "be", "at", "one", "have", "this"]
# 150 vocabulary words: the prefill reaches past max_position_embeddings (128), where the culprit's
# RoPE cache extension drops the scaling factor.
LONG_PROMPT = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(150))
LAYERS = ["model.layers.*.input_layernorm", "model.layers.*.self_attn", "lm_head"]
FIRST_ATTENTION = "Module.model.layers.0.self_attn.Qwen3Attention.forward.0"


def checkout(repo: Path, sha: str, dest: Path) -> Path:
    if not dest.exists():
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(dest), sha], check=True)
        subprocess.run([sys.executable, "tools/build_kernels.py"], cwd=dest, check=True, capture_output=True)
    return dest


def write_recipe(path: Path, name: str, engine: dict[str, Any], model: str, prompt: str = LONG_PROMPT,
                 layers: list[str] = LAYERS) -> Path:
    path.write_text(yaml.safe_dump({
        "name": name, "model": {"path": model, "dtype": "float32"}, "engine": engine,
        "cases": [{"id": "long-prompt", "prompt": prompt,
                   "sampling": {"temperature": 0.0, "max_tokens": 8, "seed": 0, "logprobs": 5}}],
        "capture": {"layers": layers, "steps": [0]},
        "oracle": {"kinds": ["stages"]}, "reference": {"kind": "good_end"}}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def demo(demo_upstream: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Records of the HF golden, the demo engine at the culprit's parent, and at the culprit."""
    repo, manifest = demo_upstream
    case = manifest.case("rope-longseq")
    base = tmp_path_factory.mktemp("alignment")
    good = checkout(repo, case.culprit_parent, base / "tree-good")
    bad = checkout(repo, case.culprit.sha, base / "tree-bad")
    hf = base / "hf-model"
    subprocess.run([sys.executable, "-m", "bisect_npu.probe.export_mini", "seed:0", str(hf)], check=True,
                   capture_output=True, env={**_environ(), "PYTHONPATH": str(good)})
    golden_recipe = write_recipe(base / "golden.yaml", "demo-golden",
                                 {"backend": "transformers", "args": {"device": "auto", "ignore_eos": True}}, str(hf))
    engine_recipe = write_recipe(base / "engine.yaml", "demo-engine", {"backend": "mini"}, "seed:0")
    paths = {"base": base, "good_tree": good, "bad_tree": bad, "engine_recipe": engine_recipe,
             "golden_recipe": golden_recipe}
    api.record(golden_recipe, base / "golden")
    api.record(engine_recipe, base / "good", tree=good, commit=case.culprit_parent)
    api.record(engine_recipe, base / "bad", tree=bad, commit=case.culprit.sha)
    return {**paths, "golden": base / "golden", "good": base / "good", "bad": base / "bad"}


def _environ() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def test_the_demo_engine_aligns_with_transformers_at_a_good_commit(demo: dict[str, Path]) -> None:
    result = api.align(demo["golden"], demo["good"])
    assert result.aligned, result.summary()
    stages = result.cases[0].verdict.figures["stages"]
    assert set(stages) == {"chat_template", "prompt_token_ids", "forward", "sampler", "text"}
    # Two implementations of the same math: close, not bit-identical.
    assert 0.999999 < stages["forward"]["worst_cosine"] < 1.0
    manifest = json.loads((demo["golden"] / MANIFEST).read_text())
    assert manifest["complete"] and manifest["backend"] == "transformers" and manifest["device"] == "cpu"
    assert "transformers" in manifest["versions"] and manifest["model_identity"]["num_hidden_layers"] == 2


def test_at_the_rope_culprit_the_first_divergent_module_is_layer_0s_attention(demo: dict[str, Path]) -> None:
    result = api.align(demo["golden"], demo["bad"])
    assert not result.aligned and result.exit_code == 1
    first = result.first
    assert first is not None and first.first_stage == "forward"
    assert first.first_module == FIRST_ATTENTION
    # Its input (input_layernorm's output) still agrees: the drift enters in the attention.
    forward = first.verdict.figures["stages"]["forward"]["first_divergent"]
    assert forward["baseline"]["cosine"] > 0.999999
    assert "layers.0.self_attn" in result.to_markdown()


def test_align_on_the_command_line_prints_markdown_and_json_and_exits_by_the_answer(demo: dict[str, Path],
                                                                                   tmp_path: Path) -> None:
    done = cli_in_process(["align", str(demo["golden"]), str(demo["bad"]), "--json", "--markdown",
                           str(tmp_path / "align.md")])
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["first_stage"], answer["first_module"]) == ("forward", FIRST_ATTENTION)
    assert "# Alignment" in (tmp_path / "align.md").read_text()
    done = cli_in_process(["align", str(demo["golden"]), str(demo["good"])])
    assert done.returncode == 0, done.stderr
    assert "**aligned" in done.stdout


def test_a_record_is_a_recipes_golden_reference(demo: dict[str, Path]) -> None:
    body = yaml.safe_load(demo["engine_recipe"].read_text())
    body["reference"] = {"kind": "golden", "path": str(demo["golden"])}
    recipe_path = demo["base"] / "with-golden.yaml"
    recipe_path.write_text(yaml.safe_dump(body))
    files = load_recipe(recipe_path).golden_files()
    assert [f.name for f in files] == ["obs-long-prompt-t0.json"]
    verdict = api.judge(recipe_path, [demo["bad"] / "obs-long-prompt-t0.json"], files)
    assert verdict.kind.value == "bad" and verdict.figures["first_differing_stage"] == "forward"

    body["cases"][0]["prompt"] = "the of and"
    recipe_path.write_text(yaml.safe_dump(body))
    with pytest.raises(UsageError, match=r"was made for other cases .* bisect-npu record --recipe"):
        load_recipe(recipe_path).golden_files()


def test_records_that_cannot_be_aligned_are_refused_with_the_way_on(demo: dict[str, Path], tmp_path: Path) -> None:
    other_cases = write_recipe(tmp_path / "short.yaml", "demo-short", {"backend": "mini"}, "seed:0", prompt="the of")
    api.record(other_cases, tmp_path / "short", tree=demo["good_tree"])
    with pytest.raises(UsageError, match=r"the records ran different cases .* record both from recipes with the same"):
        api.align(demo["golden"], tmp_path / "short")

    fewer = write_recipe(tmp_path / "fewer.yaml", "demo-engine", {"backend": "mini"}, "seed:0",
                         layers=["model.layers.*.self_attn"])
    api.record(fewer, tmp_path / "fewer", tree=demo["good_tree"])
    with pytest.raises(UsageError, match=r"name different modules .* record both with the same capture\.layers"):
        api.align(demo["golden"], tmp_path / "fewer")

    other_model = write_recipe(tmp_path / "wide.yaml", "demo-engine", {"backend": "mini"},
                               json.dumps({"hidden_size": 32, "intermediate_size": 96}))
    api.record(other_model, tmp_path / "wide", tree=demo["good_tree"])
    with pytest.raises(UsageError, match=r"the records ran different models .*hidden_size 64.*hidden_size 32"):
        api.align(demo["golden"], tmp_path / "wide")


def test_an_interrupted_record_is_refused_and_nothing_is_overwritten_without_force(demo: dict[str, Path],
                                                                                    tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(demo["good"], copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    (copy / MANIFEST).write_text(json.dumps({**manifest, "complete": False}))
    with pytest.raises(UsageError, match=r"is incomplete \(interrupted after 1 of 1 cases\); finish it with the "
                                         r"command that made it: bisect-npu record --recipe .*engine.yaml --out .* "
                                         r"--tree .*tree-good --commit [0-9a-f]{40}"):
        api.align(demo["golden"], copy)
    with pytest.raises(UsageError, match=r"is an interrupted record made by .* at [0-9a-f]{40}; this command asks .* "
                                         r"at an unnamed commit"):  # not what made it: refused, nothing run
        api.record(demo["engine_recipe"], copy, tree=demo["good_tree"])
    finished = (copy / "obs-long-prompt-t0.json").stat().st_mtime_ns
    resumed = api.record(demo["engine_recipe"], copy, tree=demo["good_tree"],
                         commit=manifest["commit"])  # what made it: the finished case is kept
    assert resumed.manifest["complete"] and (copy / "obs-long-prompt-t0.json").stat().st_mtime_ns == finished

    with pytest.raises(UsageError, match="already holds a record; pass --force"):
        api.record(demo["engine_recipe"], copy, tree=demo["good_tree"])
    done = subprocess.run([sys.executable, "-m", "bisect_npu", "record", "--recipe", str(demo["engine_recipe"]),
                           "--out", str(copy)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "already holds a record; pass --force to overwrite it, or choose another --out")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="exists and is not a record"):
        api.record(demo["engine_recipe"], tmp_path / "notes", force=True, tree=demo["good_tree"])
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
    made = api.record(demo["engine_recipe"], copy, force=True, tree=demo["good_tree"])
    assert made.manifest["complete"] and api.align(demo["golden"], copy).aligned


def test_align_runs_a_recipe_here_as_the_candidate(demo: dict[str, Path], tmp_path: Path) -> None:
    result = api.align(demo["golden"], tmp_path / "candidate", recipe=demo["engine_recipe"], tree=demo["bad_tree"])
    assert result.first is not None and result.first.first_module == FIRST_ATTENTION
    assert result.candidate.manifest["complete"] and (tmp_path / "candidate" / MANIFEST).exists()
    with pytest.raises(UsageError, match="is not empty: give a new directory"):
        api.align(demo["golden"], tmp_path / "candidate", recipe=demo["engine_recipe"], tree=demo["bad_tree"])
