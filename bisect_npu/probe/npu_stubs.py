"""Mock modules for the NPU stack, so vllm-ascend's unit tests from before 2026-06-02 import on a
CPU: there `tests/ut/conftest.py` imports the real `torch_npu`; from bb4d0776ee ("[CI] Refactor
test folder", #9807) on, the conftest puts mocks in its place itself, as this does.

Loaded as a pytest plugin (`-p bisect_npu.probe.npu_stubs`) and, for the processes the tests
start (vLLM inspects a model in a child process), through the `sitecustomize.py` beside it in
`npu_site/`, which the runner puts on PYTHONPATH. Stdlib only: it runs inside the candidate's venv.

A real package imports some of its submodules itself, and vllm-ascend's sources read those from
`sys.modules` by name (`importlib.reload(sys.modules["torchair.fx_summary"])`), which no import
hook answers: the runner finds such lookups in the checkout (`looked_up_by_name`) and names them
in `BISECT_NPU_STUB_SUBMODULES`; each is imported, as a mock, with its top-level package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from unittest.mock import MagicMock

STUBBED = ("torch_npu", "acl", "mooncake", "torchair")
SUBMODULES_ENV = "BISECT_NPU_STUB_SUBMODULES"  # comma-separated module names
# A read of sys.modules["torchair.x"] (not an assignment: tests put their own mocks there).
_STUBBED_NAME = "|".join(STUBBED)
_LOOKUP = re.compile(rf"""sys\.modules\[\s*(['"])((?:{_STUBBED_NAME})(?:\.\w+)+)\1\s*\](?!\s*=[^=])""")


def looked_up_by_name(root: Path) -> list[str]:
    """The submodules of the stubbed packages that the Python files under `root` (hidden
    directories left out) read from `sys.modules` by name, sorted."""
    names: set[str] = set()
    for path in root.rglob("*.py"):
        if any(part.startswith(".") for part in path.relative_to(root).parts[:-1]):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "sys.modules" in text:
            names.update(match.group(2) for match in _LOOKUP.finditer(text))
    return sorted(names)


class _MockModule(types.ModuleType):
    """A package whose every missing attribute is a MagicMock (`torch_npu.npu.current_device()`)."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _MockModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if spec := module.__spec__:
            parent, _, child = spec.name.rpartition(".")
            if parent and parent in sys.modules:
                setattr(sys.modules[parent], child, module)
            torch = sys.modules.get("torch")
            if spec.name == "torch_npu" and torch is not None and "npu" not in vars(torch):
                torch.npu = module.npu  # type: ignore[attr-defined]  # as the real torch_npu does on import
            if not parent:
                for name in os.environ.get(SUBMODULES_ENV, "").split(","):
                    if name.startswith(spec.name + "."):
                        importlib.import_module(name)


class NpuStubFinder(importlib.abc.MetaPathFinder):
    """Answers the imports of the NPU stack (and their submodules) with mock modules."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


def install(name_backend: bool = True) -> None:
    """Put the finder first on `sys.meta_path` (once) and, in pytest's process, name the torch
    backend "npu" as vllm-ascend's later conftest does (not at interpreter start-up: importing
    torch that early is what the conftest warns against)."""
    if not any(isinstance(finder, NpuStubFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, NpuStubFinder())
    if not name_backend:
        return
    try:
        import torch

        torch.utils.rename_privateuse1_backend("npu")  # type: ignore[attr-defined]
    except Exception:  # renamed already, or no torch: the stubs still stand
        pass


def pytest_load_initial_conftests(early_config: object, parser: object, args: object) -> None:
    """Before `tests/ut/conftest.py` imports the NPU stack (a `-p` plugin's hook runs first)."""
    install()
