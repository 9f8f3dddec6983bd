"""Records read back and compared without an engine: real files on disk (observations, dumps written
by the dump writer the oracle reads), each refusal one line with the way on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bisect_npu.alignment.align import align_records, check_comparable
from bisect_npu.alignment.record import (
    FORMAT,
    MANIFEST,
    VERSION,
    cases_digest,
    golden_observation_files,
    read_record,
    relative_dumps,
)
from bisect_npu.errors import UsageError
from bisect_npu.oracle.dumps.compare import write_dump

IDENTITY = {"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "tokenizer": "abc"}
CASES = cases_digest([{"id": "c", "prompt": "hello"}])


def make_record(root: Path, *, text: str = "a b c", tensors: list[tuple[str, np.ndarray]] | None = None,
                identity: dict[str, Any] | None = None, digest: str = CASES, complete: bool = True,
                template: str = "hello") -> Path:
    root.mkdir(parents=True)
    observation: dict[str, Any] = {"schema_version": 1, "case_id": "c", "prompt_token_ids": [1, 2], "text": text,
                                   "output_token_ids": [3, 4, 5], "sampling": {"temperature": 0.0}, "extra": {}}
    if tensors is not None:
        write_dump(root / "obs-c-t0.dump", tensors)
        observation["logits_dump"] = str(root / "obs-c-t0.dump")
    observation["extra"]["stages"] = {"chat_template": template, "prompt_token_ids": [1, 2],
                                      "forward": observation.get("logits_dump"), "sampler": {"temperature": 0.0},
                                      "text": text}
    (root / "obs-c-t0.json").write_text(json.dumps(relative_dumps(observation, root)))
    (root / MANIFEST).write_text(json.dumps({
        "format": FORMAT, "version": VERSION, "complete": complete, "backend": "mini", "device": "cpu",
        "recipe": {"name": "r", "digest": "d", "cases_digest": digest}, "model_identity": identity or IDENTITY,
        "case_ids": ["c"], "cases": {"c": "obs-c-t0.json"}}))
    return root


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
    with pytest.raises(UsageError, match=r"incomplete \(interrupted after 1 of 1 cases\); finish it with the same "):
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
    assert "| chat_template | **no** | first difference at 4" in result.to_markdown()


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
