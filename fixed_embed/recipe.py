"""The optimisation recipe: AdamW settings, parameter groups, LR schedule, token budget.

Paper: AdamW, peak LR 1.5e-4, 2,000 linear warm-up updates, cosine decay, clip 1.0.
Ours (the paper does not say): betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices
only (never norm gains), cosine floor 10 % of peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["AdamWConfig", "ScheduleConfig", "build_adamw", "lr_at", "parameter_groups", "steps_for_budget"]


@dataclass
class AdamWConfig:
    lr: float = 1.5e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    #: "auto": the fused kernel on CUDA, foreach elsewhere.
    implementation: str = "auto"

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {self.betas}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.implementation not in ("auto", "fused", "foreach", "for-loop"):
            raise ValueError(f"implementation must be auto, fused, foreach or for-loop, got {self.implementation!r}")


@dataclass
class ScheduleConfig:
    warmup_steps: int = 2000
    #: LR at the end of the cosine, as a fraction of the peak.
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")


def lr_at(step: int, peak: float, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """LR of optimizer update ``step`` (0-based).

    Warm-up: peak * (step + 1) / warmup_steps, so the first update already moves.
    Then cosine from peak (at step = warmup_steps) to min_lr_ratio * peak (at step = max_steps).
    """
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    floor = peak * min_lr_ratio
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups over trainable parameters: matrices decay, vectors (norm gains) never do."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_adamw(model: nn.Module, config: AdamWConfig) -> torch.optim.AdamW:
    groups = parameter_groups(model, config.weight_decay)
    device = next((p.device for g in groups for p in g["params"]), torch.device("cpu"))
    impl = config.implementation
    if impl == "auto":
        impl = "fused" if device.type == "cuda" else "foreach"
    return torch.optim.AdamW(
        groups,
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        fused=impl == "fused",
        foreach=impl == "foreach" if impl != "fused" else None,
    )


def steps_for_budget(token_budget: int, world_size: int, micro_batch: int, accumulation: int, seq_len: int) -> int:
    """Optimizer updates needed to train on ``token_budget`` prediction tokens (rounded up)."""
    per_update = world_size * micro_batch * accumulation * seq_len
    if token_budget <= 0 or per_update <= 0:
        raise ValueError(f"token_budget ({token_budget}) and tokens per update ({per_update}) must be > 0")
    return math.ceil(token_budget / per_update)
