"""Probe runs: a stored plan trained for a few steps at reduced depth, measured and extrapolated."""
