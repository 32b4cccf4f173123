"""Scoring a checkpoint: loading it, the lm-eval model, suites and tasks, export, analysis."""
