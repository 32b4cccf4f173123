"""Update boundaries for every callback here (README, "Watch a run"): update *n* ends with
``global_step == n``, logged at ``n - 1``; ``ends_update`` (Lightning's call) ends it, not
``batch_idx``: epochs restart it, resumes start midway."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from fixed_embed.lightning_internals import ends_update

_OPS = {
    "mean": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def due(update: int, every_n_steps: int) -> bool:
    """Whether an interval of ``every_n_steps`` updates fires for update ``update`` (0 or less:
    never)."""
    return every_n_steps > 0 and update > 0 and update % every_n_steps == 0


def log_global(
    trainer: L.Trainer, metrics: Mapping[str, tuple[torch.Tensor | float, str]], step: int
) -> dict:
    """Reduce ``{name: (value, "mean" | "max" | "min")}`` over ranks, log on rank 0,
    return the values: a monitor's ``self.log`` would write only every ``log_every_n_steps`` and
    cannot reduce by min or max."""
    device = trainer.strategy.root_device
    reduced: dict[str, float] = {}
    for kind in _OPS:  # the same order on every rank
        names = [name for name, (_, how) in metrics.items() if how == kind]
        if not names:
            continue
        values = torch.stack(
            [torch.as_tensor(metrics[n][0], dtype=torch.float32, device=device) for n in names]
        )
        if trainer.world_size > 1:  # a process group is set up
            dist.all_reduce(values, op=_OPS[kind])
            if kind == "mean":
                values /= trainer.world_size
        reduced.update(zip(names, values.tolist(), strict=True))
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(reduced, step=step)
    return reduced


def global_norms(groups: Mapping[str, Iterable[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The fp32 L2 norm of each named group of whole tensors or FSDP2 shards (``DTensor``: one
    all-reduce a group, so all ranks call it with the same groups)."""
    norms = {
        name: torch.nn.utils.get_total_norm([t for t in tensors if t.numel()])
        for name, tensors in groups.items()
    }
    return {
        name: (n.full_tensor() if isinstance(n, DTensor) else n).float()
        for name, n in norms.items()
    }


class UpdateCallback(L.Callback):
    """Per-update callback (:meth:`due` every ``every_n_steps`` updates): override ``on_update_*`` /
    ``on_micro_batch_*``, not Lightning's batch hooks (skipped unless ``enabled``); other hooks
    check it themselves."""

    min_every_n_steps = 1  # a subclass where 0 means something ("never in the loop") lowers it

    def __init__(self, every_n_steps: int = 1, enabled: bool = True) -> None:
        if every_n_steps < self.min_every_n_steps:
            raise ValueError(
                f"{type(self).__name__}: every_n_steps must be >= {self.min_every_n_steps}, got "
                f"{every_n_steps}"
            )
        self.every_n_steps = every_n_steps
        self.enabled = enabled
        self.last_metrics: dict[str, float] = {}  # what a monitor logged last
        self._ends_update = False  # whether the micro-batch in flight ends its update
        self._started: int | None = None  # the update whose first micro-batch was seen last

    def due(self, update: int) -> bool:
        return due(update, self.every_n_steps)

    def on_update_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, update: int
    ) -> None:
        """Update ``update`` begins: its first micro-batch, before that micro-batch's forward."""

    def on_micro_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any
    ) -> None:
        """Every micro-batch, before its forward (after :meth:`on_update_start` for the first)."""

    def on_before_update_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, update: int
    ) -> None:
        """Update ``update``'s gradients are accumulated and reduced; clipping and its step come
        next."""

    def on_micro_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any
    ) -> None:
        """Every micro-batch, after its backward (and the step, for an update's last; before
        :meth:`on_update_end`)."""

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        """Update ``update`` is complete: its optimizer step is taken, ``trainer.global_step ==
        update``."""

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled:
            return
        self._ends_update = ends_update(trainer)
        update = trainer.global_step + 1
        if update != self._started:
            self._started = update
            self.on_update_start(trainer, pl_module, update)
        self.on_micro_batch_start(trainer, pl_module, batch)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self.enabled:
            self.on_before_update_step(trainer, pl_module, trainer.global_step + 1)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not self.enabled:
            return
        ends, self._ends_update = self._ends_update, False
        self.on_micro_batch_end(trainer, pl_module, batch)
        if ends:
            self.on_update_end(trainer, pl_module, trainer.global_step)
