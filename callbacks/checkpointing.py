"""CheckpointPolicy: bounded, requeue-safe checkpoints, ``last.ckpt`` a link (docs/faults.md,
"Bounded checkpoints")."""

from __future__ import annotations

import shutil
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from callbacks.update_boundary import UpdateCallback
from fixed_embed.atomic import atomic_symlink
from fixed_embed.config import PositiveInt
from fixed_embed.run.folder import (
    LAST,
    checkpoint_folder,
    step_checkpoint,
    step_checkpoints,
    step_of,
)
from fixed_embed.run.lock import readers


class CheckpointPolicy(UpdateCallback, Checkpoint):
    """Args:
    every_n_steps: save every N optimizer updates.
    keep_last: how many of the most recent checkpoints to keep.
    keep_every: never delete the checkpoints at multiples of this many updates.
    dirpath: the folder (default: ``<run folder>/checkpoints``).
    save_weights_only: leave out the optimizer state (no exact resume).
    """

    def __init__(
        self,
        every_n_steps: int = 1000,
        keep_last: PositiveInt = 2,
        keep_every: int | None = None,
        dirpath: str | None = None,
        save_weights_only: bool = False,
    ) -> None:
        super().__init__(every_n_steps)
        if keep_every is not None and (keep_every < 1 or keep_every % every_n_steps):
            raise ValueError(
                f"keep_every ({keep_every}) must be a positive multiple of every_n_steps "
                f"({every_n_steps})"
            )
        self.keep_last, self.keep_every = keep_last, keep_every
        self.dirpath, self.save_weights_only = dirpath, save_weights_only
        self._saved_step = -1

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = str(
                checkpoint_folder(Path(trainer.log_dir or trainer.default_root_dir))
            )  # a collective

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # One checkpoint: state tensors (whole, even sharded) + AdamW's two fp32 moments (not yet
        # made).
        size = sum(
            t.numel() * t.element_size()
            for t in pl_module.state_dict().values()
            if isinstance(t, torch.Tensor)
        )
        if not self.save_weights_only:
            size += sum(8 * p.numel() for p in pl_module.parameters() if p.requires_grad)
        steps = trainer.max_steps
        permanent = steps // self.keep_every if self.keep_every and steps > 0 else 0
        most = (
            permanent + self.keep_last + 1
        )  # + the one being written before the oldest is deleted
        kept = (
            f" and every {self.keep_every}th ({permanent} over {steps:,} updates)"
            if self.keep_every
            else ""
        )
        rank_zero_info(
            f"Checkpoints: {_gb(size)} each; every {self.every_n_steps} updates into "
            f"{self.dirpath}, "
            f"keeping the last {self.keep_last}{kept}: at most {most} on disk = {_gb(most * size)}"
        )
        if trainer.is_global_zero:
            path = Path(self.dirpath).absolute()
            free = shutil.disk_usage(next(p for p in (path, *path.parents) if p.exists())).free
            if most * size > free:
                rank_zero_warn(
                    f"the checkpoint policy may need {_gb(most * size)} but {self.dirpath} has "
                    f"{_gb(free)} free; "
                    "lower keep_last or raise keep_every"
                )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_step = trainer.global_step  # a resumed run's update is on disk already

    def on_update_end(self, trainer: L.Trainer, pl_module: L.LightningModule, update: int) -> None:
        # The last update is saved here, before any end-of-run evaluation (on_train_end).
        if not trainer.fast_dev_run and (self.due(update) or 0 < trainer.max_steps <= update):
            self.save(trainer)

    def save(self, trainer: L.Trainer) -> Path:
        """Save ``step=N.ckpt`` (once per update), relink ``last.ckpt``, prune; returns
        ``last.ckpt``. Collective."""
        folder, step = Path(self.dirpath), trainer.global_step
        if step == self._saved_step:
            return folder / LAST
        path = step_checkpoint(folder, step)
        trainer.save_checkpoint(path, weights_only=self.save_weights_only)
        self._saved_step = step
        rank_zero_info(f"checkpoint at update {step}: {path}")
        if trainer.is_global_zero:
            atomic_symlink(path.name, folder / LAST)
            # Newer ones than this update belong to another history and are left alone.
            for expired in [p for p in step_checkpoints(folder) if step_of(p) <= step][
                : -self.keep_last
            ]:
                if self.keep_every and step_of(expired) % self.keep_every == 0:
                    continue
                if held := readers(
                    expired.resolve()
                ):  # an eval, export or consolidate reads it: pruned at a later save
                    rank_zero_info(f"keeping {expired} for now: it is read by {held[0]}")
                else:
                    trainer.strategy.remove_checkpoint(expired)
        trainer.strategy.barrier("checkpoint_linked")
        return folder / LAST


def save_now(trainer: L.Trainer) -> Path:
    """Save now (via :class:`CheckpointPolicy`, else as ``last.ckpt``); returns the path to
    resume. Collective."""
    callback = trainer.checkpoint_callback
    if isinstance(callback, CheckpointPolicy):
        return callback.save(trainer)
    path = (
        Path(
            getattr(callback, "dirpath", None) or checkpoint_folder(Path(trainer.default_root_dir))
        )
        / LAST
    )
    trainer.save_checkpoint(path)
    return path


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"
