"""Launching runs: the executor, the fit of one run, the runs file, the grid of a plan."""
