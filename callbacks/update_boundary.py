"""The optimizer-update boundary and the one trigger convention of every callback in ``callbacks/``.

Lightning calls the training hooks once per *micro-batch*; with gradient accumulation only every
``accumulate_grad_batches``-th call ends an optimizer update. The intervals of the experiment configs
count updates, so every callback derives the boundary here, the same way:

**Convention.** Updates are numbered from 1: update *n* is the one after whose optimizer step
``trainer.global_step == n``. A callback with ``every_n_steps = N`` acts for update *n* exactly when
``n % N == 0`` (:func:`due`): with N = 10, after updates 10, 20, 30, ...

- *after* update n (the ``on_train_batch_end`` of its last micro-batch, :class:`UpdateBoundary`):
  checkpoints (:class:`callbacks.checkpointing.CheckpointPolicy`: Lightning's ``every_n_train_steps``
  counts the same way), throughput windows, input norms and code checks, in-loop benchmarks,
  preemption stops (any update), and validation (``trainer.val_check_interval``, which
  ``fixed-embed fit`` converts to micro-batches);
- *during* update n, for what must be seen before the step is applied (:func:`update_in_flight`,
  n = ``global_step + 1``): gradient norms (``on_before_optimizer_step``), the input interface's
  output (the update's first forward).

Metrics of update n are logged at step ``n - 1``, where Lightning logs that update's ``train/loss``.

Why ``global_step`` and not ``batch_idx % accumulate_grad_batches``: the batch index restarts with
each epoch, Lightning also steps on an epoch's last, short accumulation, and a resumed run starts
mid-way; the optimizer's own count is the boundary.
"""

from __future__ import annotations

import lightning as L

__all__ = ["UpdateBoundary", "due", "update_in_flight"]


def due(update: int, every_n_steps: int) -> bool:
    """Whether an interval of ``every_n_steps`` updates fires for update ``update`` (0 or less: never)."""
    return every_n_steps > 0 and update > 0 and update % every_n_steps == 0


def update_in_flight(trainer: L.Trainer) -> int:
    """The update the current micro-batch contributes to (its optimizer step not taken yet)."""
    return trainer.global_step + 1


class UpdateBoundary:
    """Tells, in ``on_train_batch_end``, whether this micro-batch completed an optimizer update.

    Call :meth:`start` from ``on_train_batch_start`` and :meth:`end` from ``on_train_batch_end``.
    """

    def __init__(self) -> None:
        self._before: int | None = None

    def start(self, trainer: L.Trainer) -> None:
        self._before = trainer.global_step

    def end(self, trainer: L.Trainer) -> int | None:
        """The update n this micro-batch completed, or None (mid-accumulation, or :meth:`start` not called)."""
        before, self._before = self._before, None
        step = trainer.global_step
        return step if before is not None and step != before else None
