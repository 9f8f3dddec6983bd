"""The upstream as git and its files show it: history, Dockerfile facts, release versions."""
