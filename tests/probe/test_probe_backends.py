"""The probe backend registry: every registered module satisfies ProbeBackend, choosing one imports
no engine, an unknown name is a clear error naming the known ones, and recipes take their choices
from the same registry."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_npu.errors import UsageError
from bisect_npu.probe.backends import BACKENDS, ProbeBackend, UnknownBackend, load_backend
from bisect_npu.recipe.loader import parse_recipe
from bisect_npu.recipe.schema import EngineSpec

MINIMAL = "name: t\nmodel:\n  path: /models/m\ncases:\n  - id: a\n    prompt: hi\n"


@pytest.mark.parametrize("name", BACKENDS)
def test_each_registered_backend_satisfies_the_protocol(name: str) -> None:
    backend = load_backend(name)
    assert isinstance(backend, ProbeBackend)
    # __main__ opens a batch engine with `trials=`; a single request calls run_case(request)
    assert list(inspect.signature(backend.open_engine).parameters) == ["request", "trials"]
    assert list(inspect.signature(backend.run_case).parameters) == ["request"]
    engine_type = inspect.signature(backend.open_engine).return_annotation
    engine_class = getattr(backend, engine_type)
    assert callable(engine_class.run) and callable(engine_class.close)


def test_choosing_every_backend_imports_no_engine() -> None:
    """The engines (tinyvllm, vllm, torch) are imported when an engine starts, not when a backend is chosen."""
    script = ("import sys; from bisect_npu.probe.backends import BACKENDS, load_backend; "
              "[load_backend(name) for name in BACKENDS]; "
              "print(sorted(m for m in ('tinyvllm', 'vllm', 'torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_an_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(UnknownBackend) as error:
        load_backend("tgi")
    assert str(error.value) == "unknown probe backend 'tgi'; known: mini, vllm, openai, transformers"


def test_the_probe_exits_2_on_an_unknown_backend(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"schema_version": 1, "backend": "tgi", "output": str(tmp_path / "obs.json")}))
    done = subprocess.run([sys.executable, "-m", "bisect_npu.probe", str(request)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "unknown probe backend 'tgi'; known: mini, vllm, openai, transformers" in done.stderr
    assert not (tmp_path / "obs.json").exists()


def test_recipes_accept_exactly_the_registered_backends() -> None:
    assert set(EngineSpec.model_json_schema()["properties"]["backend"]["enum"]) == set(BACKENDS)
    for name in BACKENDS:
        assert parse_recipe(MINIMAL + f"engine:\n  backend: {name}\n").engine.backend == name
    with pytest.raises(UsageError, match=r"'engine\.backend'"):
        parse_recipe(MINIMAL + "engine:\n  backend: tgi\n")
