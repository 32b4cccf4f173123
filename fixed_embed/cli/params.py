"""``fixed-embed params CONFIG``: exact parameter counts of an experiment, on the meta device, and an
estimate of its per-GPU training memory (:func:`fixed_embed.accounting.memory_estimate`)."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import torch
from jsonargparse import ArgumentParser
from rich.console import Console
from rich.table import Table

from fixed_embed.accounting import (
    MemoryEstimate,
    ParameterReport,
    activation_mode,
    memory_estimate,
    optimizer_state_bytes,
    parameter_report,
)
from fixed_embed.config import load_experiment
from fixed_embed.interfaces import LearnedInput
from fixed_embed.module import LanguageModel

LEARNED_CLASS_PATH = f"{LearnedInput.__module__}.{LearnedInput.__qualname__}"


def build_model(model_config: dict[str, Any], device: str | torch.device = "meta") -> LanguageModel:
    """A LanguageModel from an experiment's ``model:`` section, parsed exactly as LightningCLI does."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(LanguageModel, "model")
    cfg = parser.parse_object({"model": model_config})
    with torch.device(device):
        return parser.instantiate_classes(cfg).model


def reports(config_path: str) -> tuple[str, ParameterReport, ParameterReport]:
    """The experiment's interface name, its report, and that of its learned-table control (same backbone)."""
    model_config = load_experiment(config_path).get("model") or {}
    control_config = {**model_config, "interface": {"class_path": LEARNED_CLASS_PATH}}
    decoder = build_model(model_config).decoder
    control = build_model(control_config).decoder
    return type(decoder.interface).__name__, parameter_report(decoder), parameter_report(control)


def memory(config_path: str, world_size: int | None = None) -> MemoryEstimate:
    """The experiment's per-GPU training memory: its trainer (devices x nodes, precision, strategy),
    data (micro-batch, ctx) and model (checkpointing, loss chunking, FSDP2 param dtype) settings."""
    from fixed_embed.data import TextDataModule

    experiment = load_experiment(config_path)
    model = build_model(experiment.get("model") or {})
    trainer, data = experiment.get("trainer") or {}, experiment.get("data") or {}
    defaults = inspect.signature(TextDataModule).parameters
    micro_batch = data.get("batch_size", defaults["batch_size"].default)
    seq_len = data.get("seq_len", defaults["seq_len"].default)
    if world_size is None:
        devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1) or 1
        devices = len(devices) if isinstance(devices, list) else devices
        world_size = (devices if isinstance(devices, int) and devices > 0 else 1) * nodes
    strategy = trainer.get("strategy", "auto")
    name = strategy.get("class_path", "") if isinstance(strategy, dict) else str(strategy)
    sharded = any(key in name.lower() for key in ("fsdp", "modelparallel"))
    parallel = model.parallel_config
    return memory_estimate(
        model.decoder,
        micro_batch,
        seq_len,
        mode=activation_mode(trainer.get("precision", "32-true"), parallel.param_dtype if sharded else None),
        activation_checkpointing=parallel.activation_checkpointing,
        loss_chunk_tokens=model.loss_chunk_tokens,
        world_size=world_size,
        sharded=sharded,
    )


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fixed-embed params", description=__doc__)
    parser.add_argument("config", help="experiment YAML (e.g. experiments/paper/binary16.yaml)")
    parser.add_argument("--world-size", type=int, help="GPUs in all (default: trainer.devices x trainer.num_nodes)")
    args = parser.parse_args(argv[1:])
    interface_name, report, control = reports(args.config)
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
    estimate = memory(args.config, args.world_size)
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
