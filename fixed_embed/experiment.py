"""What an experiment config builds and costs, without training it.

:func:`build_model` makes the ``LanguageModel`` of an experiment's ``model:`` section exactly as
``fixed-embed fit`` (LightningCLI) would, on the meta device by default, so the paper's 1.7B model
is counted in seconds. :func:`parameter_reports` and :func:`training_memory` are what
``fixed-embed params`` prints; the experiment runners and two benchmarks (``input_layer``,
``gpu``) use :func:`build_model` too.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser

from fixed_embed.accounting import MemoryEstimate, ParameterReport, model_memory_estimate, parameter_report
from fixed_embed.config import load_experiment
from fixed_embed.data import TextDataModule
from fixed_embed.interfaces import LearnedInput
from fixed_embed.module import LanguageModel

__all__ = ["LEARNED_CLASS_PATH", "build_model", "parameter_reports", "training_memory"]

LEARNED_CLASS_PATH = f"{LearnedInput.__module__}.{LearnedInput.__qualname__}"


def build_model(model_config: dict[str, Any], device: str | torch.device = "meta") -> LanguageModel:
    """A LanguageModel from an experiment's ``model:`` section, parsed exactly as LightningCLI does."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(LanguageModel, "model")
    cfg = parser.parse_object({"model": model_config})
    with torch.device(device):
        return parser.instantiate_classes(cfg).model


def parameter_reports(config_path: str | Path) -> tuple[str, ParameterReport, ParameterReport]:
    """The experiment's interface name, its report, and that of its learned-table control (same backbone)."""
    model_config = load_experiment(config_path).get("model") or {}
    control_config = {**model_config, "interface": {"class_path": LEARNED_CLASS_PATH}}
    decoder = build_model(model_config).decoder
    control = build_model(control_config).decoder
    return type(decoder.interface).__name__, parameter_report(decoder), parameter_report(control)


def training_memory(config_path: str | Path, world_size: int | None = None) -> MemoryEstimate:
    """The experiment's per-GPU training memory: its trainer (devices x nodes, precision, strategy),
    data (micro-batch, ctx) and model (checkpointing, loss chunking, FSDP2 param dtype) settings."""
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
    precision = trainer.get("precision", "32-true")
    return model_memory_estimate(
        model, micro_batch, seq_len, precision=precision, world_size=world_size, sharded=sharded
    )
