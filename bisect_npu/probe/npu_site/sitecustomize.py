"""Loads bisect-npu's NPU stubs (../npu_stubs.py, by path) in every Python process of a unit-test
run: the processes vllm-ascend's tests start import the NPU stack too."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bisect_npu_npu_stubs", Path(__file__).resolve().parent.parent
                                               / "npu_stubs.py")
if _spec is not None and _spec.loader is not None:
    _stubs = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_stubs)
    _stubs.install(name_backend=False)
