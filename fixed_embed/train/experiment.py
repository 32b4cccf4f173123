"""What an experiment config builds and costs, without training it (models on the meta device by default)."""

from __future__ import annotations

import inspect
from argparse import ArgumentError
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser

from fixed_embed.config import load_experiment, refused_value
from fixed_embed.data import TextDataModule
from fixed_embed.distributed.fsdp import shards_parameters
from fixed_embed.errors import ConfigError
from fixed_embed.interfaces import LearnedInput
from fixed_embed.measure.memory import GPU_KINDS, MemoryEstimate, RunShape, cheapest_fit, model_memory_estimate
from fixed_embed.model.accounting import ParameterReport, parameter_report
from fixed_embed.model.decoder import DecoderConfig
from fixed_embed.model.recipe import steps_for_budget
from fixed_embed.train.module import LanguageModel


def build_model(model_config: dict[str, Any], device: str | torch.device = "meta") -> LanguageModel:
    """A LanguageModel from an experiment's ``model:`` section, parsed exactly as LightningCLI does."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(LanguageModel, "model")
    try:
        cfg = parser.parse_object({"model": model_config})
    except ArgumentError as error:
        raise ConfigError(refused_value(str(error))) from None
    if cfg.model.decoder is not None:  # its checks across fields, in its words (instantiating hides them)
        DecoderConfig(**cfg.model.decoder.as_dict())
    with torch.device(device):
        return parser.instantiate_classes(cfg).model


def trainer_world_size(trainer: Mapping[str, Any]) -> int | None:
    """Nodes x devices of a ``trainer:`` config, as the Trainer will count them (None: not known from the config)."""
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes") or 1
    if isinstance(devices, str) and "," in devices:  # device ids, as Lightning reads "0,1" or "2,"
        devices = [index for index in devices.split(",") if index.strip()]
    elif isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    if devices in ("auto", -1):  # as Lightning counts them: every CUDA device, or one process on the CPU
        from lightning.pytorch.accelerators import CUDAAccelerator

        on_cpu = str(trainer.get("accelerator", "auto")) == "cpu"
        devices = (0 if on_cpu else CUDAAccelerator.auto_device_count()) or 1
    return devices * nodes if isinstance(devices, int) and devices > 0 else None


def run_length(config: Mapping[str, Any]) -> tuple[int, str]:
    """The updates a fit of ``config`` trains for, and the line that says how: ``trainer.max_steps`` when set,
    else ``model.token_budget`` over the prediction targets of one update at this launch's world size."""
    trainer, data = config["trainer"], config["data"]
    if (max_steps := trainer.get("max_steps")) is not None and max_steps > 0:
        return max_steps, f"Training length: trainer.max_steps = {max_steps} updates (explicit)"
    if (budget := config["model"].get("token_budget")) is None:
        raise ConfigError("set model.token_budget (prediction tokens) or trainer.max_steps to bound training")
    if (world := trainer_world_size(trainer)) is None:
        raise ConfigError(
            f"model.token_budget needs the number of devices, and trainer.devices is {trainer.get('devices')!r}: "
            "set trainer.devices to a number, or trainer.max_steps"
        )
    micro_batch, seq_len = data["batch_size"], data["seq_len"]
    accumulation = trainer.get("accumulate_grad_batches") or 1
    steps = steps_for_budget(budget, world, micro_batch, accumulation, seq_len)
    return steps, (
        f"Training length: token budget {budget:,} / ({world} devices x {micro_batch} x {accumulation} accumulation "
        f"x {seq_len} ctx = {world * micro_batch * accumulation * seq_len:,} targets per update) = {steps:,} updates"
    )


def parameter_reports(config_path: str | Path) -> tuple[str, ParameterReport, ParameterReport]:
    """The experiment's interface name, its report, and that of its learned-table control (same backbone)."""
    model_config = load_experiment(config_path).get("model") or {}
    learned = {"class_path": f"{LearnedInput.__module__}.{LearnedInput.__qualname__}"}
    decoder = build_model(model_config).decoder
    control = build_model({**model_config, "interface": learned}).decoder
    return type(decoder.interface).__name__, parameter_report(decoder), parameter_report(control)


def training_memory(config_path: str | Path, world_size: int | None = None) -> MemoryEstimate:
    """The experiment's per-GPU training memory, from its trainer, data and model settings."""
    return model_memory_estimate(*run_settings(config_path, world_size))


def memory_plan(config_path: str | Path, world_size: int | None = None) -> list[dict[str, Any]]:
    """Per GPU kind and strategy: whether the experiment fits, else the cheapest change that does. The configured
    strategy keeps the config's precision; the other its strategy file's (DDP ``bf16-mixed``, FSDP2 ``32-true``)."""
    model, run = run_settings(config_path, world_size)
    rows = []
    for strategy, sharded in (("DDP", False), ("FSDP", True)):
        precision = run.precision if sharded == run.sharded else ("32-true" if sharded else "bf16-mixed")
        shape = replace(run, precision=precision, sharded=sharded)
        estimate = model_memory_estimate(model, shape)
        for gpu, device_bytes in GPU_KINDS.items():
            fits = estimate.fits(device_bytes)
            option = None if fits else cheapest_fit(model, shape, device_bytes)
            rows.append({"gpu": gpu, "device_bytes": device_bytes, "strategy": strategy, "configured": sharded ==
                         run.sharded, "estimate": estimate, "fits": fits, "option": option})  # fmt: skip
    return rows


def run_settings(config_path: str | Path, world_size: int | None) -> tuple[Any, RunShape]:
    """The experiment's model (on the meta device) and the shape of its run at ``world_size`` (None: the config's)."""
    experiment = load_experiment(config_path)
    trainer, data = experiment.get("trainer") or {}, experiment.get("data") or {}
    defaults = inspect.signature(TextDataModule).parameters
    return build_model(experiment.get("model") or {}), RunShape(
        micro_batch=data.get("batch_size", defaults["batch_size"].default),
        seq_len=data.get("seq_len", defaults["seq_len"].default),
        precision=trainer.get("precision", "32-true"),
        world_size=world_size or trainer_world_size({"devices": 1, **trainer}) or 1,
        sharded=shards_parameters(trainer.get("strategy", "auto")),
        accumulate=trainer.get("accumulate_grad_batches", 1) or 1,
    )
