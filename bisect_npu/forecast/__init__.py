"""What a range will cost before it runs: the plan and the simulated search."""
