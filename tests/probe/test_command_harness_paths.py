"""A command harness's own file named relative to the recipe (`[python, my_eval.py, ...]`, the
docs' example) is found beside the recipe, as the dataset is, wherever the harness runs."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_npu.orchestration.running.probe_requests import accuracy_inputs, probe_request
from bisect_npu.recipe.loader import load_recipe


def test_a_relative_program_resolves_against_the_recipes_directory(tmp_path: Path) -> None:
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "my_eval.py").write_text("print('scored')\n")
    (tmp_path / "evals" / "data.jsonl").write_text('{"id": "1", "question": "q", "answer": "a"}\n')
    recipe_path = tmp_path / "evals" / "recipe.yaml"
    recipe_path.write_text(json.dumps({
        "name": "relative-harness", "model": {"path": "seed:0"},
        "engine": {"backend": "openai", "launcher": ["{python}", "-m", "{probe}.serve_mini", "{model}"]},
        "accuracy": {"harness": "command", "dataset": "data.jsonl",
                     "command": {"argv": ["python", "my_eval.py", "--out", "{output}", "not_a_file.py"]}},
        "oracle": {"kinds": ["accuracy"]}}))
    recipe = load_recipe(recipe_path)
    request = probe_request(recipe, recipe.cases[0], "c0ffee", 0)
    argv = request["accuracy"]["command"]["argv"]
    assert argv == ["python", str(tmp_path / "evals" / "my_eval.py"), "--out", "{output}", "not_a_file.py"]
    assert tmp_path / "evals" / "my_eval.py" in accuracy_inputs(recipe)  # a container gets it at the same path
