"""minivllm: sampling defaults and OpenAI request fields for a vLLM-like engine (pure Python)."""

__version__ = "0.1.0.dev0"
