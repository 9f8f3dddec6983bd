"""Orchestration: ties the rooms together for one run (session specs, environments, sessions, bisection levels)."""
