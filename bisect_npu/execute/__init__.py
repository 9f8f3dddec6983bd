"""Run the probe (or a user command) for one candidate in its environment."""
