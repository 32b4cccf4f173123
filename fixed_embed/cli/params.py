"""``fixed-embed params CONFIG``: exact parameter counts of an experiment, on the meta device."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from jsonargparse import ArgumentParser
from rich.console import Console
from rich.table import Table

from fixed_embed.accounting import ParameterReport, optimizer_state_bytes, parameter_report
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


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fixed-embed params", description=__doc__)
    parser.add_argument("config", help="experiment YAML (e.g. experiments/paper/binary16.yaml)")
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
    Console(width=120).print(table)
    return 0
