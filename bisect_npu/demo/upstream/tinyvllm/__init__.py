"""tinyvllm: a small CPU inference engine shaped like vLLM (demo upstream for bisect-npu)."""

__version__ = "0.9.0"
