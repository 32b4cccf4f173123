"""``fixed-embed params CONFIG [--model.KEY VALUE ...]``: exact parameter counts of an
experiment, on the meta device, and an estimate of its per-GPU training memory
(:func:`fixed_embed.measure.memory.memory_estimate`). Overrides of ``model``, ``data``,
``trainer`` keys follow CONFIG, as for fit (``--model.decoder.n_layers 12``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Column, Table

from fixed_embed.cli import CommandParser
from fixed_embed.config import positive

#: micro-batches traced: the first, one like every later one but the last, and the last (FSDP2's
#: reduce-scatter)
TRACED_MICRO_BATCHES = 3
GIB = 2**30


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="fixed-embed params", description=__doc__)
    parser.add_argument("config", help="experiment YAML (e.g. experiments/paper/binary16.yaml)")
    parser.add_argument(
        "--world-size", type=positive("--world-size"), help="GPUs in all (default: from the config)"
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="also trace one update on fake tensors (fixed_embed.measure.trace; minutes at the "
        "paper's shape): the peak per rank beside the estimate",
    )
    args, overrides = parser.parse_known_args(argv[1:])
    pairs = [
        part for arg in overrides for part in (arg.split("=", 1) if arg.startswith("--") else [arg])
    ]
    if len(pairs) % 2 or not all(
        flag.startswith(("--model.", "--data.", "--trainer.")) for flag in pairs[::2]
    ):
        parser.error(
            f"unrecognized arguments: {' '.join(overrides)} (overrides: --model.KEY VALUE, "
            "--data.KEY VALUE or --trainer.KEY VALUE, after CONFIG)"
        )
    from fixed_embed.config import load_experiment, merge_flags
    from fixed_embed.errors import ConfigError
    from fixed_embed.train.experiment import check_values, parameter_reports, training_memory

    label = " ".join([args.config, *overrides])
    config = merge_flags(load_experiment(args.config), pairs)  # unreadable: one line
    try:
        check_values(config)  # fit's check before any work
        interface_name, report, control = parameter_reports(config)
    except ConfigError as error:  # a bad value: one line, naming the file
        raise ConfigError(f"{label}: {error}") from error
    console = Console(width=120)
    console.print(_parameter_table(f"{label}: {interface_name}", report, control))
    estimate = training_memory(config, args.world_size)
    console.print(_memory_table(estimate))
    if args.trace:
        _print_trace(console, config, args.world_size, estimate.allocated)
    console.print(_plan_table(config, args.world_size, estimate.run.world_size))
    return 0


def _parameter_table(title: str, report: Any, control: Any) -> Table:
    from fixed_embed.measure.memory import optimizer_state_bytes

    table = Table("parameters", Column("count", justify="right"), title=title)
    for name, value in [*report.rows(), ("learned control total", control.total)]:
        table.add_row(name, f"{value:,}")
    diff = control.total - report.total
    table.add_row(
        "removed vs learned control",
        f"{diff:,} ({100 * diff / control.total:.2f} % of the control)",
    )
    state_diff = optimizer_state_bytes(control.trainable) - optimizer_state_bytes(report.trainable)
    table.add_row("train-state bytes vs control (fp32 w+g+AdamW)", f"{state_diff:,}")
    table.add_row(f"training FLOPs per token (ctx {report.seq_len})", f"{report.flops_per_token:,}")
    return table


def _memory_table(estimate: Any) -> Table:
    run = estimate.run
    title = (
        f"per-GPU training memory estimate: micro-batch {run.micro_batch} x ctx "
        f"{run.seq_len}, {run.world_size} GPU(s), "
        f"{'FSDP' if run.sharded else 'replicated (DDP)'}, {estimate.mode}"
    )
    caption = "formulas: fixed_embed.measure.memory.memory_estimate"
    table = Table("memory", Column("GiB", justify="right"), title=title, caption=caption)
    for name, value in estimate.rows():
        table.add_row(name, f"{value / GIB:,.2f}")
    return table


def _plan_table(config: dict, world_size: int | None, gpus: int) -> Table:
    """Per GPU kind and strategy: does it fit, else the cheapest change that does."""
    from fixed_embed.measure.memory import USABLE_FRACTION
    from fixed_embed.train.experiment import memory_plan

    plan = Table(
        title=f"does it fit? {gpus} GPU(s), required vs {100 * USABLE_FRACTION:.0f} % of each GPU",
        caption="cost order of the ways out: micro-batch / 2 (~3 %), FSDP2 (~5 %), activation "
        "checkpointing (~33 %)",
    )
    for column in ("GPU", "strategy", "required GiB", "usable GiB", "fits"):
        plan.add_column(column, justify="right" if "GiB" in column else "left")
    plan.add_column("cheapest change that fits")
    for row in memory_plan(config, world_size):
        option = row["option"]
        if row["fits"]:
            change = ""
        elif option:
            change = f"{option.flags} ({option.estimate.required / GIB:.1f} GiB)"
        else:
            change = "none found: more GPUs (FSDP) or a smaller model"
        plan.add_row(
            row["gpu"],
            row["strategy"] + (" (configured)" if row["configured"] else ""),
            f"{row['estimate'].required / GIB:.1f}",
            f"{USABLE_FRACTION * row['device_bytes'] / GIB:.1f}",
            "yes" if row["fits"] else "NO",
            change,
        )
    return plan


def _print_trace(console: Console, config: dict, world_size: int | None, estimated: int) -> None:
    from fixed_embed.measure.trace import trace_update
    from fixed_embed.train.experiment import run_settings

    model, run = run_settings(config, world_size)
    traced = trace_update(model, run, TRACED_MICRO_BATCHES)
    table = Table(
        "memory",
        Column("GiB", justify="right"),
        title=f"traced update, rank 0 of {run.world_size}: the peak of live tensors by kind",
        caption=f"fixed_embed.measure.trace.trace_update: {traced.micro_batches} micro-batches "
        f"(the peak of any longer accumulation), {traced.seconds:.0f} s",
    )
    for kind, size in [*traced.kinds.items(), ("traced peak per rank", traced.peak)]:
        table.add_row(kind, f"{size / GIB:,.2f}")
    off = 100 * (estimated / traced.peak - 1)
    table.add_row("estimate's allocated peak", f"{estimated / GIB:,.2f} ({off:+.1f} %)")
    table.add_row(
        "training FLOPs per token traced (flash and checkpointing recompute included)",
        f"{traced.flops_per_token:,}",
    )
    console.print(table)
