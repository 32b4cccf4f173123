"""Log monitor metrics at an exact step, reduced across ranks, straight to the trainer's loggers.

``LightningModule.log`` from a callback is written only on steps where Lightning flushes
(``log_every_n_steps``), so a monitor with its own interval could silently lose points; and it
cannot reduce by min or max. Monitors therefore reduce here (one collective per reduction kind)
and global rank 0 writes each value at the step the monitor names.
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch
import torch.distributed as dist

__all__ = ["log_global"]

_OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def log_global(trainer: L.Trainer, metrics: Mapping[str, tuple[torch.Tensor | float, str]], step: int) -> dict:
    """Reduce ``{name: (value, "mean" | "sum" | "max" | "min")}`` over ranks, log on rank 0, return the values."""
    unknown = {how for _, how in metrics.values()} - set(_OPS)
    if unknown:
        raise ValueError(f"reductions must be one of {sorted(_OPS)}, got {sorted(unknown)}")
    device = trainer.strategy.root_device
    reduced: dict[str, float] = {}
    for kind in ("mean", "sum", "max", "min"):
        names = [name for name, (_, how) in metrics.items() if how == kind]
        if not names:
            continue
        values = torch.stack([torch.as_tensor(metrics[n][0], dtype=torch.float32, device=device) for n in names])
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_reduce(values, op=_OPS[kind])
            if kind == "mean":
                values /= trainer.world_size
        reduced.update(zip(names, values.tolist(), strict=True))
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(reduced, step=step)
    return reduced
