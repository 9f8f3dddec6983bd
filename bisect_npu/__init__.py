"""bisect-npu: bisect vllm-ascend accuracy regressions on Ascend NPUs.

This module stays import-light on purpose: the probe package runs inside candidate
environments that have only the standard library and the engine.
"""

__version__ = "0.2.0"  # pyproject reads it; CHANGELOG.md says what each version changed
