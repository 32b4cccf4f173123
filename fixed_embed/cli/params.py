"""``fixed-embed params CONFIG``: exact parameter counts of an experiment, on the meta device, and an
estimate of its per-GPU training memory (:func:`fixed_embed.accounting.memory_estimate`)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fixed-embed params", description=__doc__)
    parser.add_argument("config", help="experiment YAML (e.g. experiments/paper/binary16.yaml)")
    parser.add_argument("--world-size", type=int, help="GPUs in all (default: trainer.devices x trainer.num_nodes)")
    args = parser.parse_args(argv[1:])
    # Lazy: torch + Lightning take seconds to import; --help and usage errors answer without them.
    from fixed_embed.accounting import optimizer_state_bytes
    from fixed_embed.experiment import parameter_reports, training_memory

    interface_name, report, control = parameter_reports(args.config)
    table = Table(title=f"{args.config}: {interface_name}")
    table.add_column("parameters")
    table.add_column("count", justify="right")
    for name, value in report.rows():
        table.add_row(name, f"{value:,}")
    diff = control.total - report.total
    table.add_row("learned control total", f"{control.total:,}")
    table.add_row("removed vs learned control", f"{diff:,} ({100 * diff / control.total:.2f} % of the control)")
    table.add_row(
        "train-state bytes vs control (fp32 w+g+AdamW)",
        f"{optimizer_state_bytes(control.trainable) - optimizer_state_bytes(report.trainable):,}",
    )
    table.add_row(f"training FLOPs per token (ctx {report.seq_len})", f"{report.flops_per_token:,}")
    console = Console(width=120)
    console.print(table)
    estimate = training_memory(args.config, args.world_size)
    title = (
        f"per-GPU training memory estimate: micro-batch {estimate.micro_batch} x ctx {estimate.seq_len}, "
        f"{estimate.world_size} GPU(s), {'FSDP' if estimate.sharded else 'replicated (DDP)'}, {estimate.mode}"
    )
    memory_table = Table(title=title, caption="formulas: fixed_embed.accounting.memory_estimate")
    memory_table.add_column("memory")
    memory_table.add_column("GiB", justify="right")
    for name, value in estimate.rows():
        memory_table.add_row(name, f"{value / 2**30:,.2f}")
    console.print(memory_table)
    return 0
