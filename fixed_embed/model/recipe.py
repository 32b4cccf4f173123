"""The optimisation recipe: AdamW, parameter groups, LR schedule, token budget (docs/design.md,
"The recipe")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from fixed_embed.config import Beta, NonNegativeFinite, NonNegativeInt, PositiveFinite, UnitInterval
from fixed_embed.interfaces import InputInterface


@dataclass
class AdamWConfig:
    """AdamW settings (``model.optimizer`` in an experiment YAML).

    Args:
        lr: peak learning rate (the paper: 1.5e-4).
        betas: AdamW's moment decay rates (ours: the paper does not state them).
        eps: AdamW's epsilon (ours).
        weight_decay: decoupled weight decay of matrices (ours); vectors (RMSNorm gains) never
        decay. decay_input: whether the input interface's trainable parameters decay (tied: the
        head too); fixed at resume. input_lr_scale: multiplies the input interface's learning
        rate (its own AdamW group unless 1), for a
            table that must move far in a short run; tied, the head follows. A resume cannot
            switch it to or from 1.
        implementation: ``auto``: the fused kernel on CUDA, foreach elsewhere.
    """

    lr: PositiveFinite = 1.5e-4
    betas: tuple[Beta, Beta] = (0.9, 0.95)
    eps: PositiveFinite = 1e-8
    weight_decay: NonNegativeFinite = 0.1
    decay_input: bool = True
    input_lr_scale: PositiveFinite = 1.0
    implementation: Literal["auto", "fused", "foreach", "for-loop"] = "auto"


@dataclass
class ScheduleConfig:
    warmup_steps: NonNegativeInt = 2000
    #: LR at the end of the cosine, as a fraction of the peak.
    min_lr_ratio: UnitInterval = 0.1


def lr_at(step: int, peak: float, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """LR of optimizer update ``step`` (0-based): warm-up peak * (step + 1) / warmup_steps (the
    first update already moves), then cosine from peak at ``warmup_steps`` to ``min_lr_ratio *
    peak`` at ``max_steps``."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    floor = peak * min_lr_ratio
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _input_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The trainable parameters of the model's input interface (none for fixed codes)."""
    interfaces = [m for m in model.modules() if isinstance(m, InputInterface)]
    return [p for m in interfaces for p in m.parameters() if p.requires_grad]


def parameter_groups(
    model: nn.Module, weight_decay: float, decay_input: bool = True, input_lr: float | None = None
) -> list[dict]:
    """AdamW groups of trainable parameters: decay (matrices), no-decay, [input interface, with
    ``input_lr``: else it joins no-decay unless ``decay_input``], in order. Older checkpoints
    hold ``decay_input=True``, no ``input_lr``."""
    inputs = _input_parameters(model)
    own_group = input_lr is not None and bool(inputs)
    apart = {id(p) for p in inputs} if own_group or not decay_input else set()
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad and id(param) not in apart:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {
            "params": no_decay if own_group or decay_input else no_decay + inputs,
            "weight_decay": 0.0,
        },
    ]
    if own_group:
        decay_rate = weight_decay if decay_input else 0.0
        groups.append({"params": inputs, "weight_decay": decay_rate, "lr": input_lr})
    return groups


def parameter_groups_change(
    saved: Mapping[str, Any] | None, config: AdamWConfig, model: nn.Module
) -> str | None:
    """Why a resume cannot take ``config``'s parameter groups (its AdamW state would not match),
    or ``None``; ``saved``: the checkpoint's ``optimizer`` hyper-parameters (none before the
    options: it decayed the input)."""
    saved = saved or {}
    then = {
        "input_lr_scale": float(saved.get("input_lr_scale", 1.0)),
        "decay_input": bool(saved.get("decay_input", True)),
    }
    moved = {
        "input_lr_scale": (then["input_lr_scale"] != 1.0)
        != (config.input_lr_scale != 1.0),  # its own group
        "decay_input": then["decay_input"] != config.decay_input,
    }
    if (key := next((key for key in then if moved[key]), None)) is None or not _input_parameters(
        model
    ):
        return None
    return (
        f"refusing to resume: model.optimizer.{key} is {then[key]} in the checkpoint and "
        f"{getattr(config, key)} "
        "now; it moves the input interface's trainable parameters between AdamW's parameter "
        "groups, which the "
        f"checkpoint's optimizer state cannot follow. Resume with model.optimizer.{key} "
        f"{then[key]}, or start a "
        "new run (--run NAME) without --ckpt_path."
    )


def build_adamw(model: nn.Module, config: AdamWConfig) -> torch.optim.AdamW:
    input_lr = config.lr * config.input_lr_scale if config.input_lr_scale != 1.0 else None
    groups = parameter_groups(model, config.weight_decay, config.decay_input, input_lr)
    impl = config.implementation
    if impl == "auto":
        device = next((p.device for g in groups for p in g["params"]), torch.device("cpu"))
        impl = "fused" if device.type == "cuda" else "foreach"
    foreach = impl == "foreach" if impl != "fused" else None
    return torch.optim.AdamW(
        groups,
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        fused=impl == "fused",
        foreach=foreach,
    )


def steps_for_budget(
    token_budget: int, world_size: int, micro_batch: int, accumulation: int, seq_len: int
) -> int:
    """Optimizer updates needed to train on ``token_budget`` prediction tokens (rounded up,
    exactly: in integers)."""
    return -(-token_budget // (world_size * micro_batch * accumulation * seq_len))
