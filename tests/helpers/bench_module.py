"""A bench script imported as a module (bench/ is not a package), for tests of its parts."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.helpers.paths import REPO_ROOT


def load_bench(name: str) -> ModuleType:
    """bench/<name>.py as the module `name`, registered first: its dataclasses look it up."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
