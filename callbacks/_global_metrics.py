"""Log monitor metrics at an exact step, reduced across ranks (``self.log`` from a callback writes only
every ``log_every_n_steps`` and cannot reduce by min or max)."""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch
import torch.distributed as dist

_OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def log_global(trainer: L.Trainer, metrics: Mapping[str, tuple[torch.Tensor | float, str]], step: int) -> dict:
    """Reduce ``{name: (value, "mean" | "sum" | "max" | "min")}`` over ranks, log on rank 0, return the values."""
    device = trainer.strategy.root_device
    reduced: dict[str, float] = {}
    for kind in _OPS:  # the same order on every rank
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
