"""What an experiment config builds and costs, without training it (models on the meta device by
default)."""

from __future__ import annotations

import importlib
import math
from argparse import ArgumentError
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import StrategyRegistry

from fixed_embed.config import load_experiment, refused_value, use_in_jsonargparse
from fixed_embed.data import TextDataModule
from fixed_embed.distributed.fsdp import shards_parameters
from fixed_embed.errors import ConfigError
from fixed_embed.measure.memory import (
    GPU_KINDS,
    MemoryEstimate,
    RunShape,
    cheapest_fit,
    memory_estimate,
)
from fixed_embed.model.accounting import ParameterReport, parameter_report
from fixed_embed.model.decoder import DecoderConfig
from fixed_embed.model.recipe import steps_for_budget
from fixed_embed.train.module import LanguageModel


def build_model(model_config: dict[str, Any], device: str | torch.device = "meta") -> LanguageModel:
    """A LanguageModel from an experiment's ``model:`` section, parsed exactly as LightningCLI
    does, its values checked against each other first (:class:`DecoderConfig`, the interface's
    ``least_d_model`` and own options)."""
    parser, cfg = _parsed({"model": model_config})
    decoder, interface = (
        DecoderConfig(**(cfg.model.as_dict()["decoder"] or {})),
        cfg.model.as_dict()["interface"],
    )
    module, _, name = interface["class_path"].rpartition(".")
    options, cls = interface.get("init_args") or {}, getattr(importlib.import_module(module), name)
    # what it declares
    if (d := decoder.d_model) < (least := cls.least_d_model(decoder.vocab_size, **options)):
        # in whole heads of even dim
        wider = -(-least // (2 * decoder.n_heads)) * 2 * decoder.n_heads
        raise ConfigError(
            f"model.decoder.d_model {d} is below the K = {least} bits of model.interface {name}'s "
            "code "
            f"(code_width {options.get('code_width')}, model.decoder.vocab_size "
            f"{decoder.vocab_size}): "
            f"set model.decoder.d_model {wider}"
        )
    with torch.device(device):
        return parser.instantiate_classes(cfg).model


def build_fit(config: Any) -> tuple[LanguageModel, TextDataModule, int | None]:
    """What a fit of ``config`` runs, for a resume to be checked against: the model (meta
    device), the data module, the world size."""
    data = TextDataModule(**config.data.as_dict())
    return build_model(config.model.as_dict()), data, trainer_world_size(config.trainer)


def _parsed(sections: dict[str, Any]) -> tuple[ArgumentParser, Any]:
    """Sections of an experiment (``model``, ``data``, ``trainer``) parsed by their classes'
    signatures, as fit does."""
    use_in_jsonargparse()
    parser = ArgumentParser(exit_on_error=False)
    for key in sections:
        parser.add_class_arguments(
            {"model": LanguageModel, "data": TextDataModule, "trainer": Trainer}[key], key
        )
    try:
        return parser, parser.parse_object(sections)
    except ArgumentError as error:
        raise ConfigError(refused_value(str(error))) from None


def check_values(config: Any) -> None:
    """What the parser's types cannot say, before any work (fit's; params', of the sections as a
    dict): Lightning's numbers, the model's values against each other and data.seq_len, a length
    loaders count."""
    if not hasattr(config, "trainer"):  # params': parsed as fit parses them
        config = _parsed({key: config.get(key) or {} for key in ("model", "data", "trainer")})[1]
    # its types: int or float
    lightning = {f"trainer.{key}": value for key, value in vars(config.trainer).items()}
    for key, value in {**lightning, "seed_everything": config.get("seed_everything")}.items():
        # not a bool
        number = type(value) in (int, float) and not (value == -1 and key in MINUS_ONE)
        most = 2**32 if key == "seed_everything" else math.inf  # numpy's seeds
        if number and not ((value > 0 if key in POSITIVE else value >= 0) and value < most):
            raise ConfigError(
                f"{key} must be a finite number {'>' if key in POSITIVE else '>='} 0"
                f"{f' below {most}' if most < math.inf else ''}"
                f"{' (or -1: no limit)' if key in MINUS_ONE else ''}, got {value}"
            )
    # as Lightning reads it
    if config.trainer.devices != "auto" and trainer_world_size(config.trainer) is None:
        raise ConfigError(
            "trainer.devices must be a count > 0, -1, auto or ids (0,1), got "
            f"{config.trainer.devices!r}"
        )
    if isinstance(strategy := config.trainer.strategy, str) and strategy not in (
        "auto",
        *StrategyRegistry,
    ):
        raise ConfigError(
            f"trainer.strategy {strategy!r} is not a Lightning strategy: one of auto, "
            f"{', '.join(StrategyRegistry)}, or a class_path"
        )
    if (seq_len := config.data.seq_len) > (
        most := build_model(config.model.as_dict()).config.max_seq_len
    ):
        raise ConfigError(
            f"data.seq_len {seq_len} exceeds model.decoder.max_seq_len {most}: set data.seq_len "
            f"{most} "
            f"or model.decoder.max_seq_len {seq_len}"
        )
    if config.model.token_budget or config.trainer.max_steps > 0:
        run_length(config)


# Lightning's numeric Trainer options are finite and >= 0; these > 0, or -1 where Lightning reads
# it as "no limit".
POSITIVE = {
    f"trainer.{key}"
    for key in (
        "accumulate_grad_batches",
        "max_steps",
        "max_epochs",
        "num_nodes",
        "val_check_interval",
        "check_val_every_n_epoch",
    )
}
# -1: all
MINUS_ONE = {
    f"trainer.{key}" for key in ("max_steps", "max_epochs", "num_sanity_val_steps", "devices")
}


def trainer_world_size(trainer: Mapping[str, Any]) -> int | None:
    """Nodes x devices of a ``trainer:`` config, as the Trainer will count them (None: not known
    from the config)."""
    devices, nodes = trainer.get("devices", "auto"), trainer.get("num_nodes") or 1
    if isinstance(devices, str) and "," in devices:  # device ids, as Lightning reads "0,1" or "2,"
        devices = [index for index in devices.split(",") if index.strip()]
    elif isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, (list, tuple)):
        devices = len(devices)
    # as Lightning counts them: every CUDA device, or one process on the CPU
    if devices in (
        "auto",
        -1,
    ):
        from lightning.pytorch.accelerators import CUDAAccelerator

        on_cpu = str(trainer.get("accelerator", "auto")) == "cpu"
        devices = (0 if on_cpu else CUDAAccelerator.auto_device_count()) or 1
    return devices * nodes if isinstance(devices, int) and devices > 0 else None


