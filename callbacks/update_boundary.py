"""The optimizer-update boundary and the one trigger convention of every callback in ``callbacks/``.

Lightning calls the training hooks once per *micro-batch*; with gradient accumulation only every
``accumulate_grad_batches``-th call ends an optimizer update. The intervals of the experiment configs
count updates, so every monitor derives from :class:`UpdateCallback`, which finds the boundary here,
the same way, and handles ``enabled`` and ``every_n_steps`` once:

**Convention.** Updates are numbered from 1: update *n* is the one after whose optimizer step
``trainer.global_step == n``. A callback with ``every_n_steps = N`` acts for update *n* exactly when
``n % N == 0`` (:func:`due`): with N = 10, after updates 10, 20, 30, ...

- *after* update n (:meth:`UpdateCallback.on_update_end`, from the ``on_train_batch_end`` of its
  last micro-batch): checkpoints (:class:`callbacks.checkpointing.CheckpointPolicy`), throughput
  windows, input norms and code checks, in-loop benchmarks, preemption stops (any update), and
  validation (``trainer.val_check_interval``, which ``fixed-embed fit`` converts to micro-batches);
- *during* update n, for what must be seen before the step is applied (:func:`update_in_flight`,
  n = ``global_step + 1``): gradient norms (:meth:`UpdateCallback.on_before_update_step`, from
  ``on_before_optimizer_step``), the input interface's output (the update's first forward, armed in
  :meth:`UpdateCallback.on_update_start`).

Metrics of update n are logged at step ``n - 1``, where Lightning logs that update's ``train/loss``.

Which micro-batch ends an update is Lightning's own decision, read once per micro-batch
(:func:`fixed_embed.lightning_internals.ends_update`, also what the module's FSDP2 gradient sync
follows): not ``batch_idx % accumulate_grad_batches``, since the batch index restarts with each
epoch, Lightning also steps on an epoch's last, short accumulation, and a resumed run starts mid-way.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from fixed_embed.lightning_internals import ends_update

__all__ = ["UpdateCallback", "due", "update_in_flight"]


def due(update: int, every_n_steps: int) -> bool:
    """Whether an interval of ``every_n_steps`` updates fires for update ``update`` (0 or less: never)."""
    return every_n_steps > 0 and update > 0 and update % every_n_steps == 0


def update_in_flight(trainer: L.Trainer) -> int:
    """The update the current micro-batch contributes to (its optimizer step not taken yet)."""
    return trainer.global_step + 1


class UpdateCallback(L.Callback):
    """A callback that acts per optimizer update: ``enabled``, ``every_n_steps`` and the boundary, once.

    Subclasses override the ``on_update_*`` / ``on_micro_batch_*`` hooks below (all no-ops here) and
    ask :meth:`due` whether update n is on the interval; they do not override Lightning's
    ``on_train_batch_start``, ``on_train_batch_end`` or ``on_before_optimizer_step``. When
    ``enabled`` is false none of the hooks is called and the trainer is never read. Hooks of their
    own (set-up, teardown, validation) check ``self.enabled`` themselves.

    Args:
        every_n_steps: the interval, in optimizer updates (at least ``min_every_n_steps``).
        enabled: the on/off switch.
    """

    min_every_n_steps = 1  # a subclass where 0 means something ("never in the loop") lowers it

    def __init__(self, every_n_steps: int = 1, enabled: bool = True) -> None:
        if every_n_steps < self.min_every_n_steps:
            raise ValueError(
                f"{type(self).__name__}: every_n_steps must be >= {self.min_every_n_steps}, got {every_n_steps}"
            )
        self.every_n_steps = every_n_steps
        self.enabled = enabled
        self._ends_update = False  # whether the micro-batch in flight ends its update
        self._started: int | None = None  # the update whose first micro-batch was seen last

    def due(self, update: int) -> bool:
        """Whether update ``update`` is on this callback's interval (:func:`due`)."""
        return due(update, self.every_n_steps)

    # -- the hooks for subclasses ----------------------------------------------------------------

    def on_update_start(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        """Update ``update`` begins: its first micro-batch, before that micro-batch's forward."""

    def on_micro_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        """Every micro-batch, before its forward (after :meth:`on_update_start` for the first)."""

    def on_before_update_step(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        """Update ``update``'s gradients are accumulated and reduced; clipping and its step come next."""

    def on_micro_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        """Every micro-batch, after its backward (and the step, for an update's last; before :meth:`on_update_end`)."""

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        """Update ``update`` is complete: its optimizer step is taken, ``trainer.global_step == update``."""

    # -- Lightning's hooks, wired once -------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled:
            return
        self._ends_update = ends_update(trainer)
        update = update_in_flight(trainer)
        if update != self._started:
            self._started = update
            self.on_update_start(trainer, pl_module, update)
        self.on_micro_batch_start(trainer, pl_module, batch)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self.enabled:
            self.on_before_update_step(trainer, pl_module, update_in_flight(trainer))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled:
            return
        ends, self._ends_update = self._ends_update, False
        self.on_micro_batch_end(trainer, pl_module, batch)
        if ends:
            self.on_update_end(trainer, pl_module, trainer.global_step)
