"""Records read back and compared without an engine: real files on disk (observations, dumps written
by the dump writer the oracle reads), each refusal one line with the way on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bisect_npu.alignment.align import align_records, check_comparable
from bisect_npu.alignment.record import MANIFEST, cases_digest, golden_observation_files, read_record
from bisect_npu.errors import UsageError
from tests.helpers.records import CASES, IDENTITY, make_record


def hidden(seed: int, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((1, 6, 4)) * scale).astype(np.float32)


def test_dump_paths_are_kept_relative_and_read_back_against_the_record(tmp_path: Path) -> None:
    root = make_record(tmp_path / "ref", tensors=[("model.layers.0.self_attn", hidden(0))])
    assert json.loads((root / "obs-c-t0.json").read_text())["logits_dump"] == "obs-c-t0.dump"
    moved = tmp_path / "copied-from-a-gpu-host"
    root.rename(moved)
    record = read_record(moved)
    assert record.observations["c"].logits_dump == str(moved / "obs-c-t0.dump")
    assert record.observations["c"].extra["stages"]["forward"] == str(moved / "obs-c-t0.dump")


@pytest.mark.parametrize(("damage", "message"), [
    (lambda root: (root / MANIFEST).unlink(), r"is not a record \(no record.json\); make one with: bisect-npu record"),
    (lambda root: (root / MANIFEST).write_text("{"), r"record.json is not valid JSON .*; record it again: "),
    (lambda root: (root / MANIFEST).write_text('{"format": "other"}'), "is not a bisect-npu-record manifest"),
    (lambda root: (root / "obs-c-t0.json").unlink(), r"lacks obs-c-t0.json \(case c\); record it again: "
                                                     r"bisect-npu record --recipe r --out .* --force"),
])
def test_a_damaged_record_is_refused_in_one_line(tmp_path: Path, damage: Any, message: str) -> None:
    root = make_record(tmp_path / "rec")
    damage(root)
    with pytest.raises(UsageError, match=message) as error:
        read_record(root)
    assert "\n" not in str(error.value)


def test_an_interrupted_record_is_refused(tmp_path: Path) -> None:
    root = make_record(tmp_path / "rec", complete=False)
    with pytest.raises(UsageError, match=r"incomplete \(interrupted after 1 of 1 cases\); finish it with the command "
                                         r"that made it: bisect-npu record --recipe r --out "):
        read_record(root)


def test_a_golden_record_must_hold_the_recipes_cases(tmp_path: Path) -> None:
    root = make_record(tmp_path / "rec")
    assert golden_observation_files(root, "r", CASES) == [root / "obs-c-t0.json"]
    with pytest.raises(UsageError, match="was made for other cases"):
        golden_observation_files(root, "r", cases_digest([{"id": "c", "prompt": "bye"}]))


def test_the_first_differing_stage_is_named_with_its_evidence(tmp_path: Path) -> None:
    ref = read_record(make_record(tmp_path / "ref", template="hello"))
    same = read_record(make_record(tmp_path / "same", template="hello"))
    other = read_record(make_record(tmp_path / "other", template="hellO", text="a b d"))
    assert align_records(ref, same).aligned
    result = align_records(ref, other)
    assert (result.aligned, result.exit_code, result.first.first_stage) == (False, 1, "chat_template")
    assert result.to_dict()["cases"][0]["figures"]["stages"]["text"]["matches"] is False
    # Which side is which: the candidate's text, then the reference's, each named.
    assert ("| chat_template | **no** | first difference at 4: candidate `'hellO'`, reference `'hello'` |"
            in result.to_markdown())


def test_the_forward_stage_names_the_first_divergent_module(tmp_path: Path) -> None:
    x, attn = hidden(1), hidden(2)
    ref = read_record(make_record(tmp_path / "ref", tensors=[("model.layers.0.input_layernorm", x),
                                                             ("model.layers.0.self_attn", attn)]))
    bad = read_record(make_record(tmp_path / "bad", tensors=[("model.layers.0.input_layernorm", x),
                                                             ("model.layers.0.self_attn", hidden(3))]))
    result = align_records(ref, bad)
    assert result.first.first_stage == "forward"
    assert result.first.first_module == "model.layers.0.self_attn"


@pytest.mark.parametrize(("change", "message"), [
    ({"digest": cases_digest([{"id": "c", "prompt": "bye"}])}, "ran different cases .* with the same cases"),
    ({"identity": {**IDENTITY, "hidden_size": 8}}, "ran different models .*hidden_size 4.*hidden_size 8"),
    ({"identity": {**IDENTITY, "tokenizer": "xyz"}}, "different tokenizers .*abc vs xyz"),
    ({"tensors": [("model.layers.0.mlp", hidden(0))]}, r"name different modules .*model\.layers\.0\.self_attn"),
])
def test_records_that_cannot_be_compared_are_refused(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    ref = read_record(make_record(tmp_path / "ref", tensors=[("model.layers.0.self_attn", hidden(0))]))
    other = read_record(make_record(tmp_path / "other", **{"tensors": [("model.layers.0.self_attn", hidden(0))],
                                                            **change}))
    with pytest.raises(UsageError, match=message):
        check_comparable(ref, other)


RECORD_RECIPE = ("name: rec\nmodel: {path: 'seed:0'}\nengine: {backend: mini}\noracle: {kinds: [stages]}\n"
                 "cases: [{id: c0, prompt: a}, {id: c1, prompt: b}]\n")


def interrupted_record(tmp_path: Path, recipe: Path, tree: Path, commit: str) -> Path:
    """An interrupted record of `recipe`'s two cases made from `tree` at `commit`: c0 on disk, c1 not."""
    from bisect_npu.orchestration.running.recording import _new_manifest, _write_manifest
    from bisect_npu.recipe.loader import load_recipe

    out = tmp_path / "rec"
    manifest = _new_manifest(out, load_recipe(recipe), False, tree, commit, None)
    (out / "obs-c0-t0.json").write_text(json.dumps({"schema_version": 1, "case_id": "c0", "output_token_ids": [1]}))
    manifest["cases"]["c0"] = "obs-c0-t0.json"
    _write_manifest(out, manifest)
    return out