def run_length(config: Mapping[str, Any]) -> tuple[int, str]:
    """The updates a fit of ``config`` trains for (as many as loaders count, in int64), and the
    line that says how: ``trainer.max_steps`` when set, else ``model.token_budget`` over the
    targets of one update at this world size."""
    trainer, data = config["trainer"], config["data"]
    micro_batch, seq_len = data["batch_size"], data["seq_len"]
    accumulation = trainer.get("accumulate_grad_batches") or 1
    most = (2**63 - 1) // (accumulation * micro_batch)
    times = (
        f"x trainer.accumulate_grad_batches {accumulation} x data.batch_size {micro_batch} "
        "sequences > 2**63-1"
    )
    if (max_steps := trainer.get("max_steps")) is not None and max_steps > 0:
        if max_steps > most:
            raise ConfigError(
                f"trainer.max_steps {max_steps} {times}: set trainer.max_steps {most}, or -1 (no "
                "limit)"
            )
        return max_steps, f"Training length: trainer.max_steps = {max_steps} updates (explicit)"
    if (budget := config["model"].get("token_budget")) is None:
        raise ConfigError(
            "set model.token_budget (prediction tokens) or trainer.max_steps to bound training"
        )
    world = trainer_world_size(trainer)  # a count: check_values refused what Lightning cannot count
    steps = steps_for_budget(budget, world, micro_batch, accumulation, seq_len)
    targets = world * micro_batch * accumulation * seq_len  # of one update
    if steps > most:
        raise ConfigError(
            f"model.token_budget {budget} gives {steps} updates {times}: set model.token_budget "
            f"{most * targets}"
        )
    return steps, (
        f"Training length: token budget {budget:,} / ({world} devices x {micro_batch} x "
        f"{accumulation} "
        f"accumulation x {seq_len} ctx = {targets:,} targets per update) = {steps:,} updates"
    )


def parameter_reports(config_path: str | Path) -> tuple[str, ParameterReport, ParameterReport]:
    """The experiment's interface name, its report, and that of its learned-table control (same
    backbone)."""
    model_config = load_experiment(config_path).get("model") or {}
    learned = {"class_path": "fixed_embed.interfaces.LearnedInput"}  # its stable class path
    decoder = build_model(model_config).decoder
    control = build_model({**model_config, "interface": learned}).decoder
    return type(decoder.interface).__name__, parameter_report(decoder), parameter_report(control)


def training_memory(config_path: str | Path, world_size: int | None = None) -> MemoryEstimate:
    """The experiment's per-GPU training memory, from its trainer, data and model settings."""
    return memory_estimate(*run_settings(config_path, world_size))


def memory_plan(config_path: str | Path, world_size: int | None = None) -> list[dict[str, Any]]:
    """Per GPU kind and strategy: whether the experiment fits, else the cheapest change that
    does. The configured strategy keeps the config's precision; the other its strategy file's
    (DDP ``bf16-mixed``, FSDP2 ``32-true``)."""
    model, run = run_settings(config_path, world_size)
    rows = []
    for strategy, sharded in (("DDP", False), ("FSDP", True)):
        precision = (
            run.precision if sharded == run.sharded else ("32-true" if sharded else "bf16-mixed")
        )
        shape = replace(run, precision=precision, sharded=sharded)
        estimate = memory_estimate(model, shape)
        for gpu, device_bytes in GPU_KINDS.items():
            fits = estimate.fits(device_bytes)
            option = None if fits else cheapest_fit(model, shape, device_bytes)
            rows.append(
                {
                    "gpu": gpu,
                    "device_bytes": device_bytes,
                    "strategy": strategy,
                    "configured": sharded == run.sharded,
                    "estimate": estimate,
                    "fits": fits,
                    "option": option,
                }
            )
    return rows


def run_settings(config_path: str | Path, world_size: int | None) -> tuple[Any, RunShape]:
    """The experiment's model (on the meta device) and the shape of its run at ``world_size``
    (None: the config's)."""
    experiment = load_experiment(config_path)
    trainer, data = (
        experiment.get("trainer") or {},
        _parsed({"data": experiment.get("data") or {}})[1].data,
    )
    return build_model(experiment.get("model") or {}), RunShape(
        micro_batch=data.batch_size,
        seq_len=data.seq_len,
        precision=trainer.get("precision", "32-true"),
        world_size=world_size or trainer_world_size({"devices": 1, **trainer}) or 1,
        sharded=shards_parameters(trainer.get("strategy", "auto")),
        accumulate=trainer.get("accumulate_grad_batches", 1) or 1,
    )
