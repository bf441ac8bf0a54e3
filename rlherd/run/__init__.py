"""Runs: resolved configs, the run directory, metrics, checkpoints, evaluation and plots."""
