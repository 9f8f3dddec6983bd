"""Acquire a runnable environment for a candidate commit (DESIGN.md, `build/`)."""
