"""``study.py --estimate``: each planned run's training targets and FLOPs, and the compute still
to run."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from experiments.launch.record import record, resolve

# Training FLOP/s for --estimate. GPU: 40 % of an H200's 989 dense bf16 TFLOP/s (make gpu-check
# measured 39.6 % MFU for the paper's 1.7B binary16 step, compile+ac, on an H200, 2026-12-04). CPU:
# the two 1-thread fits of this machine together, measured on the study's size-M runs: 1.93e13
# FLOPs in 384 s of fit plus eval per run, two at a time.
GPU_RATE = 0.4 * 989e12
CPU_RATE = 1.0e11


def run_compute(configs: tuple[Path, ...], flags: list[str]) -> tuple[int, float]:
    """A run's training targets and FLOPs."""
    run = record(resolve(configs, flags))
    return run.tokens, run.tokens * run.flops_per_token


def wall_hours(
    stages: list[list[tuple]], flops_per_sec: float, jobs: int, skip: Collection[str] = ()
) -> float:
    """The wall time of ``stages`` (each waits for the one before: its rates come from it) at
    ``jobs`` runs at once, each stage's runs placed longest first on the first free slot."""
    total = 0.0
    for steps in stages:
        hours = [run_compute(c, f)[1] / flops_per_sec / 3600 for n, c, f in steps if n not in skip]
        slots = [0.0] * jobs
        for h in sorted(hours, reverse=True):
            slots[slots.index(min(slots))] += h
        total += max(slots)
    return total


def estimate(
    steps: list[tuple],
    flops_per_sec: float,
    finished: Collection[str] = (),
    adopt: Collection[str] = (),
) -> list[str]:
    """One line per run (targets, training FLOPs, and hours at ``flops_per_sec``, or "finished"
    for a run in the runs file, "adopt" for one to copy from an earlier runs file) and the total
    still to run."""
    lines, whens, left = [], [], 0.0
    for run_name, configs, flags in steps:
        targets, flops = run_compute(configs, flags)
        when = "finished" if run_name in finished else "adopt" if run_name in adopt else None
        whens.append(when)
        left += 0.0 if when else flops
        lines.append(
            f"{run_name:40s} {targets / 1e6:8.1f}M targets {flops:9.3g} FLOPs "
            f"{when or f'{flops / flops_per_sec / 3600:.2f} h':>9s}"
        )
    lines.append(
        f"{len(steps)} runs ({whens.count('finished')} finished, {whens.count('adopt')} to adopt, "
        f"{whens.count(None)} to run): "
        f"{left:.3g} FLOPs, {left / flops_per_sec / 3600:.1f} h at {flops_per_sec:.3g} FLOP/s"
    )
    return lines
