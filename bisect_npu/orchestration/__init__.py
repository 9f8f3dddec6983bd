"""Orchestration: ties the rooms together for one run (options, wiring, sessions, levels)."""
