"""Acquire a runnable environment for a candidate commit (docs/design/build-keys.md)."""
