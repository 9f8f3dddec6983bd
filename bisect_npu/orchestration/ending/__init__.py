"""Ending a session: the answer's sentences and the result with its exit code."""
