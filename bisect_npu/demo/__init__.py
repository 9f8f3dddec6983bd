"""The bundled demo upstream: a small Qwen3-style CPU engine (`tinyvllm`) and a generated git
history with four seeded regressions, their fixes, and a manifest of the ground truth."""