@pytest.mark.parametrize(("tree", "commit", "named"), [
    ("b", "v0.9.0", r"made by .*, tree .*/a at v0\.9\.0; this command asks .*, tree .*/b at v0\.9\.0"),
    ("a", "v0.9.1", r"made by .*, tree .*/a at v0\.9\.0; this command asks .*, tree .*/a at v0\.9\.1"),
])
def test_an_interrupted_record_is_finished_only_by_what_made_it(tmp_path: Path, tree: str, commit: str,
                                                                named: str) -> None:
    """Its cases would come from two trees or commits under a manifest naming one: refused, naming both,
    before any case runs; the finished case stays."""
    from bisect_npu import api

    recipe = tmp_path / "rec.yaml"
    recipe.write_text(RECORD_RECIPE)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    out = interrupted_record(tmp_path, recipe, tmp_path / "a", "v0.9.0")
    with pytest.raises(UsageError, match=named) as refused:
        api.record(recipe, out, tree=tmp_path / tree, commit=commit)
    assert "\n" not in str(refused.value) and "--force" in str(refused.value)
    assert json.loads((out / MANIFEST).read_text())["cases"] == {"c0": "obs-c0-t0.json"}
    with pytest.raises(UsageError, match=r"--tree .*/a --commit v0\.9\.0"):  # how to finish it
        read_record(out)


def test_an_interrupted_record_of_another_recipe_version_names_both_digests(tmp_path: Path) -> None:
    from bisect_npu import api
    from bisect_npu.recipe.loader import load_recipe

    recipe = tmp_path / "rec.yaml"
    recipe.write_text(RECORD_RECIPE)
    (tmp_path / "a").mkdir()
    out = interrupted_record(tmp_path, recipe, tmp_path / "a", "v0.9.0")
    before = load_recipe(recipe).digest()
    recipe.write_text(RECORD_RECIPE.replace("prompt: b", "prompt: c"))
    with pytest.raises(UsageError, match=f"recipe rec {before}.* {load_recipe(recipe).digest()}"):
        api.record(recipe, out, tree=tmp_path / "a", commit="v0.9.0")


@pytest.mark.e2e  # the command line in a subprocess, interrupted
def test_ctrl_c_during_record_names_the_command_that_finishes_it(tmp_path: Path) -> None:
    """The probe hangs (its interpreter is a script that sleeps); Ctrl-C: exit 130, and the line
    says what is kept and the command that finishes the record; no word of a session."""
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.signals import interruptible

    recipe, hang, out = tmp_path / "rec.yaml", tmp_path / "python", tmp_path / "rec"
    recipe.write_text(RECORD_RECIPE)
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    (tmp_path / "tree").mkdir()
    child = subprocess.Popen([sys.executable, "-m", "bisect_npu", "record", "--recipe", str(recipe), "--out", str(out),
                              "--tree", str(tmp_path / "tree"), "--commit", "v0.9.0", "--python", str(hang)],
                             stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 60
    while not (out / MANIFEST).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last == (f"bisect-npu: interrupted; the cases recorded so far are kept in {out}: `bisect-npu record "
                    f"--recipe {recipe} --out {out} --tree {tmp_path / 'tree'} --commit v0.9.0` finishes the "
                    "record"), err
    assert "session" not in err
